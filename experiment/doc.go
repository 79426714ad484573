// Package experiment runs in-process swarms and benchmarks on one machine:
// several workers training one model with DiLoCo, NoLoCo or a synchronous
// baseline, talking through transport.MemNetwork, and the convergence
// benchmark (`skein bench convergence`) with its table and SVG curves; and
// staged runs (RunStaged): the model split into pipeline stages with
// replicas, every microbatch relayed over pipeline.RelayDriver, DiLoCo per
// stage, skip ratios and CheckFree's recovery of a lost stage.
//
// It measures algorithms, not networks: it must never open sockets or run
// as a daemon (node does that), and it builds every worker through
// trainer's one setup chain.
package experiment

import "errors"

// ErrConfig is returned (wrapped) for invalid experiment settings.
var ErrConfig = errors.New("experiment: invalid config")
