package optimizer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/skein-ml/skein/compression"
)

// RingConfig configures the fault-tolerant ring all-reduce.
type RingConfig struct {
	// Codec encodes partial sums (re-quantized at every hop, accumulated in
	// fp32) and the chunk owners' final averages. Default: per-block min-max
	// uint8 (ALGORITHMS.md 1), no zstd.
	Codec compression.Config
	// InitialDeadline bounds the wait for a message before any arrival time
	// has been observed. Later deadlines adapt to observed arrival times
	// (smoothed mean + 4 deviations, doubled), clamped to [MinDeadline,
	// MaxDeadline]. The first hop of a round learns separately, because it
	// also absorbs the members' different inner-loop speeds.
	InitialDeadline, MinDeadline, MaxDeadline time.Duration
	// MaxAbs bounds every element of a decoded contribution, per member
	// summed into it; larger or non-finite values reject the sender.
	MaxAbs float32
	// MaxAttempts bounds how often one round is redone with a smaller group.
	MaxAttempts int
	// MaxStashBytes bounds the bytes of the messages kept for rounds or
	// groups not yet reached (members that finished their inner phase
	// first); one sender may hold at most half of it, so that a member
	// sending thousands of messages for a future round cannot pin memory
	// nor push out the others'. It should hold a few rounds' worth of one
	// member's messages: about 2 x the model's parameters in bytes with an
	// 8-bit codec. Default DefaultMaxStashBytes.
	MaxStashBytes int64
	// Order arranges the group into a ring (for example by measured
	// bandwidth); it must be a deterministic function of its input, which is
	// sorted by ID. nil keeps ID order.
	Order func([]PeerID) []PeerID
	// OnReject is told about a peer whose contribution was dropped.
	OnReject func(from PeerID, err error)
	Logger   *slog.Logger
}

// DefaultRingConfig returns WAN-minded defaults.
func DefaultRingConfig() RingConfig {
	c := compression.DefaultConfig()
	c.Codec = compression.MinMax8
	c.ZstdLevel = 0
	return RingConfig{Codec: c, InitialDeadline: 2 * time.Minute, MinDeadline: 2 * time.Second,
		MaxDeadline: 10 * time.Minute, MaxAbs: 1e4, MaxAttempts: 16, MaxStashBytes: DefaultMaxStashBytes}
}

// Validate names the first invalid field.
func (c RingConfig) Validate() error {
	switch {
	case c.InitialDeadline <= 0 || c.MinDeadline <= 0 || c.MaxDeadline < c.MinDeadline:
		return fmt.Errorf("%w: deadlines initial %v, min %v, max %v", ErrConfig, c.InitialDeadline, c.MinDeadline, c.MaxDeadline)
	case !(c.MaxAbs > 0):
		return fmt.Errorf("%w: max abs %v must be positive", ErrConfig, c.MaxAbs)
	case c.MaxAttempts <= 0:
		return fmt.Errorf("%w: max attempts %d must be positive", ErrConfig, c.MaxAttempts)
	case c.MaxStashBytes <= 0:
		return fmt.Errorf("%w: max stash bytes %d must be positive", ErrConfig, c.MaxStashBytes)
	}
	return c.Codec.Validate()
}

