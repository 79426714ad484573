package pipeline

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/skein-ml/skein/compression"
)

// The relay: activations forward and their gradients backward along each
// microbatch's path, as an I/O-free state machine in the manner of
// etcd-io/raft (and of optimizer.Butterfly). One Relay per node. It owns no
// goroutine, clock, socket or model: the driver feeds it received messages
// (Step), the passage of time (Tick) and the results of the compute it
// asked for (Done), and after each call takes what it produced (Ready):
// messages to send, work for the node's StageRunner, and the outcome of
// every microbatch visit that ended here. Every interleaving of
// deliveries, drops, delays and crashes is therefore a deterministic test
// (relay_test.go runs the scripted scenarios of testdata/relay).
//
// One iteration, on every node, with the same schedule (Begin):
//
//  1. A stage-0 node starts each microbatch whose path begins with it: it
//     asks for the stage-0 forward (the runner embeds the microbatch's own
//     tokens) and sends the output to the path's next visit.
//  2. A visit's node runs its stage's forward on the activation it
//     receives and sends the output on; the last visit sends it back to the
//     stage-0 node, which runs the head and the loss, then the head's
//     backward, and sends the gradient to the last visit.
//  3. Each visit runs its backward on the gradient it receives and sends
//     the input gradient to the visit before it; when the stage-0 node has
//     run its own backward, the microbatch is done: its loss is reported.
//
// Deadlines, in ticks of HopWait (one visit's queueing, compute and
// transfer): the stage-0 node gives the forward L hops to come back and
// the backward L hops; a visit gives the rest of the microbatch 2(L-h)+1
// hops after sending on, and an input that never comes 2L+1 hops after
// Begin. When a deadline passes the microbatch fails (ErrTimeout) and the
// stage-0 node tells the path's nodes to drop it (abort); a hop that cannot
// take a microbatch (memory, a path that is not its schedule's, a tensor
// that does not decode, a failed compute) tells the stage-0 node at once
// (fail). Either way every node that held the microbatch's activation lets
// its runner drop it, and reports the visit as failed: no node waits
// forever.
//
// Bounds: a node accepts messages only for the visits its schedule gives
// it, at most Mu (rule 7), so it never holds more than Mu activations; a
// tensor is decoded only after its header matched a visit waiting for it,
// into at most Len elements; messages for the next iteration that arrive
// before Begin are kept within MaxStashBytes and 2*Mu per sender.
//
// Trust: a neighbour may be hostile or broken. An activation or gradient
// with a value that is not finite, or whose norm is past the edge's bound
// (RelayConfig.Bounds), fails its microbatch like a hop that timed out,
// naming the sender (TensorError); one past Clip times the edge's median
// is scaled down to it. The node never stops for it.

// Errors of the relay, in addition to those of the path rules.
var (
	// ErrBadMessage reports bytes that are not a relay message.
	ErrBadMessage = errors.New("pipeline: malformed relay message")
	// ErrTimeout reports a microbatch whose next hop did not answer within
	// its deadline.
	ErrTimeout = errors.New("pipeline: hop did not answer in time")
	// ErrHopFailed reports a microbatch that a hop on its path gave up
	// (the wrapped reason says why, for example ErrNodeMemory).
	ErrHopFailed = errors.New("pipeline: a hop failed the microbatch")
	// ErrAborted reports a visit ended by its stage-0 node or by the start
	// of the next iteration.
	ErrAborted = errors.New("pipeline: microbatch aborted")
	// ErrCompute reports a stage forward, head or backward that failed.
	ErrCompute = errors.New("pipeline: stage compute failed")
	// ErrBadTensor reports an activation or gradient refused by the
	// relay's bounds (a TensorError names the sender).
	ErrBadTensor = errors.New("pipeline: non-finite or outsized tensor")
)

// TensorError is an activation or gradient refused by the bounds.
type TensorError struct {
	From, Stage int    // the node that sent it and its stage
	Kind        string // "act" or "grad"
	Norm, Bound float64
}

func (e *TensorError) Error() string {
	return fmt.Sprintf("%v: %s from node %d (stage %d) of norm %.3g, bound %.3g", ErrBadTensor, e.Kind, e.From, e.Stage, e.Norm, e.Bound)
}

func (e *TensorError) Unwrap() error { return ErrBadTensor }

