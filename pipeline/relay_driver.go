package pipeline

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skein-ml/skein/transport"
)

// RelayDriver runs a Relay over transport.Peers (the in-memory network in
// tests, p2p streams in a node): it owns the goroutines, the clock (a
// ticker), the sends and the compute, which runs on its own goroutine so
// that messages and ticks keep flowing while a stage computes. The machine
// owns every decision.
type RelayDriver struct {
	peers  transport.Peers
	ids    []transport.PeerID // node index -> peer
	index  map[transport.PeerID]int
	m      *Relay
	runner atomic.Pointer[StageRunner] // read by the compute goroutine; Switch replaces it
	tick   time.Duration
	log    *slog.Logger

	reqs     chan relayRequest
	switches chan relaySwitch
	results  chan Result
	done     chan struct{} // closed when the loop exits
	stop     context.CancelFunc
	wg       sync.WaitGroup
	out      *transport.Outbox
}

// RelayOptions are the driver's settings.
type RelayOptions struct {
	Tick   time.Duration // the machine's tick (default 50 ms)
	Logger *slog.Logger
}

type relayRequest struct {
	iter   uint64
	paths  []Path
	cancel bool // the caller of Run for iter gave up waiting
	reply  chan relayReply
}

// relaySwitch is a Switch waiting for the loop.
type relaySwitch struct {
	nodes  []transport.PeerID
	index  map[transport.PeerID]int
	m      *Relay
	runner StageRunner
	reply  chan error
}

type relayReply struct {
	outcomes []Outcome
	err      error
}

// relaySendQueue bounds the messages waiting for one destination; past it
// they are dropped and the machine's deadlines fail their microbatches, so
// one slow peer never holds up the others. The schedule bounds what is
// legitimately in flight to a peer to a few times mu.
const relaySendQueue = 64

// NewRelayDriver builds the driver of the node nodes[cfg.Self], which must
// be peers.Self(); nodes maps the placement's node indices to peers.
func NewRelayDriver(peers transport.Peers, nodes []transport.PeerID, runner StageRunner, cfg RelayConfig, opt RelayOptions) (*RelayDriver, error) {
	index, err := relayIndex(peers, nodes, runner, cfg)
	if err != nil {
		return nil, err
	}
	if opt.Tick <= 0 {
		opt.Tick = 50 * time.Millisecond
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := NewRelay(cfg)
	if err != nil {
		return nil, err
	}
	d := &RelayDriver{peers: peers, ids: slices.Clone(nodes), index: index, m: m,
		tick: opt.Tick, log: opt.Logger.With("node", cfg.Self, "stage", m.Stage()),
		reqs: make(chan relayRequest), switches: make(chan relaySwitch), results: make(chan Result), done: make(chan struct{}),
		out: transport.NewOutbox(peers, relaySendQueue, opt.Logger)}
	d.setRunner(runner)
	return d, nil
}

func (d *RelayDriver) setRunner(r StageRunner) { d.runner.Store(&r) }

// relayIndex checks a driver's settings and maps peers to node indices.
func relayIndex(peers transport.Peers, nodes []transport.PeerID, runner StageRunner, cfg RelayConfig) (map[transport.PeerID]int, error) {
	if len(nodes) != len(cfg.Placement.StageOf) {
		return nil, fmt.Errorf("%w: %d peers for a placement of %d nodes", ErrConfig, len(nodes), len(cfg.Placement.StageOf))
	}
	if cfg.Self < 0 || cfg.Self >= len(nodes) || nodes[cfg.Self] != peers.Self() {
		return nil, fmt.Errorf("%w: node %d is not this peer %s", ErrConfig, cfg.Self, peers.Self())
	}
	if runner == nil {
		return nil, fmt.Errorf("%w: no stage runner", ErrConfig)
	}
	index := make(map[transport.PeerID]int, len(nodes))
	for i, id := range nodes {
		if _, dup := index[id]; dup {
			return nil, fmt.Errorf("%w: peer %s is node %d and node %d", ErrConfig, id, index[id], i)
		}
		index[id] = i
	}
	return index, nil
}

// Switch moves the driver to a new placement between two iterations (a
// staged run re-planned after a member left or joined): the machine is
// rebuilt for cfg over nodes with runner (the same or another stage's),
// and the messages the old machine kept for an iteration it had not begun
// are handed to the new one, re-indexed by peer, so that a member that
// switches a moment after the others loses none of their first messages.
// It fails while an iteration runs.
func (d *RelayDriver) Switch(ctx context.Context, nodes []transport.PeerID, runner StageRunner, cfg RelayConfig) error {
	index, err := relayIndex(d.peers, nodes, runner, cfg)
	if err != nil {
		return err
	}
	m, err := NewRelay(cfg)
	if err != nil {
		return err
	}
	sw := relaySwitch{nodes: slices.Clone(nodes), index: index, m: m, runner: runner, reply: make(chan error, 1)}
	select {
	case d.switches <- sw:
	case <-ctx.Done():
		m.Close()
		return ctx.Err()
	case <-d.done:
		m.Close()
		return errors.New("pipeline: switching placement: the relay is closed")
	}
	return <-sw.reply
}

// Start runs the driver until ctx ends or Close.
func (d *RelayDriver) Start(ctx context.Context) {
	ctx, d.stop = context.WithCancel(ctx)
	recv := make(chan transport.Message, 64)
	work := make(chan Work)
	d.wg.Add(3)
	go func() {
		defer d.wg.Done()
		d.receive(ctx, recv)
	}()
	go func() {
		defer d.wg.Done()
		d.compute(ctx, work)
	}()
	go func() {
		defer d.wg.Done()
		defer close(d.done)
		d.loop(ctx, recv, work)
	}()
}

// Close stops the driver and waits for its goroutines (a compute in
// progress finishes first).
func (d *RelayDriver) Close() {
	if d.stop != nil {
		d.stop()
	}
	d.wg.Wait()
	d.out.Wait()
	d.m.Close()
}

func (d *RelayDriver) receive(ctx context.Context, recv chan<- transport.Message) {
	for {
		m, err := d.peers.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// This endpoint is closed or broken: wait instead of spinning.
			select {
			case <-ctx.Done():
				return
			case <-time.After(d.tick):
			}
			continue
		}
		select {
		case recv <- m:
		case <-ctx.Done():
			return
		}
	}
}