// Ring runs fault-tolerant ring all-reduces among the members of a Peers.
// Rounds are numbered by the caller; a round's group is the set of members
// alive when an attempt starts. If a member fails or stalls past the adaptive
// deadline, the survivors redo the round without it from the same inputs; a
// member that already finished answers later attempts with its result, so
// every member that returns a round's result returns the same bits.
//
// A Ring serves other members' queries in the background from Start until
// Close; AllReduceMean calls must not overlap.
type Ring struct {
	peers Peers
	cfg   RingConfig
	log   *slog.Logger
	enc   *compression.Encoder
	dec   *compression.Decoder

	inbox chan envelope

	mu       sync.Mutex
	done     map[uint64]doneRound // last finished rounds
	doneList []uint64
	// initial is the group of the current call's first attempt: control
	// messages are accepted only from its members.
	initial []PeerID
	// attempts holds the group hashes of the current call's attempts. A
	// suspicion counts only if its sender made it in one of them: a member
	// whose view of the membership differed (one saw a joiner, the other
	// not yet) formed another ring, and its timeouts say nothing about ours.
	attempts []uint64
	// queried records, per unfinished round, the members that asked us for
	// its result (answered when it finishes), and when one last said it was
	// waiting for it, in no ring (queryWaiting): when every other live
	// member is waiting too, nobody will compute it.
	queried map[uint64]map[PeerID]time.Time // zero time: asked while computing
	stash   []envelope                      // messages for rounds or groups not yet reached
	// abandoned lists the rings (sender, group hash) whose sender has left
	// them, and when we heard: a suspicion from a member is also its word
	// that it will not go on in the ring it made it in. Its reduce and
	// gather messages for that ring received before then are void: a member
	// that later forms the same ring (a retry of the round, same members)
	// must not take them (it would pass reduce-scatter on a dead ring's
	// message and then wait in all-gather for a member that has moved on).
	// Messages received later belong to the retry. Bounded by maxAbandoned,
	// oldest rounds first out.
	abandoned map[ringKey]abandonment
	first     estimator // wait for the first message of a round
	hop       estimator // wait for later messages

	ctx    context.Context // the receiver's; answers are sent under it
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// doneRound is a finished round's result, kept to answer late members.
type doneRound struct {
	chunks   [][]byte
	group    []PeerID        // who may ask for it
	answered map[PeerID]bool // each member is answered once
}

type envelope struct {
	from PeerID
	h    header
	body []byte
	at   time.Time
}

const (
	keepDone     = 4
	maxStash     = 4096
	maxAbandoned = 1024
)

// queryWaiting in a query's step field says that its sender is in no ring
// for that round: it waits for the result (awaitResult). A query without it
// comes from a member still computing (a redo, or all-gather).
const queryWaiting = 1

type ringKey struct {
	from PeerID
	gh   uint64
}

type abandonment struct {
	round uint64
	at    time.Time
}

// NewRing validates cfg; call Start before the first round.
func NewRing(peers Peers, cfg RingConfig) (*Ring, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	enc, err := compression.NewEncoder(cfg.Codec)
	if err != nil {
		return nil, err
	}
	dec, err := compression.NewDecoder(cfg.Codec)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Ring{peers: peers, cfg: cfg, log: log, enc: enc, dec: dec, inbox: make(chan envelope, 1024),
		done: map[uint64]doneRound{}}, nil
}

// Start runs the background receiver until ctx ends or Close.
func (r *Ring) Start(ctx context.Context) {
	ctx, r.cancel = context.WithCancel(ctx)
	r.ctx = ctx
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.receive(ctx)
	}()
}

// Close stops the background receiver.
func (r *Ring) Close() {
	if r.cancel != nil {
		r.cancel()
	}
	r.wg.Wait()
	r.enc.Close()
	r.dec.Close()
}

func (r *Ring) receive(ctx context.Context) {
	for {
		m, err := r.peers.Recv(ctx)
		if err != nil {
			return
		}
		h, body, err := parseMessage(m.Payload)
		if err != nil {
			r.reject(m.From, err)
			continue
		}
		if h.kind == kindQuery {
			r.answer(ctx, m.From, h.round, h.step == queryWaiting)
			if h.step == queryWaiting {
				// Also tell a ring waiting on this member that it is
				// not coming (see wait).
				select {
				case r.inbox <- envelope{from: m.From, h: h, at: time.Now()}:
				default:
				}
			}
			continue
		}
		if h.kind == kindSuspect && h.group != 0 {
			r.abandon(m.From, h.group, h.round)
		}
		select {
		case r.inbox <- envelope{from: m.From, h: h, body: body, at: time.Now()}:
		default: // nobody is draining (a long inner phase): drop rather than block
			r.log.Debug("inbox full; dropped message", "peer", m.From, "kind", h.kind, "round", h.round)
		}
	}
}