// TensorBounds limit the activations and gradients a node takes from its
// neighbours. Norms are judged per edge (kind and sending stage) against
// the median of the last normWindow norms the edge delivered, once it has
// normWarm of them; a zero field bounds nothing.
type TensorBounds struct {
	// MaxRMS refuses a tensor whose root mean square is past it: the only
	// bound while an edge has no median yet, and a cap after.
	MaxRMS float64
	// Clip scales a tensor whose norm is past Clip times the median down
	// to that norm.
	Clip float64
	// Drop refuses a tensor whose norm is past Drop times the median.
	Drop float64
}

// DefaultTensorBounds: values of 1e4 in root mean square are far past
// any stage's activations or gradients; an honest microbatch past 4x its
// edge's median is rare and is clipped, one past 64x is refused.
func DefaultTensorBounds() TensorBounds { return TensorBounds{MaxRMS: 1e4, Clip: 4, Drop: 64} }

// Validate names the first invalid bound.
func (b TensorBounds) Validate() error {
	for _, x := range []float64{b.MaxRMS, b.Clip, b.Drop} {
		if !(x >= 0) || math.IsInf(x, 0) {
			return fmt.Errorf("%w: tensor bound %v must be finite and >= 0", ErrConfig, x)
		}
	}
	if b.Clip > 0 && b.Drop > 0 && b.Drop < b.Clip {
		return fmt.Errorf("%w: drop bound %v below clip bound %v", ErrConfig, b.Drop, b.Clip)
	}
	return nil
}

// RelayConfig configures one node's relay. Durations are in ticks of the
// driver's clock.
type RelayConfig struct {
	// Self is this node's index in Placement.StageOf.
	Self      int
	Placement Placement
	// Len is the elements of one activation (B*T*C): every tensor sent or
	// received has exactly this length.
	Len int
	// Codec encodes activations and gradients (DefaultRelayConfig: bf16,
	// ALGORITHMS.md 5; fp32 is lossless).
	Codec compression.Config
	// Mu is the most activations the node holds, and so the most visits
	// its schedule may give it per iteration (rule 7).
	Mu int
	// HopWait is one hop's budget: the queueing and compute of one visit
	// plus one transfer.
	HopWait int64
	// MaxStashBytes bounds the messages kept for the next iteration.
	MaxStashBytes int64
	// Bounds limit the tensors taken from neighbours (DefaultTensorBounds).
	Bounds TensorBounds
	// Hostile poisons the activations and gradients this node sends
	// (relay_hostile.go), for chaos tests only (node.HostileStagedGrad).
	Hostile bool
}

// DefaultRelayConfig returns the relay of node self on pl for activations
// of n elements, with mu = DefaultRules().Mu, bf16 on the wire and a hop
// budget of 30 seconds (a stage's compute on a CPU plus a megabyte-sized
// transfer on a home uplink) at ticks of tickSeconds.
func DefaultRelayConfig(pl Placement, self, n int, tickSeconds float64) RelayConfig {
	c := compression.DefaultConfig()
	c.Codec = compression.BF16
	c.ZstdLevel = 0 // activations are noise to zstd; it would cost CPU for a few percent
	mu := DefaultRules().Mu
	return RelayConfig{Self: self, Placement: pl, Len: n, Codec: c, Mu: mu,
		HopWait:       max(1, int64(30/tickSeconds+0.5)),
		MaxStashBytes: int64(2*mu) * maxFrameBytes(n, c.ChunkElems), Bounds: DefaultTensorBounds()}
}

// maxFrameBytes bounds one encoded tensor of n elements in chunks of
// chunk elements, whatever the codec: fp32, plus a 32-byte frame header
// and a 20-byte header per chunk (compression's wire format), plus a
// margin for a zstd stage that does not pay.
func maxFrameBytes(n, chunk int) int64 {
	chunks := int64(n/max(chunk, 1) + 1)
	return 4*int64(n) + int64(n)/64 + 32 + 20*chunks + 1024
}

// MaxMessage bounds one relay message of this configuration on the wire:
// the header, the longest path, and one encoded tensor. A transport sizes
// its frames with it (larger messages are refused before allocation).
func (c RelayConfig) MaxMessage() int64 {
	return relayHdrLen + visitLen*int64(c.Placement.Stages) + 4 + maxFrameBytes(c.Len, c.Codec.ChunkElems)
}

// maxActivation bounds RelayConfig.Len: 4 GiB of fp32 per tensor, far
// past any microbatch's activations.
const maxActivation = 1 << 30

// maxMicrobatches bounds a schedule's length.
const maxMicrobatches = 1 << 20

