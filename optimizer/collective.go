package optimizer

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/skein-ml/skein/transport"
)

// What every collective shares: the stats of a round, its errors, the
// bounds on what members send, and the adaptive deadline estimator.

// DefaultMaxStashBytes is RingConfig.MaxStashBytes's default.
const DefaultMaxStashBytes = 256 << 20

// RoundStats describes one completed collective.
type RoundStats struct {
	Round     uint64
	Group     []transport.PeerID // the group that produced the result
	Attempts  int
	Adopted   bool // the result came from a peer that had finished the round
	BytesSent int64
	BytesRecv int64
	Duration  time.Duration
}

// ErrExcluded: the other members excluded this one from a round (it was too
// slow or unreachable) and no finished result could be fetched; the caller
// must re-sync its state from a peer.
var ErrExcluded = errors.New("optimizer: excluded from the round")

func checkFinite(x []float32, bound float32) error {
	for i, v := range x {
		if !(v <= bound && v >= -bound) { // false for NaN too
			return fmt.Errorf("%w: element %d is %v (bound %v)", ErrRejected, i, v, bound)
		}
	}
	return nil
}

// estimator learns how long to wait for a message, like TCP's RTO.
type estimator struct {
	mean, dev float64 // seconds
	n         int
}

func (e *estimator) observe(d time.Duration) {
	s := d.Seconds()
	if e.n == 0 {
		e.mean, e.dev = s, s/2
	} else {
		e.dev = 0.75*e.dev + 0.25*math.Abs(s-e.mean)
		e.mean = 0.875*e.mean + 0.125*s
	}
	e.n++
}

func (e *estimator) deadline(initial, lo, hi time.Duration) time.Duration {
	if e.n == 0 {
		return initial
	}
	d := time.Duration(2 * (e.mean + 4*e.dev) * float64(time.Second))
	return min(max(d, lo), hi)
}