// answer sends a finished round's result to a member of that round's
// group that asks for it, once per member, off the receive loop: a query is
// 32 bytes and the answer the size of the model, so strangers get nothing.
// A query for an unfinished round is remembered and answered when the round
// finishes; one for a round finished so long ago that its result is no
// longer kept gets a 32-byte "gone", so the asker re-syncs another way at
// once instead of waiting.
func (r *Ring) answer(ctx context.Context, from PeerID, round uint64, waiting bool) {
	r.mu.Lock()
	d, ok := r.done[round]
	if !ok && len(r.doneList) > 0 && round < slices.Max(r.doneList) {
		member := slices.Contains(r.peers.Members(), from)
		r.mu.Unlock()
		if member {
			r.send(ctx, from, appendMessage(nil, header{kind: kindGone, round: round}, nil), nil)
		}
		return
	}
	if !ok && slices.Contains(r.initial, from) {
		if r.queried == nil {
			r.queried = map[uint64]map[PeerID]time.Time{}
		}
		if r.queried[round] == nil {
			for k := range r.queried { // only the current round matters
				delete(r.queried, k)
			}
			r.queried[round] = map[PeerID]time.Time{}
		}
		if waiting {
			r.queried[round][from] = time.Now()
		} else if _, seen := r.queried[round][from]; !seen {
			r.queried[round][from] = time.Time{}
		}
	}
	// Members of that round's group, and members of the run now (a late
	// joiner that fell behind), get the result; strangers get nothing.
	if !ok || d.answered[from] || (!slices.Contains(d.group, from) && !slices.Contains(r.peers.Members(), from)) {
		r.mu.Unlock()
		return
	}
	d.answered[from] = true
	r.mu.Unlock()
	r.sendDone(ctx, from, round, d)
}

// sendDone sends round's result to one member in the background; a failed
// send lets the member's next query be answered again.
func (r *Ring) sendDone(ctx context.Context, to PeerID, round uint64, d doneRound) {
	reply := appendMessage(nil, header{kind: kindDone, round: round}, appendDone(nil, d.chunks))
	r.send(ctx, to, reply, func() {
		r.mu.Lock()
		delete(d.answered, to)
		r.mu.Unlock()
	})
}

// send delivers msg off the caller's goroutine; failed runs if it fails.
func (r *Ring) send(ctx context.Context, to PeerID, msg []byte, failed func()) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if err := r.peers.Send(ctx, to, msg); err != nil {
			r.log.Debug("answering query", "peer", to, "err", err)
			if failed != nil {
				failed()
			}
		}
	}()
}

func (r *Ring) reject(from PeerID, err error) {
	r.log.Warn("dropped contribution", "peer", from, "err", err)
	if r.cfg.OnReject != nil {
		r.cfg.OnReject(from, err)
	}
}

// Errors that end one attempt of a round.
type suspectError struct {
	peer PeerID
	err  error
}

func (e *suspectError) Error() string { return fmt.Sprintf("peer %s: %v", e.peer, e.err) }

var (
	errRegroup       = errors.New("group changed")
	errSelfSuspected = errors.New("suspected by the others")
)

type adoptedError struct{ chunks [][]byte }

func (adoptedError) Error() string { return "adopted a finished result" }

// Self is this member's ID.
func (r *Ring) Self() PeerID { return r.peers.Self() }