// Validate names the first invalid field.
func (c RelayConfig) Validate() error {
	pl := c.Placement
	switch {
	case pl.Stages < 1 || pl.Stages > maxPathLen:
		return fmt.Errorf("%w: placement of %d stages outside [1, %d]", ErrConfig, pl.Stages, maxPathLen)
	case len(pl.StageOf) > maxNodeIndex:
		return fmt.Errorf("%w: %d nodes, at most %d", ErrConfig, len(pl.StageOf), maxNodeIndex)
	case c.Self < 0 || c.Self >= len(pl.StageOf):
		return fmt.Errorf("%w: self %d outside the placement's %d nodes", ErrConfig, c.Self, len(pl.StageOf))
	case pl.StageOf[c.Self] < 0 || pl.StageOf[c.Self] >= pl.Stages:
		return fmt.Errorf("%w: node %d serves stage %d of %d", ErrConfig, c.Self, pl.StageOf[c.Self], pl.Stages)
	case c.Len <= 0 || c.Len > maxActivation:
		return fmt.Errorf("%w: activation length %d outside [1, %d]", ErrConfig, c.Len, maxActivation)
	case c.Mu < 1 || c.Mu > 1<<16:
		return fmt.Errorf("%w: mu %d outside [1, 65536]", ErrConfig, c.Mu)
	case c.HopWait < 1:
		return fmt.Errorf("%w: hop wait %d ticks must be positive", ErrConfig, c.HopWait)
	case c.MaxStashBytes < 0:
		return fmt.Errorf("%w: max stash bytes %d is negative", ErrConfig, c.MaxStashBytes)
	}
	if err := c.Bounds.Validate(); err != nil {
		return err
	}
	return c.Codec.Validate()
}

// StageRunner is the compute of one node's stage, which the relay asks for
// through Work and the driver runs. Slices returned belong to the caller.
// At stage 0 the runner owns the microbatches' tokens and targets, keyed by
// (iteration, microbatch). Calls for one node never overlap.
type StageRunner interface {
	// Forward runs the stage's forward on microbatch mb and returns its
	// output. in is the previous visit's output; nil at stage 0, which
	// embeds the microbatch's tokens. The runner keeps what its backward
	// needs until Backward or Drop.
	Forward(iter uint64, mb int, in []float32) (out []float32, err error)
	// Head runs stage 0's head on the activation back from the path's last
	// visit: the loss, then its backward, returning the gradient with
	// respect to in.
	Head(iter uint64, mb int, in []float32) (loss float32, din []float32, err error)
	// Backward runs the stage's backward on dout, the gradient with respect
	// to Forward's output, accumulating the parameter gradients, and returns
	// the gradient with respect to Forward's input (nil at stage 0).
	Backward(iter uint64, mb int, dout []float32) (din []float32, err error)
	// Drop forgets microbatch mb (it failed); unknown ones are ignored.
	Drop(iter uint64, mb int)
}

// Op is what a Work asks of the runner.
type Op uint8

// The operations.
const (
	OpForward Op = iota + 1
	OpHead
	OpBackward
	OpDrop
)

