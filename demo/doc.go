// Package demo supervises a whole run on one machine: `skein demo` and its
// chaos soak. It starts real processes of the skein binary (a bootstrap and
// `skein node join` volunteers on loopback, their links slowed by the WAN
// emulator), reads the run back through the status API and the children's
// logs, prints the summary and, under --chaos, kills, pauses and restarts
// volunteers and checks the run's invariants.
//
// It owns the children's lifecycle (process groups, the parent-death signal,
// the order of shutdown) and nothing of training: it must not import node,
// optimizer or the protocol cores, only the run's vocabulary (manifest) and
// the status API's client types.
package demo

import "errors"

// ErrConfig is returned (wrapped) for invalid demo settings.
var ErrConfig = errors.New("demo: invalid config")