// AllReduceMean averages x (identical length on every member) over the
// round's group into out. On success every member that returns holds the
// same bits in out. On error out is unspecified and the round did not happen
// for this member.
func (r *Ring) AllReduceMean(ctx context.Context, round uint64, x, out []float32) (st RoundStats, err error) {
	if len(out) != len(x) {
		return RoundStats{}, fmt.Errorf("optimizer: output of %d for input of %d", len(out), len(x))
	}
	began := time.Now()
	st.Round = round
	suspects := map[PeerID]bool{}
	self := r.peers.Self()
	r.mu.Lock()
	delete(r.done, round) // a retried round must not answer with an earlier, rejected run
	r.mu.Unlock()
	defer func() {
		if err != nil {
			r.forgetControl(round)
		}
	}()
	for attempt := 1; attempt <= r.cfg.MaxAttempts; attempt++ {
		st.Attempts = attempt
		var members []PeerID
		for _, p := range r.peers.Members() {
			if !suspects[p] {
				members = append(members, p)
			}
		}
		group := sortedGroup(members)
		if r.cfg.Order != nil {
			group = r.cfg.Order(group)
		}
		if !slices.Contains(group, self) {
			return st, fmt.Errorf("%w: %s", ErrNotMember, self)
		}
		gh := groupHash(round, group)
		r.mu.Lock()
		if attempt == 1 {
			r.initial, r.attempts = group, r.attempts[:0]
		}
		r.attempts = append(r.attempts, gh)
		r.mu.Unlock()
		st.Group = group
		var chunks [][]byte
		var err error
		switch {
		case attempt == 1:
			// Control messages that arrived before this call (others started
			// the round earlier) count as if they arrived now.
			err = r.replayStash(round, group, suspects)
		case len(group) == 1 && len(r.initial) > 1:
			// Everyone else was excluded: never average alone; a member
			// that finished holds the round's result.
			err = errSelfSuspected
		}
		if err == nil {
			chunks, err = r.attempt(ctx, round, gh, group, suspects, x, out, &st)
		}
		r.log.Debug("attempt", "self", self, "round", round, "attempt", attempt, "group", len(group), "err", err)
		var adopted adoptedError
		var sus *suspectError
		switch {
		case err == nil:
		case errors.As(err, &adopted):
			if err := r.decodeAll(adopted.chunks, out); err != nil {
				return st, err
			}
			chunks, st.Adopted = adopted.chunks, true
		case errors.Is(err, errSelfSuspected):
			chunks, err = r.awaitResult(ctx, round, r.initial, out, &st)
			if err != nil {
				return st, err
			}
			st.Adopted = true
		case errors.As(err, &sus):
			suspects[sus.peer] = true
			r.log.Info("redoing round without peer", "round", round, "peer", sus.peer, "err", sus.err)
			r.broadcast(ctx, group, header{kind: kindSuspect, round: round, group: gh}, []byte(sus.peer), &st)
			r.broadcast(ctx, group, header{kind: kindQuery, round: round}, nil, &st)
			continue
		case errors.Is(err, errRegroup):
			continue
		default:
			return st, err
		}
		r.finish(round, chunks)
		st.Duration = time.Since(began)
		return st, nil
	}
	return st, fmt.Errorf("optimizer: round %d: no result after %d attempts", round, r.cfg.MaxAttempts)
}

// forgetControl drops what a failed call of round learned about the others:
// their suspicions and queries belong to attempts that no longer run, and a
// retry of the round (after the caller re-syncs) must start clean instead of
// excluding itself again on stale words.
func (r *Ring) forgetControl(round uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.queried, round)
	keep := r.stash[:0]
	for _, e := range r.stash {
		if e.h.round != round || e.h.kind != kindSuspect {
			keep = append(keep, e)
		}
	}
	r.stash = keep
	for {
		select {
		case e := <-r.inbox:
			if e.h.round != round || e.h.kind != kindSuspect {
				r.stashLocked(e)
			}
		default:
			return
		}
	}
}

// replayStash runs the stashed control messages of round through control.
func (r *Ring) replayStash(round uint64, group []PeerID, suspects map[PeerID]bool) error {
	r.mu.Lock()
	var ctl []envelope
	keep := r.stash[:0]
	for _, e := range r.stash {
		if e.h.round == round && (e.h.kind == kindSuspect || e.h.kind == kindDone) {
			ctl = append(ctl, e)
		} else {
			keep = append(keep, e)
		}
	}
	r.stash = keep
	r.mu.Unlock()
	var first error
	for _, e := range ctl {
		if err := r.control(e, round, group, suspects); err != nil && first == nil {
			first = err
		}
	}
	if errors.Is(first, errRegroup) {
		return errRegroup
	}
	return first
}

func (r *Ring) finish(round uint64, chunks [][]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, again := r.done[round]; !again {
		r.doneList = append(r.doneList, round)
	}
	d := doneRound{chunks: chunks, group: r.initial, answered: map[PeerID]bool{}}
	r.done[round] = d
	if len(r.doneList) > keepDone {
		delete(r.done, r.doneList[0])
		r.doneList = r.doneList[1:]
	}
	// Members that asked before we finished (they were excluded, or gave up
	// on the ring) get the result now rather than at their next query.
	for p := range r.queried[round] {
		if r.ctx == nil { // not started: nobody to answer with
			break
		}
		d.answered[p] = true
		r.sendDone(r.ctx, p, round, d)
	}
	delete(r.queried, round)
	kept := r.stash[:0]
	for _, e := range r.stash {
		if e.h.round > round {
			kept = append(kept, e)
		}
	}
	r.stash = kept
}