func (o Op) String() string {
	switch o {
	case OpForward:
		return "forward"
	case OpHead:
		return "head"
	case OpBackward:
		return "backward"
	case OpDrop:
		return "drop"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// Work is one call the relay asks of the node's StageRunner. Work must be
// run in the order Ready lists it (a Drop follows the forward it undoes),
// and its Result handed back with Done (none for OpDrop).
type Work struct {
	Op    Op
	Iter  uint64
	MB    int
	Stage int
	In    []float32 // forward's or head's input, backward's dout; nil for stage 0's forward and for OpDrop
}

// Result is the outcome of a Work.
type Result struct {
	Op   Op
	Iter uint64
	MB   int
	Out  []float32 // forward's output, head's or backward's input gradient
	Loss float32   // OpHead
	Err  error
}

// Run runs w on r; ok is false for OpDrop, which has no result.
func (w Work) Run(r StageRunner) (res Result, ok bool) {
	res = Result{Op: w.Op, Iter: w.Iter, MB: w.MB}
	switch w.Op {
	case OpForward:
		res.Out, res.Err = r.Forward(w.Iter, w.MB, w.In)
	case OpHead:
		res.Loss, res.Out, res.Err = r.Head(w.Iter, w.MB, w.In)
	case OpBackward:
		res.Out, res.Err = r.Backward(w.Iter, w.MB, w.In)
	default:
		r.Drop(w.Iter, w.MB)
		return res, false
	}
	return res, true
}

// Envelope is one message for the driver to send to node To.
type Envelope struct {
	To      int
	Payload []byte
}

// Outcome ends one visit of a microbatch at this node. At the stage-0 node
// (Hop 0) it ends the microbatch: Loss is its loss when Err is nil.
type Outcome struct {
	Iter uint64
	MB   int
	Hop  int
	Loss float32
	Err  error
}

// Ready is what the machine produced since the last call.
type Ready struct {
	Messages  []Envelope
	Work      []Work
	Outcomes  []Outcome
	BytesSent int64
}

type phase uint8

const (
	phExpect      phase = iota // scheduled here; the input has not arrived (hops only)
	phForward                  // forward handed to the runner
	phAwaitReturn              // stage 0: activation sent on; waiting for it to come back
	phHead                     // stage 0: head handed to the runner
	phAwaitGrad                // activation (or the head's gradient) sent; waiting for the gradient
	phBackward                 // backward handed to the runner
	phDone
)

// visit is this node's part in one microbatch.
type visit struct {
	mb       uint32
	hop      int // this node's index in path
	path     Path
	phase    phase
	deadline int64
	loss     float32
	holds    bool // counts against Mu: the runner keeps an activation
}

type stashed struct {
	from    int
	payload []byte
}

// Relay is the state machine of one node.
type Relay struct {
	cfg   RelayConfig
	stage int
	enc   *compression.Encoder
	dec   *compression.Decoder
	now   int64

	iter   uint64
	begun  bool
	visits map[uint32]*visit
	order  []uint32 // the visits' microbatches, ascending
	held   int

	stash      []stashed
	stashBytes int64
	dropped    int64
	ready      Ready

	norms map[int]*normTrack // by edge: 2*sending stage + kind
}

// normWindow is how many of an edge's last norms its median is taken
// over, and normWarm how many it needs before it bounds anything.
const (
	normWindow = 32
	normWarm   = 8
)

// normTrack is the last norms one edge delivered. The norms of an
// iteration count from the next one on, added in sorted order, so that
// the bounds do not depend on the order in which the network delivered
// them (a staged run stays bit-reproducible).
type normTrack struct {
	last    [normWindow]float64
	n       int
	pending []float64 // this iteration's
}

// commit adds the iteration's norms to the window.
func (t *normTrack) commit() {
	slices.Sort(t.pending)
	for _, x := range t.pending {
		t.last[t.n%normWindow] = x
		t.n++
	}
	t.pending = t.pending[:0]
}

// median is the median of the last norms; 0 before normWarm of them.
func (t *normTrack) median() float64 {
	k := min(t.n, normWindow)
	if k < normWarm {
		return 0
	}
	s := t.last
	slices.Sort(s[:k])
	return s[k/2]
}

// NewRelay returns the machine of node cfg.Self.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	enc, err := compression.NewEncoder(cfg.Codec)
	if err != nil {
		return nil, err
	}
	dc := cfg.Codec
	dc.MaxElements = int64(cfg.Len) // a frame declaring more fails before allocating
	dec, err := compression.NewDecoder(dc)
	if err != nil {
		enc.Close()
		return nil, err
	}
	return &Relay{cfg: cfg, stage: cfg.Placement.StageOf[cfg.Self], enc: enc, dec: dec, visits: map[uint32]*visit{}, norms: map[int]*normTrack{}}, nil
}

// Close releases the codecs.
func (r *Relay) Close() {
	r.enc.Close()
	r.dec.Close()
}

// Stage is the stage this node serves.
func (r *Relay) Stage() int { return r.stage }

// Now is the machine's clock, in ticks.
func (r *Relay) Now() int64 { return r.now }

// Held is the number of activations the node holds (at most Mu).
func (r *Relay) Held() int { return r.held }

// Dropped counts messages dropped as malformed or unexpected.
func (r *Relay) Dropped() int64 { return r.dropped }

// Ready returns and clears what the machine produced.
func (r *Relay) Ready() Ready {
	rd := r.ready
	r.ready = Ready{}
	return rd
}

// Begin starts iteration iter with schedule paths (microbatch m follows
// paths[m]; every node of the swarm is given the same schedule): the
// visits of the previous iteration that did not end fail with ErrAborted,
// the microbatches whose paths start here start, and messages for iter
// that arrived early are taken. It returns the number of visits this node
// has in the iteration (each will end with one Outcome). On error nothing
// changed.
func (r *Relay) Begin(iter uint64, paths []Path) (int, error) {
	if r.begun && iter <= r.iter {
		return 0, fmt.Errorf("%w: iteration %d after iteration %d", ErrConfig, iter, r.iter)
	}
	if len(paths) > maxMicrobatches {
		return 0, fmt.Errorf("%w: %d microbatches, at most %d", ErrConfig, len(paths), maxMicrobatches)
	}
	var mine []*visit
	for m, p := range paths {
		if err := r.checkPath(p); err != nil {
			return 0, fmt.Errorf("microbatch %d: %w", m, err)
		}
		if h := slices.Index(p.Nodes, r.cfg.Self); h >= 0 {
			mine = append(mine, &visit{mb: uint32(m), hop: h, path: p.Clone()})
		}
	}
	if len(mine) > r.cfg.Mu {
		return 0, fmt.Errorf("%w: node %d is on %d paths, mu = %d", ErrNodeMemory, r.cfg.Self, len(mine), r.cfg.Mu)
	}
	for _, mb := range r.order {
		if v := r.visits[mb]; v.phase != phDone {
			r.fail(v, fmt.Errorf("%w: iteration %d ended", ErrAborted, r.iter), false)
		}
	}
	r.iter, r.begun = iter, true
	for _, t := range r.norms {
		t.commit()
	}
	clear(r.visits)
	r.order = r.order[:0]
	for _, v := range mine {
		r.visits[v.mb] = v
		r.order = append(r.order, v.mb)
		if v.hop == 0 {
			v.phase, v.holds = phForward, true
			r.held++
			r.work(v, OpForward, nil)
		} else {
			v.deadline = r.now + int64(2*len(v.path.Nodes)+1)*r.cfg.HopWait
		}
	}
	stash := r.stash
	r.stash, r.stashBytes = nil, 0
	for _, s := range stash {
		if m, err := parseRelayMsg(s.payload); err == nil && m.iter == iter {
			r.handle(s.from, m)
		}
	}
	return len(mine), nil
}

// checkPath checks what the relay relies on: a path of 1..Stages visits
// starting at stage 0, each to an existing node that serves that stage,
// no stage twice (so no node twice). The scheduling rules (jumps, swaps,
// loads) are SchedulePaths' and Validate's business, not the relay's.
func (r *Relay) checkPath(p Path) error {
	pl := r.cfg.Placement
	if len(p.Nodes) != len(p.Stages) || len(p.Nodes) == 0 || len(p.Nodes) > pl.Stages {
		return fmt.Errorf("%w: %d nodes for %d stages, at most %d", ErrMalformed, len(p.Nodes), len(p.Stages), pl.Stages)
	}
	return checkVisits(p, pl)
}

// Step takes one message received from node from. Malformed or unexpected
// messages are dropped.
func (r *Relay) Step(from int, payload []byte) {
	m, err := parseRelayMsg(payload)
	if err != nil || from < 0 || from >= len(r.cfg.Placement.StageOf) || from == r.cfg.Self {
		r.dropped++
		return
	}
	switch {
	case !r.begun || m.iter == r.iter+1:
		r.stashMsg(from, payload)
	case m.iter == r.iter:
		r.handle(from, m)
	default:
		r.dropped++ // a past iteration, or one too far ahead to be honest
	}
}

// Stashed is a message a Relay keeps for an iteration it has not begun.
type Stashed struct {
	From    int // node index in the Relay's placement
	Payload []byte
}

// TakeStash removes and returns the messages kept for an iteration not
// begun yet: a driver that moves to a new placement between two iterations
// hands them to the new machine (RelayDriver.Switch).
func (r *Relay) TakeStash() []Stashed {
	out := make([]Stashed, len(r.stash))
	for i, s := range r.stash {
		out[i] = Stashed{From: s.from, Payload: s.payload}
	}
	r.stash, r.stashBytes = nil, 0
	return out
}

// stashMsg keeps a message for the next iteration within the budget.
func (r *Relay) stashMsg(from int, payload []byte) {
	mine := 0
	for _, s := range r.stash {
		if s.from == from {
			mine++
		}
	}
	n := int64(len(payload))
	if mine >= 2*r.cfg.Mu || r.stashBytes+n > r.cfg.MaxStashBytes {
		r.dropped++
		return
	}
	r.stash = append(r.stash, stashed{from, slices.Clone(payload)})
	r.stashBytes += n
}

// nextNode and prevNode are the nodes after and before visit h; the
// visit after the last is the return to stage 0's head.
func nextNode(p Path, h int) int { return p.Nodes[(h+1)%len(p.Nodes)] }

func prevNode(p Path, h int) int {
	if h == 0 {
		return p.Nodes[len(p.Nodes)-1]
	}
	return p.Nodes[h-1]
}

func (r *Relay) handle(from int, m relayMsg) {
	v := r.visits[m.mb]
	if v == nil || v.phase == phDone || !pathEqual(m.path, v.path) {
		if v == nil || v.phase != phDone {
			r.refuse(from, m)
		}
		r.dropped++
		return
	}
	p, L := v.path, len(v.path.Nodes)
	switch m.kind {
	case kindAct:
		want := v.hop // the hop that receives it
		if v.hop == 0 {
			want = L
		}
		if int(m.hop) != want || int(m.stage) != p.Stages[want%L] || from != prevNode(p, v.hop) ||
			(v.hop == 0 && v.phase != phAwaitReturn) || (v.hop > 0 && v.phase != phExpect) {
			r.dropped++
			return
		}
		if v.hop > 0 && r.held >= r.cfg.Mu {
			r.fail(v, fmt.Errorf("%w: node %d holds %d activations", ErrNodeMemory, r.cfg.Self, r.held), true)
			return
		}
		x, err := r.tensor(from, m)
		if err != nil {
			r.fail(v, err, true)
			return
		}
		if v.hop == 0 {
			v.phase = phHead
			r.work(v, OpHead, x)
			return
		}
		v.phase, v.holds = phForward, true
		r.held++
		r.work(v, OpForward, x)
	case kindGrad:
		if int(m.hop) != v.hop || int(m.stage) != p.Stages[v.hop] || from != nextNode(p, v.hop) || v.phase != phAwaitGrad {
			r.dropped++
			return
		}
		x, err := r.tensor(from, m)
		if err != nil {
			r.fail(v, err, true)
			return
		}
		v.phase = phBackward
		r.work(v, OpBackward, x)
	case kindFail:
		if v.hop != 0 || !slices.Contains(p.Nodes[1:], from) {
			r.dropped++
			return
		}
		r.fail(v, fmt.Errorf("%w: node %d (stage %d) gave it up: %w", ErrHopFailed, from, r.cfg.Placement.StageOf[from], m.reason.err()), true)
	case kindAbort:
		if v.hop == 0 || from != p.Nodes[0] {
			r.dropped++
			return
		}
		r.fail(v, fmt.Errorf("%w: by its stage-0 node %d", ErrAborted, from), false)
	}
}

// refuse answers an activation this node will not take with a fail to the
// path's stage-0 node, so that it fails the microbatch at once instead of
// at its deadline; other messages are dropped silently.
func (r *Relay) refuse(from int, m relayMsg) {
	if m.kind != kindAct || int(m.hop) >= len(m.path.Nodes) || m.path.Nodes[0] == r.cfg.Self ||
		m.path.Nodes[0] >= len(r.cfg.Placement.StageOf) {
		return
	}
	r.send(m.path.Nodes[0], relayMsg{kind: kindFail, iter: m.iter, mb: m.mb, stage: m.stage, hop: m.hop, path: m.path, reason: reasonRejected})
}

func (f failReason) err() error {
	switch f {
	case reasonMemory:
		return ErrNodeMemory
	case reasonRejected:
		return fmt.Errorf("%w: not on its schedule", ErrBadMessage)
	case reasonPayload:
		return fmt.Errorf("%w: the tensor did not decode", ErrBadMessage)
	case reasonCompute:
		return ErrCompute
	case reasonTimeout:
		return ErrTimeout
	case reasonTensor:
		return ErrBadTensor
	}
	return ErrBadMessage
}

func reasonOf(err error) failReason {
	switch {
	case errors.Is(err, ErrNodeMemory):
		return reasonMemory
	case errors.Is(err, ErrTimeout):
		return reasonTimeout
	case errors.Is(err, ErrCompute):
		return reasonCompute
	case errors.Is(err, ErrBadMessage):
		return reasonPayload
	case errors.Is(err, ErrBadTensor):
		return reasonTensor
	}
	return reasonRejected
}

// decode reads one tensor of exactly Len elements.
func (r *Relay) decode(frame []byte) ([]float32, error) {
	if int64(len(frame)) > maxFrameBytes(r.cfg.Len, r.cfg.Codec.ChunkElems) {
		return nil, fmt.Errorf("%w: frame of %d bytes for %d elements", ErrBadMessage, len(frame), r.cfg.Len)
	}
	x, err := r.dec.DecodeBytes(frame, make([]float32, 0, r.cfg.Len))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadMessage, err)
	}
	if len(x) != r.cfg.Len {
		return nil, fmt.Errorf("%w: tensor of %d elements, want %d", ErrBadMessage, len(x), r.cfg.Len)
	}
	return x, nil
}

