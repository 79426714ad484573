package optimizer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/skein-ml/skein/transport"
)

// machine is an I/O-free protocol state machine (Butterfly, Gossip), run
// by a driver: fed received messages and ticks, and drained after each.
type machine[R any] interface {
	Step(from transport.PeerID, payload []byte)
	Tick()
	Cancel(err error)
	// Ready returns and clears what the machine produced: messages to
	// send, offenders caught, and once per call its result.
	Ready() ([]Envelope, []rejection, *R)
}

// rejection is an offender and what it did.
type rejection struct {
	peer transport.PeerID
	err  error
}

// driver runs a machine over Peers, one call at a time. It is the one place
// that owns the goroutines, the clock (a ticker) and the queues: a received
// message is handed to the machine unbuffered, so the transport's inbox
// (byte-budgeted in p2p) is the only receive queue, and the Outbox the only
// send queue. Retries are the transport's (p2p.Peers.Send) and the
// machine's (deadlines, resent READYs); the driver has none.
type driver[R any] struct {
	peers    transport.Peers
	m        machine[R]
	tick     time.Duration
	log      *slog.Logger
	onReject func(transport.PeerID, error)
	// sync feeds the machine what it reads from the world (the membership)
	// before each tick and call, and before each message when syncEach.
	sync     func()
	syncEach bool

	calls chan func() // run in the loop
	done  chan struct{}
	stop  context.CancelFunc
	wg    sync.WaitGroup
	out   *transport.Outbox

	// The call in progress, owned by the loop.
	waiting    chan callReply[R]
	sent, recv int64
	began      time.Time
}

type callReply[R any] struct {
	res        *R
	sent, recv int64 // bytes during the call
	took       time.Duration
	err        error
}

// errClosed: the driver has stopped.
var errClosed = errors.New("optimizer: the collective is closed")

// perPeerQueue bounds the messages waiting for one destination; past it,
// messages to that peer are dropped (the machine's deadlines cover it), so
// one slow peer never holds up the others.
const perPeerQueue = 256

func newDriver[R any](peers transport.Peers, m machine[R], tick time.Duration, log *slog.Logger, onReject func(transport.PeerID, error), sync func()) *driver[R] {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &driver[R]{peers: peers, m: m, tick: tick, log: log, onReject: onReject, sync: sync,
		calls: make(chan func()), done: make(chan struct{}), out: transport.NewOutbox(peers, perPeerQueue, log)}
}

// start runs the driver until ctx ends or close.
func (d *driver[R]) start(ctx context.Context) {
	ctx, d.stop = context.WithCancel(ctx)
	recv := make(chan transport.Message)
	d.wg.Add(2)
	go func() {
		defer d.wg.Done()
		for {
			m, err := d.peers.Recv(ctx)
			if err != nil {
				if ctx.Err() != nil || errors.Is(err, transport.ErrClosed) {
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

// close stops the driver and waits for its goroutines.
func (d *driver[R]) close() {
	if d.stop != nil {
		d.stop()
	}
	d.wg.Wait()
	d.out.Wait()
}

func (d *driver[R]) loop(ctx context.Context, recv <-chan transport.Message) {
	t := time.NewTicker(d.tick)
	defer t.Stop()
	d.sync()
	for {
		select {
		case <-ctx.Done():
			d.reply(callReply[R]{err: ctx.Err()})
			return
		case m := <-recv:
			d.recv += int64(len(m.Payload))
			if d.syncEach {
				d.sync()
			}
			d.m.Step(m.From, m.Payload)
		case <-t.C:
			d.sync()
			d.m.Tick()
		case f := <-d.calls:
			f()
		}
		msgs, rejs, res := d.m.Ready()
		for _, r := range rejs {
			d.log.Warn("offender", "peer", r.peer, "err", r.err)
			if d.onReject != nil {
				d.onReject(r.peer, r.err)
			}
		}
		for _, e := range msgs {
			d.out.Send(ctx, e.To, e.Payload)
			d.sent += int64(len(e.Payload))
		}
		if res != nil {
			d.reply(callReply[R]{res: res})
		}
	}
}

// reply ends the call in progress, if any.
func (d *driver[R]) reply(r callReply[R]) {
	if d.waiting == nil {
		return
	}
	r.sent, r.recv, r.took = d.sent, d.recv, time.Since(d.began)
	d.waiting <- r
	d.waiting = nil
}

// do runs f in the loop (or here, once the loop has stopped) and waits
// for it.
func (d *driver[R]) do(f func()) {
	ran := make(chan struct{})
	select {
	case d.calls <- func() { f(); close(ran) }:
		<-ran
	case <-d.done:
		f()
	}
}

// call starts a call in the loop (begin runs there, once the machine has
// the membership) and waits for the machine's result. When ctx ends first
// the machine is cancelled with ctx's error.
func (d *driver[R]) call(ctx context.Context, begin func() error) callReply[R] {
	select {
	case <-d.done:
		return callReply[R]{err: errClosed}
	case <-ctx.Done():
		return callReply[R]{err: ctx.Err()}
	default:
	}
	reply := make(chan callReply[R], 1)
	d.do(func() {
		if d.waiting != nil {
			reply <- callReply[R]{err: errors.New("optimizer: a call is already in progress")}
			return
		}
		d.sync()
		if err := begin(); err != nil {
			reply <- callReply[R]{err: err}
			return
		}
		d.waiting, d.sent, d.recv, d.began = reply, 0, 0, time.Now()
	})
	select {
	case r := <-reply:
		return r
	case <-d.done:
		return callReply[R]{err: errClosed}
	case <-ctx.Done():
	}
	d.do(func() {
		if d.waiting == reply {
			d.m.Cancel(ctx.Err())
		}
	})
	select {
	case r := <-reply:
		return r
	case <-d.done:
		return callReply[R]{err: ctx.Err()}
	}
}
