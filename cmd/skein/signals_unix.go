//go:build unix

package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// pauseSignals turns SIGUSR1 (pause) and SIGUSR2 (resume) into toggles of
// node.JoinScheduled: each signal that changes the state sends one.
func pauseSignals(ctx context.Context) <-chan struct{} {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	out := make(chan struct{}, 1)
	go func() {
		defer signal.Stop(sig)
		paused := false
		for {
			select {
			case <-ctx.Done():
				return
			case s := <-sig:
				if want := s == syscall.SIGUSR1; want != paused {
					paused = want
					select {
					case out <- struct{}{}:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	return out
}