// tensor decodes m's tensor and admits it (admit). A forged frame that
// decodes to values that are not finite is refused by the decoder, and
// named like a tensor past the bounds.
func (r *Relay) tensor(from int, m relayMsg) ([]float32, error) {
	x, err := r.decode(m.frame)
	if errors.Is(err, compression.ErrNonFinite) {
		return nil, &TensorError{From: from, Stage: r.cfg.Placement.StageOf[from], Kind: m.kind.String(), Norm: math.NaN(), Bound: math.Inf(1)}
	}
	if err != nil {
		return nil, err
	}
	return x, r.admit(from, m.kind, x)
}

// admit judges x, a tensor of kind k from node from, by the bounds: a
// value that is not finite or a norm past MaxRMS or Drop times the edge's
// median refuses it; a norm past Clip times the median is scaled down to
// it, in place. Every finite norm under MaxRMS counts towards the median
// from the next iteration on, refused or not, so that an edge whose honest
// scale moves (a stage diverging, or recovering) is judged by its new
// scale within half a window; a hostile sender moves the median only where
// it sends most of the edge's tensors.
func (r *Relay) admit(from int, k relayKind, x []float32) error {
	var ss float64
	for _, f := range x {
		ss += float64(f) * float64(f) // NaN or Inf only for values that are; float32 squares cannot overflow it
	}
	norm, b := math.Sqrt(ss), r.cfg.Bounds
	stage := r.cfg.Placement.StageOf[from]
	refuse := func(bound float64) error {
		return &TensorError{From: from, Stage: stage, Kind: k.String(), Norm: norm, Bound: bound}
	}
	bound := math.Inf(1)
	if b.MaxRMS > 0 {
		bound = b.MaxRMS * math.Sqrt(float64(len(x)))
	}
	if !(norm <= bound) {
		return refuse(bound)
	}
	key := 2*stage + int(k-kindAct)
	t := r.norms[key]
	if t == nil {
		t = &normTrack{}
		r.norms[key] = t
	}
	med := t.median()
	t.pending = append(t.pending, norm) // at most mu an iteration
	if d := b.Drop * med; d > 0 && norm > d {
		return refuse(d)
	}
	if c := b.Clip * med; c > 0 && norm > c {
		s := float32(c / norm)
		for i := range x {
			x[i] *= s
		}
	}
	return nil
}

