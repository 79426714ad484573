//go:build !unix

package main

import "context"

// pauseSignals: no pause signals where there is no SIGUSR1 (--active-hours
// still works).
func pauseSignals(context.Context) <-chan struct{} { return nil }