// compute runs the machine's work, in order, one at a time.
func (d *RelayDriver) compute(ctx context.Context, work <-chan Work) {
	for {
		select {
		case <-ctx.Done():
			return
		case w := <-work:
			res, ok := w.Run(*d.runner.Load())
			if !ok {
				continue
			}
			select {
			case d.results <- res:
			case <-ctx.Done():
				return
			}
		}
	}
}

func (d *RelayDriver) loop(ctx context.Context, recv <-chan transport.Message, work chan<- Work) {
	t := time.NewTicker(d.tick)
	defer t.Stop()
	var (
		waiting  *relayRequest
		want     int
		outcomes []Outcome
		queue    []Work // work for the compute goroutine, in order
	)
	for {
		var feed chan<- Work
		var head Work
		if len(queue) > 0 {
			feed, head = work, queue[0]
		}
		select {
		case <-ctx.Done():
			if waiting != nil {
				waiting.reply <- relayReply{outcomes, ctx.Err()}
			}
			return
		case m := <-recv:
			if from, ok := d.index[m.From]; ok {
				d.m.Step(from, m.Payload)
			}
		case <-t.C:
			d.m.Tick()
		case res := <-d.results:
			d.m.Done(res)
		case feed <- head:
			queue = queue[1:]
		case sw := <-d.switches:
			if waiting != nil {
				sw.m.Close()
				sw.reply <- fmt.Errorf("pipeline: switching placement during iteration %d", waiting.iter)
				continue
			}
			stash := d.m.TakeStash()
			old := d.ids
			d.m.Close()
			d.m, d.ids, d.index, queue = sw.m, sw.nodes, sw.index, nil
			d.setRunner(sw.runner)
			for _, st := range stash {
				if j, ok := d.index[old[st.From]]; ok {
					d.m.Step(j, st.Payload)
				}
			}
			sw.reply <- nil
		case r := <-d.reqs:
			if r.cancel {
				if waiting != nil && waiting.iter == r.iter {
					waiting = nil
				}
				continue
			}
			if waiting != nil {
				r.reply <- relayReply{err: errors.New("pipeline: an iteration is already running on this node")}
				continue
			}
			n, err := d.m.Begin(r.iter, r.paths)
			if err != nil {
				r.reply <- relayReply{err: err}
				continue
			}
			waiting, want, outcomes = &r, n, nil
		}
		rd := d.m.Ready()
		for _, e := range rd.Messages {
			d.out.Send(ctx, d.ids[e.To], e.Payload)
		}
		queue = append(queue, rd.Work...)
		for _, o := range rd.Outcomes {
			var te *TensorError
			switch {
			case errors.As(o.Err, &te):
				// The sender is named as an offender, as the collectives name
				// theirs: the chaos soak counts these lines.
				d.log.Warn("refused a neighbour's tensor: dropped the microbatch", "iter", o.Iter, "mb", o.MB,
					"offender", d.ids[te.From], "err", o.Err)
			case o.Err != nil:
				d.log.Debug("microbatch failed", "iter", o.Iter, "mb", o.MB, "hop", o.Hop, "err", o.Err)
			}
			if waiting != nil && o.Iter == waiting.iter {
				outcomes = append(outcomes, o)
			}
		}
		if waiting != nil && len(outcomes) == want {
			slices.SortFunc(outcomes, func(a, b Outcome) int { return cmp.Compare(a.MB, b.MB) })
			waiting.reply <- relayReply{outcomes: outcomes}
			waiting = nil
		}
	}
}

// Run runs iteration iter of the schedule paths (every node of the swarm
// calls it with the same schedule, at about the same time): the
// microbatches whose paths start at this node start, and this node serves
// its visits of the others. It returns once every visit of this node has
// ended, one Outcome per visit in microbatch order: at a stage-0 node the
// microbatches it started (Hop 0) with their loss or error, elsewhere
// whether this node's part succeeded. A failed microbatch is an Outcome,
// not an error; the error is for a schedule this node cannot run, ctx, or
// a closed driver.
func (d *RelayDriver) Run(ctx context.Context, iter uint64, paths []Path) ([]Outcome, error) {
	r := relayRequest{iter: iter, paths: paths, reply: make(chan relayReply, 1)}
	stopped := fmt.Errorf("pipeline: iteration %d: the relay is closed", iter)
	select {
	case d.reqs <- r:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-d.done:
		return nil, stopped
	}
	select {
	case rep := <-r.reply:
		return rep.outcomes, rep.err
	case <-d.done:
		return nil, stopped
	case <-ctx.Done():
		// The machine keeps the iteration's state until the next Begin,
		// which aborts what is left of it; the driver stops waiting for it.
		select {
		case d.reqs <- relayRequest{iter: iter, cancel: true}:
		case <-d.done:
		}
		return nil, ctx.Err()
	}
}