func (r *Relay) work(v *visit, op Op, in []float32) {
	r.ready.Work = append(r.ready.Work, Work{Op: op, Iter: r.iter, MB: int(v.mb), Stage: r.stage, In: in})
}

func (r *Relay) send(to int, m relayMsg) {
	b := appendRelayMsg(nil, m)
	r.ready.Messages = append(r.ready.Messages, Envelope{To: to, Payload: b})
	r.ready.BytesSent += int64(len(b))
}

// sendTensor encodes x into a message of kind k for visit hop of v's path.
func (r *Relay) sendTensor(v *visit, k relayKind, hop int, x []float32) error {
	L := len(v.path.Nodes)
	if len(x) != r.cfg.Len {
		return fmt.Errorf("%w: %s output of %d elements, want %d", ErrCompute, k, len(x), r.cfg.Len)
	}
	// Stochastic rounding, when configured, is keyed by the message, so a
	// resent or recomputed tensor encodes to the same bits.
	seed := r.iter*0x9E3779B97F4A7C15 ^ uint64(v.mb)<<20 ^ uint64(hop)<<4 ^ uint64(k)
	var frame []byte
	var err error
	if r.cfg.Hostile && hostilePoisons(k, r.iter, v.mb) {
		frame, err = r.hostileFrame(x, r.iter, seed)
	} else {
		frame, err = r.enc.Append(nil, x, seed)
	}
	if err != nil {
		return fmt.Errorf("%w: encoding the %s: %w", ErrCompute, k, err)
	}
	to := v.path.Nodes[hop%L]
	r.send(to, relayMsg{kind: k, iter: r.iter, mb: v.mb, stage: uint16(v.path.Stages[hop%L]), hop: uint16(hop), path: v.path, frame: frame})
	return nil
}