// broadcast sends a control message to the group without waiting: a send
// to a member that has just died can block for a dial timeout, and the
// round must go on meanwhile (its bytes are counted as sent).
func (r *Ring) broadcast(ctx context.Context, group []PeerID, h header, body []byte, st *RoundStats) {
	msg := appendMessage(nil, h, body)
	for _, p := range group {
		if p == r.peers.Self() {
			continue
		}
		st.BytesSent += int64(len(msg))
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			if err := r.peers.Send(ctx, p, msg); err != nil {
				r.log.Debug("control message not delivered", "peer", p, "kind", h.kind, "err", err)
			}
		}()
	}
}

// attempt runs reduce-scatter then all-gather once in a fixed group.
func (r *Ring) attempt(ctx context.Context, round, gh uint64, group []PeerID, suspects map[PeerID]bool, x, out []float32, st *RoundStats) ([][]byte, error) {
	M, n := len(group), len(x)
	pos := slices.Index(group, r.peers.Self())
	chunks := make([][]byte, M)
	if M == 1 {
		q, err := r.enc.Append(nil, x, round)
		if err != nil {
			return nil, err
		}
		chunks[0] = q
		return chunks, r.decodeAll(chunks, out)
	}
	succ, pred := group[(pos+1)%M], group[(pos-1+M)%M]
	maxChunk := (n + M - 1) / M
	acc := make([]float32, maxChunk+1)
	tmp := make([]float32, maxChunk+1)
	send := func(h header, body []byte) error {
		h.round, h.group = round, gh
		msg := appendMessage(nil, h, body)
		give := time.Now().Add(r.cfg.MaxDeadline)
		for {
			err := r.peers.Send(ctx, succ, msg)
			switch {
			case err == nil:
				st.BytesSent += int64(len(msg))
				return nil
			case ctx.Err() != nil:
				return ctx.Err()
			case errors.Is(err, ErrClosed):
				return err // we are the ones gone
			case h.kind == kindGather && slices.Contains(r.peers.Members(), succ) && time.Now().Before(give):
				// Past reduce-scatter the result may already exist
				// elsewhere: as for a late message, a live successor is
				// not excluded on one failed send (see waitGather).
				r.log.Debug("gather send failed; retrying", "peer", succ, "err", err)
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(r.cfg.MinDeadline / 4):
				}
			default:
				return &suspectError{peer: succ, err: err}
			}
		}
	}
	seed := func(step, chunk int) uint64 { return round*0x9E3779B97F4A7C15 ^ uint64(step)<<32 ^ uint64(chunk) }

	// Reduce-scatter: at step s send chunk pos-s, receive chunk pos-s-1 and
	// add our own part to it in fp32.
	for s := 0; s < M-1; s++ {
		sc := (pos - s + M) % M
		lo, hi := chunkBounds(n, M, sc)
		data := x[lo:hi]
		if s > 0 {
			data = acc[:hi-lo]
		}
		body, err := r.enc.Append(nil, data, seed(s, sc))
		if err != nil {
			return nil, err
		}
		if err := send(header{kind: kindReduce, step: uint32(s), chunk: uint32(sc)}, body); err != nil {
			return nil, err
		}
		rc := (pos - s - 1 + M) % M
		env, err := r.wait(ctx, round, gh, group, suspects, kindReduce, s, rc, pred)
		if err != nil {
			return nil, err
		}
		st.BytesRecv += int64(len(env.body) + headerLen)
		lo, hi = chunkBounds(n, M, rc)
		if err := r.decodeChunk(env, tmp[:hi-lo], float32(s+1)); err != nil {
			return nil, err
		}
		for i, v := range tmp[:hi-lo] {
			acc[i] = v + x[lo+i]
		}
	}
	// We own the full sum of chunk pos+1: average, encode once, and use the
	// decoded bytes ourselves so that every member decodes the same bytes.
	own := (pos + 1) % M
	lo, hi := chunkBounds(n, M, own)
	inv := 1 / float32(M)
	for i := range acc[:hi-lo] {
		acc[i] *= inv
	}
	q, err := r.enc.Append(nil, acc[:hi-lo], seed(M, own))
	if err != nil {
		return nil, err
	}
	chunks[own] = q
	if _, err := r.dec.DecodeBytes(q, out[lo:hi]); err != nil {
		return nil, err
	}
	// All-gather: forward final chunk bytes unchanged.
	for s := 0; s < M-1; s++ {
		sc := (own - s + M) % M
		if err := send(header{kind: kindGather, step: uint32(s), chunk: uint32(sc)}, chunks[sc]); err != nil {
			return nil, err
		}
		rc := (pos - s + M) % M
		env, err := r.waitGather(ctx, round, gh, group, suspects, s, rc, pred, st)
		if err != nil {
			return nil, err
		}
		st.BytesRecv += int64(len(env.body) + headerLen)
		lo, hi := chunkBounds(n, M, rc)
		if err := r.decodeChunk(env, out[lo:hi], 1); err != nil {
			return nil, err
		}
		chunks[rc] = append([]byte(nil), env.body...)
	}
	return chunks, nil
}

