package optimizer

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/skein-ml/skein/transport"
)

// Collective averages one vector per round over the members of a run: the
// butterfly (ButterflyDriver), or any other.
type Collective interface {
	// Self is this member's ID.
	Self() transport.PeerID
	// AllReduceMean averages x over the round's group into out; on success
	// every member that returns holds the same bits.
	AllReduceMean(ctx context.Context, round uint64, x, out []float32) (RoundStats, error)
}

// stateCollective is a Collective whose members check that they start the
// round from the same state.
type stateCollective interface {
	AllReduceFrom(ctx context.Context, round, stateHash uint64, x, out []float32) (RoundStats, error)
}

// sentCollective is a stateCollective that also reports what of x crossed
// the wire (Butterfly.StartSent).
type sentCollective interface {
	AllReduceSent(ctx context.Context, round, stateHash uint64, x, out, sent []float32) (RoundStats, error)
}

// ButterflyDriver runs a Butterfly machine over Peers (driver.go): the
// driver owns the goroutines, the clock and the sends; the machine owns
// every decision. One round at a time.
type ButterflyDriver struct {
	d *driver[RoundResult]
	m *Butterfly
	// suspended is the last round's RoundResult.Suspended, logged when it
	// changes (rounds are one at a time).
	suspended []transport.PeerID
}

// ButterflyOptions are the driver's settings.
type ButterflyOptions struct {
	Tick     time.Duration // the machine's tick (default 50 ms)
	Logger   *slog.Logger
	OnReject func(from transport.PeerID, err error) // told about each offender
}

// NewButterflyDriver builds the driver of peers.Self()'s machine.
func NewButterflyDriver(peers transport.Peers, cfg ButterflyConfig, opt ButterflyOptions) (*ButterflyDriver, error) {
	if opt.Tick <= 0 {
		opt.Tick = 50 * time.Millisecond
	}
	m, err := NewButterfly(cfg, peers.Self())
	if err != nil {
		return nil, err
	}
	sync := func() { m.SetMembers(peers.Members()) }
	return &ButterflyDriver{d: newDriver[RoundResult](peers, bfMachine{m}, opt.Tick, opt.Logger, opt.OnReject, sync), m: m}, nil
}

// bfMachine is a Butterfly as the driver runs it.
type bfMachine struct{ *Butterfly }

func (b bfMachine) Ready() ([]Envelope, []rejection, *RoundResult) {
	rd := b.Butterfly.Ready()
	var rejs []rejection
	for _, o := range rd.Offenses {
		rejs = append(rejs, rejection{o.Peer, fmt.Errorf("%w: %s", ErrRejected, o.Reason)})
	}
	return rd.Messages, rejs, rd.Result
}

// Self is this member's ID.
func (d *ButterflyDriver) Self() transport.PeerID { return d.m.Self() }

// Start runs the driver until ctx ends or Close.
func (d *ButterflyDriver) Start(ctx context.Context) { d.d.start(ctx) }

// Close stops the driver and waits for its goroutines.
func (d *ButterflyDriver) Close() {
	d.d.close()
	d.m.Close()
}

// AllReduceMean runs one round with no state check (every member's state
// hash is 0).
func (d *ButterflyDriver) AllReduceMean(ctx context.Context, round uint64, x, out []float32) (RoundStats, error) {
	return d.AllReduceFrom(ctx, round, 0, x, out)
}

// AllReduceFrom runs one round from the state with hash stateHash: members
// that start from another state are not in the group (ErrExcluded: the
// caller re-syncs). On error out is unspecified and nothing happened.
func (d *ButterflyDriver) AllReduceFrom(ctx context.Context, round, stateHash uint64, x, out []float32) (RoundStats, error) {
	return d.AllReduceSent(ctx, round, stateHash, x, out, nil)
}

// AllReduceSent is AllReduceFrom that also writes into sent (nil: nothing)
// x as this member sent it, encoded and decoded (Butterfly.StartSent).
func (d *ButterflyDriver) AllReduceSent(ctx context.Context, round, stateHash uint64, x, out, sent []float32) (RoundStats, error) {
	r := d.d.call(ctx, func() error { return d.m.StartSent(round, stateHash, x, out, sent) })
	st := RoundStats{Round: round, BytesSent: r.sent, BytesRecv: r.recv, Duration: r.took}
	if res := r.res; res != nil {
		st.Group, st.Attempts, st.Adopted = res.Group, int(res.Attempt), res.LeftOut
		d.d.log.Debug("round", "round", res.Round, "group", len(res.Group), "left_out", res.LeftOut,
			"verified", res.Verified, "audits", res.Audits, "suspended", len(res.Suspended), "err", res.Err)
		if !slices.Equal(res.Suspended, d.suspended) {
			// Not offenders (nothing proves it): members that went silent in
			// this member's groups, kept out of the next ones for a while.
			d.d.log.Info("members suspended from groups", "round", res.Round, "peers", res.Suspended)
			d.suspended = res.Suspended
		}
		r.err = cmp.Or(r.err, res.Err)
	}
	return st, r.err
}