// Done takes the result of a Work the machine asked for. Results for
// visits that ended meanwhile (aborted, timed out) are ignored.
func (r *Relay) Done(res Result) {
	var want phase
	switch res.Op {
	case OpForward:
		want = phForward
	case OpHead:
		want = phHead
	case OpBackward:
		want = phBackward
	default:
		return
	}
	v := r.visits[uint32(res.MB)]
	if !r.begun || res.Iter != r.iter || res.MB < 0 || v == nil || v.phase != want {
		return
	}
	if res.Err != nil {
		r.fail(v, fmt.Errorf("%w: %s of stage %d: %w", ErrCompute, res.Op, r.stage, res.Err), true)
		return
	}
	L := len(v.path.Nodes)
	var err error
	switch res.Op {
	case OpForward:
		switch {
		case v.hop == 0 && L == 1: // a path of stage 0 alone: the head follows at once
			v.phase = phHead
			if len(res.Out) != r.cfg.Len {
				err = fmt.Errorf("%w: forward output of %d elements, want %d", ErrCompute, len(res.Out), r.cfg.Len)
				break
			}
			r.work(v, OpHead, slices.Clone(res.Out))
		case v.hop == 0:
			v.phase, v.deadline = phAwaitReturn, r.now+int64(L)*r.cfg.HopWait
			err = r.sendTensor(v, kindAct, 1, res.Out)
		default:
			v.phase, v.deadline = phAwaitGrad, r.now+int64(2*(L-v.hop)+1)*r.cfg.HopWait
			err = r.sendTensor(v, kindAct, v.hop+1, res.Out)
		}
	case OpHead:
		v.loss = res.Loss
		if L == 1 {
			v.phase = phBackward
			if len(res.Out) != r.cfg.Len {
				err = fmt.Errorf("%w: head gradient of %d elements, want %d", ErrCompute, len(res.Out), r.cfg.Len)
				break
			}
			r.work(v, OpBackward, slices.Clone(res.Out))
			break
		}
		v.phase, v.deadline = phAwaitGrad, r.now+int64(L)*r.cfg.HopWait
		err = r.sendTensor(v, kindGrad, L-1, res.Out)
	case OpBackward:
		if v.hop > 0 {
			if err = r.sendTensor(v, kindGrad, v.hop-1, res.Out); err != nil {
				break
			}
		}
		r.end(v, nil)
	}
	if err != nil {
		r.fail(v, err, true)
	}
}

