package transport

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Outbox sends a driver's messages over Peers: one ordered queue and one
// goroutine per destination, each queue bounded to Depth messages. Past
// that, messages to the destination are dropped (the state machines'
// deadlines cover a lost message), so one slow peer never holds up the
// others, and a Send never blocks the machine's loop. A destination's
// goroutine exits after a minute with nothing to send. The collectives'
// and the pipeline relay's drivers share it.
type Outbox struct {
	peers Peers
	depth int
	log   *slog.Logger

	wg     sync.WaitGroup
	mu     sync.Mutex
	queues map[PeerID]chan []byte
}

// outboxIdle is how long a destination's goroutine waits for more to send.
const outboxIdle = time.Minute

// NewOutbox returns an outbox over peers with queues of depth messages
// (at least 1); log may be nil.
func NewOutbox(peers Peers, depth int, log *slog.Logger) *Outbox {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Outbox{peers: peers, depth: max(depth, 1), log: log, queues: map[PeerID]chan []byte{}}
}

// Send queues payload for to; the destination's goroutine runs until ctx
// ends (or it idles out).
func (o *Outbox) Send(ctx context.Context, to PeerID, payload []byte) {
	o.mu.Lock()
	q, ok := o.queues[to]
	if !ok {
		q = make(chan []byte, o.depth)
		o.queues[to] = q
		o.wg.Add(1)
		go o.sender(ctx, to, q)
	}
	o.mu.Unlock()
	select {
	case q <- payload:
	default:
		o.log.Debug("send queue full; dropping", "to", to)
	}
}

// Wait waits for every destination's goroutine to exit: call it once the
// context given to Send has ended.
func (o *Outbox) Wait() { o.wg.Wait() }

// sender delivers one destination's messages in order.
func (o *Outbox) sender(ctx context.Context, to PeerID, q chan []byte) {
	defer o.wg.Done()
	idle := time.NewTimer(outboxIdle)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-q:
			if err := o.peers.Send(ctx, to, p); err != nil && ctx.Err() == nil {
				o.log.Debug("send failed", "to", to, "err", err)
			}
			idle.Reset(outboxIdle)
		case <-idle.C:
			o.mu.Lock()
			if len(q) == 0 {
				delete(o.queues, to)
				o.mu.Unlock()
				return
			}
			o.mu.Unlock()
			idle.Reset(outboxIdle)
		}
	}
}