// decodeChunk decodes and validates a received chunk of contributors
// members' values; a bad one suspects its sender.
func (r *Ring) decodeChunk(env envelope, dst []float32, contributors float32) error {
	err := r.decodeExact(env.body, dst)
	if err == nil {
		err = checkFinite(dst, r.cfg.MaxAbs*contributors)
	}
	if err != nil {
		r.reject(env.from, err)
		return &suspectError{peer: env.from, err: err}
	}
	return nil
}

// decodeExact decodes a frame that must hold exactly len(dst) elements; the
// count is checked from the header before anything is decoded or allocated.
func (r *Ring) decodeExact(frame []byte, dst []float32) error {
	h, err := r.dec.ReadHeader(bytes.NewReader(frame))
	if err != nil {
		return err
	}
	if h.Count != int64(len(dst)) {
		return fmt.Errorf("%w: frame of %d elements, want %d", ErrRejected, h.Count, len(dst))
	}
	_, err = r.dec.DecodeBytes(frame, dst[:len(dst):len(dst)])
	return err
}

// decodeAll rebuilds a whole result from every chunk's final bytes.
func (r *Ring) decodeAll(chunks [][]byte, out []float32) error {
	M := len(chunks)
	for c, q := range chunks {
		lo, hi := chunkBounds(len(out), M, c)
		if err := r.decodeExact(q, out[lo:hi:hi]); err != nil {
			return fmt.Errorf("%w: result chunk %d: %v", ErrRejected, c, err)
		}
		if err := checkFinite(out[lo:hi], r.cfg.MaxAbs); err != nil {
			return err
		}
	}
	return nil
}

// waitGather waits for an all-gather message. Once this member has passed
// reduce-scatter, another member may already hold the whole result, so a
// late predecessor is not suspected at the first deadline as in
// reduce-scatter: while the failure detector still lists it, this member asks
// the group for a finished result and keeps waiting, up to MaxDeadline. This
// keeps a slow member that finished from being excluded behind its back,
// which would leave two different results for one round.
func (r *Ring) waitGather(ctx context.Context, round, gh uint64, group []PeerID, suspects map[PeerID]bool, step, chunk int, pred PeerID, st *RoundStats) (envelope, error) {
	give := time.Now().Add(r.cfg.MaxDeadline)
	for {
		env, err := r.wait(ctx, round, gh, group, suspects, kindGather, step, chunk, pred)
		var sus *suspectError
		if !errors.As(err, &sus) || time.Now().After(give) || !slices.Contains(r.peers.Members(), pred) {
			return env, err
		}
		r.broadcast(ctx, group, header{kind: kindQuery, round: round}, nil, st)
	}
}

