// Package node is the volunteer daemon (`skein node join`): it joins a run
// through its bootstrap or any known member, fetches the run's state,
// trains with trainer's setup chain, contributes to each outer round over
// p2p (driving the optimizer's collectives through p2p.Peers), re-syncs when
// it falls behind or diverges, checkpoints locally, resumes on restart and
// leaves gracefully.
//
// node wires data, model, trainer, optimizer and p2p together; it must not
// implement numerics, codecs or network protocols itself.
package node

import "errors"

// ErrConfig is returned (wrapped) for invalid volunteer settings.
var ErrConfig = errors.New("node: invalid config")
