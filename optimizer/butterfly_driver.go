package optimizer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
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

// ButterflyDriver runs a Butterfly machine over Peers: it owns the
// goroutine, the clock (a ticker) and the sends; the machine owns every
// decision. One round at a time.
type ButterflyDriver struct {
	peers    transport.Peers
	m        *Butterfly
	tick     time.Duration
	log      *slog.Logger
	onReject func(transport.PeerID, error)

	reqs chan bfRequest
	done chan struct{} // closed when the loop exits
	stop context.CancelFunc
	wg   sync.WaitGroup
	out  *transport.Outbox
}

type bfRequest struct {
	round, hash uint64
	x, out      []float32
	cancel      bool
	reply       chan bfReply
}

type bfReply struct {
	st  RoundStats
	err error
}

// ButterflyOptions are the driver's settings.
type ButterflyOptions struct {
	Tick     time.Duration // the machine's tick (default 50 ms)
	Logger   *slog.Logger
	OnReject func(from transport.PeerID, err error) // told about each offender
}

// perPeerQueue bounds the messages waiting for one destination; past it,
// messages to that peer are dropped (the machine's deadlines cover it), so
// one slow peer never holds up the others.
const perPeerQueue = 256

// NewButterflyDriver builds the driver of peers.Self()'s machine.
func NewButterflyDriver(peers transport.Peers, cfg ButterflyConfig, opt ButterflyOptions) (*ButterflyDriver, error) {
	if opt.Tick <= 0 {
		opt.Tick = 50 * time.Millisecond
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := NewButterfly(cfg, peers.Self())
	if err != nil {
		return nil, err
	}
	return &ButterflyDriver{peers: peers, m: m, tick: opt.Tick, log: opt.Logger, onReject: opt.OnReject,
		reqs: make(chan bfRequest), done: make(chan struct{}), out: transport.NewOutbox(peers, perPeerQueue, opt.Logger)}, nil
}

// Self is this member's ID.
func (d *ButterflyDriver) Self() transport.PeerID { return d.peers.Self() }

// Start runs the driver until ctx ends or Close.
func (d *ButterflyDriver) Start(ctx context.Context) {
	ctx, d.stop = context.WithCancel(ctx)
	recv := make(chan transport.Message, 64)
	d.wg.Add(2)
	go func() {
		defer d.wg.Done()
		for {
			m, err := d.peers.Recv(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			select {
			case recv <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		defer d.wg.Done()
		defer close(d.done)
		d.loop(ctx, recv)
	}()
}

// Close stops the driver and waits for its goroutines.
func (d *ButterflyDriver) Close() {
	if d.stop != nil {
		d.stop()
	}
	d.wg.Wait()
	d.out.Wait()
	d.m.Close()
}

func (d *ButterflyDriver) loop(ctx context.Context, recv <-chan transport.Message) {
	t := time.NewTicker(d.tick)
	defer t.Stop()
	var waiting *bfRequest
	var st RoundStats
	var began time.Time
	d.m.SetMembers(d.peers.Members())
	for {
		select {
		case <-ctx.Done():
			if waiting != nil {
				waiting.reply <- bfReply{st, ctx.Err()}
			}
			return
		case m := <-recv:
			if waiting != nil {
				st.BytesRecv += int64(len(m.Payload))
			}
			d.m.Step(m.From, m.Payload)
		case <-t.C:
			d.m.SetMembers(d.peers.Members())
			d.m.Tick()
		case r := <-d.reqs:
			if r.cancel {
				d.m.Cancel(context.Canceled)
				break
			}
			if waiting != nil {
				r.reply <- bfReply{err: errors.New("optimizer: a round is already in progress")}
				continue
			}
			d.m.SetMembers(d.peers.Members())
			if err := d.m.Start(r.round, r.hash, r.x, r.out); err != nil {
				r.reply <- bfReply{err: err}
				continue
			}
			waiting, st, began = &r, RoundStats{Round: r.round}, time.Now()
		}
		rd := d.m.Ready()
		for _, o := range rd.Offenses {
			d.log.Warn("offender", "peer", o.Peer, "reason", o.Reason)
			if d.onReject != nil {
				d.onReject(o.Peer, fmt.Errorf("%w: %s", ErrRejected, o.Reason))
			}
		}
		for _, e := range rd.Messages {
			d.out.Send(ctx, e.To, e.Payload)
		}
		if waiting != nil {
			st.BytesSent += rd.BytesSent
		}
		if res := rd.Result; res != nil && waiting != nil {
			st.Group, st.Attempts, st.Adopted, st.Duration = res.Group, int(res.Attempt), res.LeftOut, time.Since(began)
			d.log.Debug("round", "round", res.Round, "group", len(res.Group), "left_out", res.LeftOut,
				"verified", res.Verified, "audits", res.Audits, "err", res.Err)
			waiting.reply <- bfReply{st, res.Err}
			waiting = nil
		}
	}
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
	r := bfRequest{round: round, hash: stateHash, x: x, out: out, reply: make(chan bfReply, 1)}
	stopped := fmt.Errorf("optimizer: round %d: the collective is closed", round)
	select {
	case d.reqs <- r:
	case <-ctx.Done():
		return RoundStats{Round: round}, ctx.Err()
	case <-d.done:
		return RoundStats{Round: round}, stopped
	}
	select {
	case rep := <-r.reply:
		return rep.st, rep.err
	case <-d.done:
		return RoundStats{Round: round}, stopped
	case <-ctx.Done():
		select {
		case d.reqs <- bfRequest{cancel: true}:
		case rep := <-r.reply:
			return rep.st, rep.err
		case <-d.done:
			return RoundStats{Round: round}, ctx.Err()
		}
		select {
		case rep := <-r.reply:
			return rep.st, ctx.Err()
		case <-d.done:
			return RoundStats{Round: round}, ctx.Err()
		}
	}
}