// wait returns the message (kind, step, chunk) of this attempt from peer
// from, handling control messages that arrive meanwhile.
func (r *Ring) wait(ctx context.Context, round, gh uint64, group []PeerID, suspects map[PeerID]bool, k kind, step, chunk int, from PeerID) (envelope, error) {
	match := func(e envelope) bool {
		return e.h.round == round && e.h.group == gh && e.h.kind == k && e.h.step == uint32(step) &&
			e.h.chunk == uint32(chunk) && e.from == from
	}
	r.mu.Lock()
	for i, e := range r.stash {
		if match(e) {
			r.stash = append(r.stash[:i], r.stash[i+1:]...)
			r.mu.Unlock()
			return e, nil
		}
	}
	est := &r.hop
	if step == 0 && k == kindReduce {
		est = &r.first
	}
	// The message of step s has crossed s hops since the round started: a
	// stall anywhere upstream delays it. Waiting (s+1) deadlines lets the
	// stalled member's own successor, which waits at step 0, time out first
	// and name the right culprit, instead of every member suspecting its
	// innocent predecessor at once.
	deadline := min(est.deadline(r.cfg.InitialDeadline, r.cfg.MinDeadline, r.cfg.MaxDeadline)*time.Duration(step+1), r.cfg.MaxDeadline)
	r.mu.Unlock()
	began := time.Now()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return envelope{}, ctx.Err()
		case <-timer.C:
			return envelope{}, &suspectError{peer: from, err: fmt.Errorf("no %s step %d within %v", k, step, deadline)}
		case e := <-r.inbox:
			if e.h.kind == kindQuery {
				if e.from == from && e.h.round == round {
					// The member we wait for has left the round to wait
					// for its result: its message is not coming.
					return envelope{}, &suspectError{peer: from, err: fmt.Errorf("waits for the result of round %d instead of sending %s step %d", round, k, step)}
				}
				continue
			}
			if match(e) {
				r.mu.Lock()
				void := r.voidLocked(e)
				if !void {
					est.observe(time.Since(began))
				}
				r.mu.Unlock()
				if !void {
					return e, nil
				}
				continue
			}
			if err := r.control(e, round, group, suspects); err != nil {
				return envelope{}, err
			}
		}
	}
}

// control handles a message that is not the one awaited.
func (r *Ring) control(e envelope, round uint64, group []PeerID, suspects map[PeerID]bool) error {
	if e.h.round < round || e.h.round > round+1 {
		return nil // stale, or too far ahead to be honest
	}
	r.mu.Lock()
	known := slices.Contains(r.initial, e.from)
	ours := slices.Contains(r.attempts, e.h.group)
	r.mu.Unlock()
	if !known && e.h.round == round {
		return nil // not a member of this round: its word counts for nothing
	}
	if e.h.round == round {
		switch e.h.kind {
		case kindSuspect:
			if !ours {
				// Made in a ring we were never part of (its sender saw
				// another membership): it neither excludes us nor a
				// member of ours. If that ring excluded us, we find out
				// by timeout or by a result.
				r.log.Debug("ignored suspicion from another view", "peer", e.from, "round", round, "suspect", PeerID(e.body))
				return nil
			}
			p := PeerID(e.body)
			if p == r.peers.Self() {
				return errSelfSuspected
			}
			if !suspects[p] {
				suspects[p] = true
				if slices.Contains(group, p) {
					return errRegroup
				}
			}
			return nil
		case kindDone:
			chunks, err := r.doneChunks(e)
			if err != nil {
				return nil
			}
			return adoptedError{chunks: chunks}
		}
	}
	r.mu.Lock()
	r.stashLocked(e)
	r.mu.Unlock()
	return nil
}

// doneChunks parses a done record into chunks that own their bytes (the
// envelope's body may be reused); a malformed one rejects its sender.
func (r *Ring) doneChunks(e envelope) ([][]byte, error) {
	chunks, err := parseDone(e.body)
	if err != nil {
		r.reject(e.from, err)
		return nil, err
	}
	for i, c := range chunks {
		chunks[i] = append([]byte(nil), c...)
	}
	return chunks, nil
}

// stashLocked keeps e for later. It bounds the stash in messages (maxStash)
// and in bytes (MaxStashBytes), and each sender to half of the bytes: when
// a bound is reached, the sender's own oldest messages go first, then the
// oldest of all. A message larger than a sender's share is not kept.
func (r *Ring) stashLocked(e envelope) {
	if r.voidLocked(e) || e.h.kind == kindQuery { // a query is news only while fresh
		return
	}
	size := int64(len(e.body))
	share := r.cfg.MaxStashBytes / 2
	if size > share {
		r.log.Debug("message too large to keep for later", "from", e.from, "bytes", size)
		return
	}
	var total, mine int64
	for _, s := range r.stash {
		total += int64(len(s.body))
		if s.from == e.from {
			mine += int64(len(s.body))
		}
	}
	drop := func(i int) {
		total -= int64(len(r.stash[i].body))
		if r.stash[i].from == e.from {
			mine -= int64(len(r.stash[i].body))
		}
		r.stash = append(r.stash[:i], r.stash[i+1:]...)
	}
	for i := 0; i < len(r.stash) && mine+size > share; {
		if r.stash[i].from == e.from {
			drop(i)
			continue
		}
		i++
	}
	for len(r.stash) > 0 && (len(r.stash) >= maxStash || total+size > r.cfg.MaxStashBytes) {
		drop(0)
	}
	r.stash = append(r.stash, e)
}