// Tick advances the clock by one tick and fails the visits whose deadline
// passed.
func (r *Relay) Tick() {
	r.now++
	for _, mb := range r.order {
		v := r.visits[mb]
		switch v.phase {
		case phExpect, phAwaitReturn, phAwaitGrad:
			if r.now >= v.deadline {
				what := "its input"
				switch {
				case v.phase == phAwaitReturn:
					what = "its activation back"
				case v.phase == phAwaitGrad:
					what = "its gradient"
				}
				// A hop that never got its input has nothing to tell.
				r.fail(v, fmt.Errorf("%w: microbatch %d at hop %d waited for %s until tick %d", ErrTimeout, v.mb, v.hop, what, v.deadline), v.phase != phExpect)
			}
		}
	}
}

// fail ends v with err. The runner drops what it may hold for v (a
// forward or backward it was asked for runs first: work is in order).
// With notify, the stage-0 node tells the path's other nodes to drop the
// microbatch, and a hop tells the stage-0 node why it gave it up.
func (r *Relay) fail(v *visit, err error, notify bool) {
	if v.phase != phExpect {
		r.ready.Work = append(r.ready.Work, Work{Op: OpDrop, Iter: r.iter, MB: int(v.mb), Stage: r.stage})
	}
	if notify {
		m := relayMsg{iter: r.iter, mb: v.mb, path: v.path, hop: uint16(v.hop), stage: uint16(v.path.Stages[v.hop])}
		if v.hop == 0 {
			m.kind = kindAbort
			for _, to := range v.path.Nodes[1:] {
				r.send(to, m)
			}
		} else {
			m.kind, m.reason = kindFail, reasonOf(err)
			r.send(v.path.Nodes[0], m)
		}
	}
	r.end(v, err)
}

func (r *Relay) end(v *visit, err error) {
	if v.holds {
		v.holds = false
		r.held--
	}
	v.phase = phDone
	o := Outcome{Iter: r.iter, MB: int(v.mb), Hop: v.hop, Err: err}
	if err == nil && v.hop == 0 {
		o.Loss = v.loss
	}
	r.ready.Outcomes = append(r.ready.Outcomes, o)
}

func pathEqual(a, b Path) bool {
	return slices.Equal(a.Nodes, b.Nodes) && slices.Equal(a.Stages, b.Stages)
}