// stashBytes is the bytes the stash holds.
func (r *Ring) stashBytes() (total int64, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.stash {
		total += int64(len(s.body))
	}
	return total, len(r.stash)
}

// abandon records that from has left its ring gh of round and drops its
// stashed messages for that ring.
func (r *Ring) abandon(from PeerID, gh, round uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.abandoned == nil {
		r.abandoned = map[ringKey]abandonment{}
	}
	if len(r.abandoned) >= maxAbandoned {
		oldest := round
		for _, a := range r.abandoned {
			oldest = min(oldest, a.round)
		}
		for k, a := range r.abandoned {
			if a.round == oldest {
				delete(r.abandoned, k)
			}
		}
	}
	r.abandoned[ringKey{from, gh}] = abandonment{round: round, at: time.Now()}
	keep := r.stash[:0]
	for _, e := range r.stash {
		if !r.voidLocked(e) {
			keep = append(keep, e)
		}
	}
	r.stash = keep
}

// voidLocked reports whether e is a reduce or gather message of a ring its
// sender abandoned after sending it.
func (r *Ring) voidLocked(e envelope) bool {
	if e.h.kind != kindReduce && e.h.kind != kindGather {
		return false
	}
	a, ok := r.abandoned[ringKey{e.from, e.h.group}]
	return ok && e.at.Before(a.at)
}

// awaitResult is used by a member the others excluded: it asks the group
// for the finished result until one arrives. It gives up (ErrExcluded, so
// the caller re-syncs from a member's state) when every other member has
// left, is waiting for the result too, or answers that it no longer holds
// it. It asks again at least every few MinDeadlines, so a lost query or
// answer, or a member leaving, costs seconds rather than a whole deadline.
func (r *Ring) awaitResult(ctx context.Context, round uint64, group []PeerID, out []float32, st *RoundStats) ([][]byte, error) {
	r.mu.Lock()
	wait := min(r.hop.deadline(r.cfg.InitialDeadline, r.cfg.MinDeadline, r.cfg.MaxDeadline), 4*r.cfg.MinDeadline)
	r.mu.Unlock()
	began := time.Now()
	give := began.Add(r.cfg.MaxDeadline)
	gone := map[PeerID]bool{}
	for time.Now().Before(give) {
		others, unable := 0, 0
		r.mu.Lock()
		for _, p := range r.peers.Members() {
			if p != r.peers.Self() && slices.Contains(group, p) {
				others++
				if r.queried[round][p].After(began) || gone[p] {
					unable++
				}
			}
		}
		r.mu.Unlock()
		if others == 0 || unable == others {
			// Everyone who could hold the result has gone, is waiting for
			// it too (members that excluded each other), or has dropped it:
			// nobody will send it.
			break
		}
		r.broadcast(ctx, group, header{kind: kindQuery, round: round, step: queryWaiting}, nil, st)
		timer := time.NewTimer(wait)
	loop:
		for {
			select {
			case <-ctx.Done():
				timer.Stop()
				return nil, ctx.Err()
			case <-timer.C:
				break loop
			case e := <-r.inbox:
				switch {
				case e.h.round == round && e.h.kind == kindDone && slices.Contains(group, e.from):
					chunks, err := r.doneChunks(e)
					if err != nil {
						continue
					}
					timer.Stop()
					return chunks, r.decodeAll(chunks, out)
				case e.h.round == round && e.h.kind == kindGone && slices.Contains(group, e.from):
					gone[e.from] = true
					timer.Stop()
					break loop
				case e.h.round >= round && e.h.kind != kindDone && e.h.kind != kindGone && e.h.kind != kindQuery:
					// Another attempt of this round (the others retrying
					// without us, or with a newer view) or a later round:
					// kept for the caller's retry, as attempt does.
					r.mu.Lock()
					r.stashLocked(e)
					r.mu.Unlock()
				}
			}
		}
	}
	return nil, fmt.Errorf("%w: round %d", ErrExcluded, round)
}
