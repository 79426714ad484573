package optimizer

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/transport"
)

// NoLoCoConfig holds the NoLoCo outer optimizer's settings (ALGORITHMS.md 2).
type NoLoCoConfig struct {
	OuterLR   float64 // eta, default 0.7
	Momentum  float64 // beta, default 0.5
	Gamma     float64 // pull towards the group's mean weights; the reference code uses eta
	GroupSize int     // g, default 2
	// PhiCodec encodes the slow weights, DeltaCodec the outer gradients.
	PhiCodec, DeltaCodec compression.Config
	// Deadlines for a partner's message, adaptive as in RingConfig.
	InitialDeadline, MinDeadline, MaxDeadline time.Duration
	MaxAbs                                    float32
	// ClipFactor bounds the norm of a partner's outer gradient, and
	// PhiClip the distance of its phi to this member's phi, to that many
	// times a running median (noloco_clip.go).
	ClipFactor, PhiClip float64
	// MaxStashBytes bounds the partners' messages kept for steps not run
	// yet (a quarter of it per sender, half of it for steps beyond the next
	// two); NewNoLoCo raises it to 8 messages of the model's largest size.
	MaxStashBytes int64
	OnReject      func(from transport.PeerID, err error)
	Logger        *slog.Logger
	// PeerStep, if set, tells the next step a peer says it will run (for
	// example gossiped in membership metadata), math.MaxUint64 for a peer
	// known to be gone. A partner past the step being waited for has
	// finished it and will send nothing more for it: OuterStep waits for it
	// at most MinDeadline longer (its message may still be in flight), not
	// a whole deadline, which for a newcomer is the long InitialDeadline.
	// (Members' views of the group differ for a moment when one joins.)
	PeerStep func(transport.PeerID) uint64
}

// DefaultNoLoCo returns the paper's defaults: g = 2, eta = gamma = 0.7,
// beta = 0.5, slow weights in bf16 and outer gradients in int8; and
// Skein's bounds on a partner (noloco_clip.go).
func DefaultNoLoCo() NoLoCoConfig {
	phi := compression.DefaultConfig()
	phi.Codec, phi.ZstdLevel = compression.BF16, 0
	d := compression.DefaultConfig()
	d.Codec, d.ZstdLevel = compression.Int8, 0
	return NoLoCoConfig{OuterLR: 0.7, Momentum: 0.5, Gamma: 0.7, GroupSize: 2, PhiCodec: phi, DeltaCodec: d,
		InitialDeadline: 2 * time.Minute, MinDeadline: 2 * time.Second, MaxDeadline: 10 * time.Minute, MaxAbs: 1e4,
		ClipFactor: 2, PhiClip: 1.5, MaxStashBytes: DefaultMaxStashBytes}
}

// Validate names the first invalid field.
func (c NoLoCoConfig) Validate() error {
	switch {
	case !(c.OuterLR > 0):
		return fmt.Errorf("%w: outer lr %v must be positive", ErrConfig, c.OuterLR)
	case c.Momentum < 0 || c.Momentum >= 1:
		return fmt.Errorf("%w: momentum %v must be in [0, 1)", ErrConfig, c.Momentum)
	case c.Gamma < 0:
		return fmt.Errorf("%w: gamma %v must be >= 0", ErrConfig, c.Gamma)
	case c.GroupSize < 2 || c.GroupSize > maxGroup:
		return fmt.Errorf("%w: group size %d must be in [2, %d]", ErrConfig, c.GroupSize, maxGroup)
	case c.InitialDeadline <= 0 || c.MinDeadline <= 0 || c.MaxDeadline < c.MinDeadline:
		return fmt.Errorf("%w: deadlines initial %v, min %v, max %v", ErrConfig, c.InitialDeadline, c.MinDeadline, c.MaxDeadline)
	case !(c.MaxAbs > 0):
		return fmt.Errorf("%w: max abs %v must be positive", ErrConfig, c.MaxAbs)
	case !(c.ClipFactor >= 1 && c.ClipFactor <= 1e6) || !(c.PhiClip >= 1 && c.PhiClip <= 1e6):
		return fmt.Errorf("%w: clip factors %g and %g must be in [1, 1e6]", ErrConfig, c.ClipFactor, c.PhiClip)
	case c.MaxStashBytes <= 0:
		return fmt.Errorf("%w: max stash bytes %d must be positive", ErrConfig, c.MaxStashBytes)
	}
	if err := c.PhiCodec.Validate(); err != nil {
		return err
	}
	return c.DeltaCodec.Validate()
}

// NoLoCoGroups returns the groups of outer step `step` over the sorted
// members: pi = permutation(M, seed=step+1), n = M/g groups, group k holds
// pi[k], pi[k+n], ... Every member computes the same groups without a
// coordinator.
func NoLoCoGroups(members []transport.PeerID, step uint64, g int) [][]transport.PeerID {
	sorted := sortedGroup(members)
	M := len(sorted)
	perm := make([]int, M)
	for i := range perm {
		perm[i] = i
	}
	rng := rand.New(rand.NewPCG(step+1, 0x6e6f6c6f636f))
	rng.Shuffle(M, func(i, j int) { perm[i], perm[j] = perm[j], perm[i] })
	n := max(M/g, 1)
	groups := make([][]transport.PeerID, n)
	for i, p := range perm {
		groups[i%n] = append(groups[i%n], sorted[p])
	}
	return groups
}

// NoLoCoUpdate applies the NoLoCo outer step in place (heavy-ball form of
// the reference code):
//
//	delta = beta*delta + eta*Dbar + gamma*(phibar - phi)
//	phi   = phi + delta
func NoLoCoUpdate(phi, delta, phibar, dbar []float32, eta, beta, gamma float32) {
	for i := range phi {
		d := float32(beta*delta[i]) + float32(eta*dbar[i]) + float32(gamma*float32(phibar[i]-phi[i]))
		delta[i] = d
		phi[i] += d
	}
}

// GossipStats describes one NoLoCo outer step.
type GossipStats struct {
	Step      uint64
	Group     []transport.PeerID // the planned group
	Heard     []transport.PeerID // partners whose contribution was used
	Clipped   []transport.PeerID // those of them clipped (clipPartner)
	BytesSent int64
	BytesRecv int64
	Duration  time.Duration
}

// NoLoCo is one member's NoLoCo state: its own slow weights phi and outer
// momentum. No collective: each outer step averages with a random group.
type NoLoCo struct {
	cfg   NoLoCoConfig
	peers transport.Peers
	log   *slog.Logger
	Phi   []float32
	Delta []float32
	Step  uint64

	encPhi, encD *compression.Encoder
	dec          *compression.Decoder
	phibar, dbar []float32
	own, tmp     []float32

	mu sync.Mutex
	// arrived holds, by step, the messages of that step's partners for
	// Step to Step+2, one per sender; ahead each partner's newest for a
	// later step: from a member this one is about to catch up with (a
	// joiner, or a member that fell behind, before it adopts a state).
	// Both within the byte budget (keep).
	arrived map[uint64][]envelope
	ahead   map[transport.PeerID]envelope
	maxBody int   // maxGossipBody of the model
	budget  int64 // MaxStashBytes, at least 8 messages of maxBody
	// norms and dists are the last normWindow own outer-gradient norms and
	// accepted partner distances (noloco_clip.go).
	norms, dists []float64
	notify       chan struct{}
	est          estimator
	cancel       context.CancelFunc
	wg           sync.WaitGroup
}

// NewNoLoCo starts from slow weights phi (copied) with zero momentum and
// starts its background receiver, which runs until ctx ends or Close.
func NewNoLoCo(ctx context.Context, cfg NoLoCoConfig, peers transport.Peers, phi []float32) (*NoLoCo, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	encPhi, err := compression.NewEncoder(cfg.PhiCodec)
	if err != nil {
		return nil, err
	}
	encD, err := compression.NewEncoder(cfg.DeltaCodec)
	if err != nil {
		return nil, err
	}
	// The decoder refuses a frame declaring more elements than the model
	// before allocating anything for it.
	dc := cfg.DeltaCodec
	dc.MaxElements = int64(len(phi))
	dec, err := compression.NewDecoder(dc)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	n := len(phi)
	nl := &NoLoCo{cfg: cfg, peers: peers, log: log, Phi: append([]float32(nil), phi...), Delta: make([]float32, n),
		encPhi: encPhi, encD: encD, dec: dec, phibar: make([]float32, n), dbar: make([]float32, n),
		own: make([]float32, n), tmp: make([]float32, n), arrived: map[uint64][]envelope{}, ahead: map[transport.PeerID]envelope{},
		maxBody: maxGossipBody(n), budget: max(cfg.MaxStashBytes, 8*int64(maxGossipBody(n))), notify: make(chan struct{}, 1)}
	ctx, nl.cancel = context.WithCancel(ctx)
	nl.wg.Add(1)
	go func() {
		defer nl.wg.Done()
		nl.receive(ctx)
	}()
	return nl, nil
}

// Close stops the receiver.
func (nl *NoLoCo) Close() {
	nl.cancel()
	nl.wg.Wait()
	nl.encPhi.Close()
	nl.encD.Close()
	nl.dec.Close()
}

// State returns copies of this member's state: the next outer step to run,
// phi and the outer momentum delta. It is what a joiner adopts and what a
// checkpoint keeps; call it between outer steps.
func (nl *NoLoCo) State() (step uint64, phi, delta []float32) {
	nl.mu.Lock()
	step = nl.Step
	nl.mu.Unlock()
	return step, slices.Clone(nl.Phi), slices.Clone(nl.Delta)
}

// SetState installs a state (copied): a member's, adopted by a joiner or a
// member that fell behind, or a checkpoint's. The next OuterStep runs step;
// messages kept for earlier steps are dropped. Call it between outer steps.
func (nl *NoLoCo) SetState(step uint64, phi, delta []float32) error {
	if len(phi) != len(nl.Phi) || len(delta) != len(nl.Delta) {
		return fmt.Errorf("%w: state of %d/%d elements, want %d", ErrRejected, len(phi), len(delta), len(nl.Phi))
	}
	if err := checkFinite(phi, math.MaxFloat32); err != nil {
		return err
	}
	if err := checkFinite(delta, math.MaxFloat32); err != nil {
		return err
	}
	copy(nl.Phi, phi)
	copy(nl.Delta, delta)
	nl.mu.Lock()
	nl.advance(step)
	nl.mu.Unlock()
	return nil
}

// advance sets Step, drops the messages of other steps than Step to
// Step+2 and moves those kept ahead into that window. nl.mu is held.
func (nl *NoLoCo) advance(step uint64) {
	nl.Step = step
	for s := range nl.arrived {
		if s < step || s > step+2 {
			delete(nl.arrived, s)
		}
	}
	for from, e := range nl.ahead {
		switch r := e.h.round; {
		case r < step:
			delete(nl.ahead, from)
		case r <= step+2:
			delete(nl.ahead, from)
			if !slices.ContainsFunc(nl.arrived[r], func(e envelope) bool { return e.from == from }) {
				nl.arrived[r] = append(nl.arrived[r], e)
			}
		}
	}
}

// maxGossipBody bounds a gossip body for n parameters: both frames in fp32
// plus framing (chunk headers, zstd's block headers).
func maxGossipBody(n int) int { return 8*n + n/64 + 1<<16 }

// groupAt is this member's group at step, by the members it sees now.
func (nl *NoLoCo) groupAt(step uint64) []transport.PeerID {
	self := nl.peers.Self()
	for _, g := range NoLoCoGroups(nl.peers.Members(), step, nl.cfg.GroupSize) {
		if slices.Contains(g, self) {
			return g
		}
	}
	return nil
}

// keep stores a partner's message: one per sender for the current step and
// the next two (partners that finished their inner phase earlier), and one
// per sender, its newest, for any later step. It is dropped when the bytes
// kept would pass the budget, a quarter of it for one sender or half of it
// for steps beyond the next two, so memory stays bounded whatever any
// number of members send (the partners of one step are at most 2g-1).
// It says whether it kept e. nl.mu is held.
func (nl *NoLoCo) keep(e envelope) bool {
	r := e.h.round
	old, hasOld := nl.ahead[e.from]
	switch {
	case r < nl.Step:
		return false
	case r <= nl.Step+2:
		if slices.ContainsFunc(nl.arrived[r], func(k envelope) bool { return k.from == e.from }) {
			return false
		}
	case hasOld && old.h.round >= r:
		return false
	}
	var total, mine, later int64
	count := func(k envelope) {
		n := int64(len(k.body))
		total += n
		if k.from == e.from {
			mine += n
		}
		if k.h.round > nl.Step+2 {
			later += n
		}
	}
	for _, es := range nl.arrived {
		for _, k := range es {
			count(k)
		}
	}
	for from, k := range nl.ahead {
		if from != e.from || r <= nl.Step+2 { // a later one replaces e.from's
			count(k)
		}
	}
	n := int64(len(e.body))
	if total+n > nl.budget || mine+n > nl.budget/4 || (r > nl.Step+2 && later+n > nl.budget/2) {
		nl.log.Debug("gossip byte budget spent; dropped a message", "peer", e.from, "step", r)
		return false
	}
	if r <= nl.Step+2 {
		nl.arrived[r] = append(nl.arrived[r], e)
	} else {
		nl.ahead[e.from] = e
	}
	return true
}

func (nl *NoLoCo) receive(ctx context.Context) {
	for {
		m, err := nl.peers.Recv(ctx)
		if err != nil {
			return
		}
		if nl.offer(m.From, m.Payload) {
			select {
			case nl.notify <- struct{}{}:
			default:
			}
		}
	}
}

// offer checks a received message and keeps it if it is a partner's, and
// says whether it did. Only partners' weights are averaged: a message is
// kept only from a member of this member's group at the message's step.
func (nl *NoLoCo) offer(from transport.PeerID, payload []byte) bool {
	h, body, err := parseMessage(payload)
	switch {
	case err != nil:
	case h.kind != kindGossip:
		err = fmt.Errorf("%w: %s message in a NoLoCo swarm", ErrBadMessage, h.kind)
	case len(body) > nl.maxBody:
		err = fmt.Errorf("%w: gossip body of %d bytes, at most %d for this model", ErrBadMessage, len(body), nl.maxBody)
	}
	if err != nil {
		nl.reject(from, err)
		return false
	}
	if !slices.Contains(nl.groupAt(h.round), from) {
		return false
	}
	nl.mu.Lock()
	defer nl.mu.Unlock()
	return nl.keep(envelope{from: from, h: h, body: body, at: time.Now()})
}

func (nl *NoLoCo) reject(from transport.PeerID, err error) {
	nl.log.Warn("dropped contribution", "peer", from, "err", err)
	if nl.cfg.OnReject != nil {
		nl.cfg.OnReject(from, err)
	}
}

// OuterStep exchanges phi and D = theta - phi with this step's group, waits
// for the partners up to the adaptive deadline, applies the NoLoCo update
// with whatever arrived, and resets theta to the new phi. A missing partner
// is not an error.
func (nl *NoLoCo) OuterStep(ctx context.Context, theta []float32) (GossipStats, error) {
	began := time.Now()
	nl.mu.Lock()
	st := GossipStats{Step: nl.Step}
	nl.mu.Unlock()
	if len(theta) != len(nl.Phi) {
		return st, fmt.Errorf("optimizer: %d local parameters, phi has %d", len(theta), len(nl.Phi))
	}
	for i := range theta {
		nl.own[i] = theta[i] - nl.Phi[i]
	}
	if err := checkFinite(nl.own, nl.cfg.MaxAbs); err != nil {
		return st, fmt.Errorf("own outer gradient: %w", err)
	}
	ref := nl.observeNorm(l2(nl.own))
	self := nl.peers.Self()
	group := nl.groupAt(nl.Step)
	if group == nil {
		return st, fmt.Errorf("%w: %s", ErrNotMember, self)
	}
	st.Group = group
	body, err := nl.encodeBody()
	if err != nil {
		return st, err
	}
	msg := appendMessage(nil, header{kind: kindGossip, round: nl.Step}, body)
	for _, p := range group {
		if p != self {
			if err := nl.peers.Send(ctx, p, msg); err != nil {
				nl.log.Debug("gossip send", "peer", p, "err", err)
				continue
			}
			st.BytesSent += int64(len(msg))
		}
	}
	copy(nl.phibar, nl.Phi)
	copy(nl.dbar, nl.own)
	count := 1
	heard := map[transport.PeerID]bool{self: true}
	deadline := nl.est.deadline(nl.cfg.InitialDeadline, nl.cfg.MinDeadline, nl.cfg.MaxDeadline)
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	var poll <-chan time.Time
	if nl.cfg.PeerStep != nil {
		t := time.NewTicker(max(nl.cfg.MinDeadline/4, 10*time.Millisecond))
		defer t.Stop()
		poll = t.C
	}
	movedOn := map[transport.PeerID]time.Time{} // when a partner was first seen past this step
wait:
	for len(heard) < len(group) {
		nl.mu.Lock()
		msgs := nl.arrived[nl.Step]
		delete(nl.arrived, nl.Step)
		nl.mu.Unlock()
		for _, e := range msgs {
			if heard[e.from] || !slices.Contains(group, e.from) {
				continue
			}
			st.BytesRecv += int64(len(e.body) + headerLen)
			// own was added to dbar: its buffer takes the partner's.
			if err := decodeGossip(nl.dec, e.body, nl.tmp, nl.own, nl.cfg.MaxAbs); err != nil {
				nl.reject(e.from, err)
				heard[e.from] = true // do not wait for it again
				continue
			}
			if nl.clipPartner(nl.tmp, nl.own, ref) {
				st.Clipped = append(st.Clipped, e.from)
				nl.log.Info("clipped a partner's contribution", "step", nl.Step, "peer", e.from)
			}
			for i := range nl.phibar {
				nl.phibar[i] += nl.tmp[i]
				nl.dbar[i] += nl.own[i]
			}
			heard[e.from] = true
			st.Heard = append(st.Heard, e.from)
			count++
			nl.est.observe(time.Since(began))
		}
		if len(heard) == len(group) {
			break
		}
		select {
		case <-nl.notify:
		case now := <-poll:
			for _, p := range group {
				if heard[p] || nl.cfg.PeerStep(p) <= nl.Step {
					continue
				}
				if at, ok := movedOn[p]; !ok {
					movedOn[p] = now
				} else if now.Sub(at) >= nl.cfg.MinDeadline {
					nl.log.Info("partner is past this step; not waiting for it", "step", nl.Step, "peer", p)
					heard[p] = true
				}
			}
		case <-timer.C:
			nl.log.Info("partners missing; updating with what arrived", "step", nl.Step, "heard", len(heard)-1, "group", len(group)-1)
			break wait
		case <-ctx.Done():
			return st, ctx.Err()
		}
	}
	inv := 1 / float32(count)
	for i := range nl.phibar {
		nl.phibar[i] *= inv
		nl.dbar[i] *= inv
	}
	NoLoCoUpdate(nl.Phi, nl.Delta, nl.phibar, nl.dbar, float32(nl.cfg.OuterLR), float32(nl.cfg.Momentum), float32(nl.cfg.Gamma))
	copy(theta, nl.Phi)
	nl.mu.Lock()
	nl.advance(nl.Step + 1)
	nl.mu.Unlock()
	st.Duration = time.Since(began)
	return st, nil
}

// The gossip body: 4-byte length of the phi frame, the phi frame, then the
// outer-gradient frame.
func (nl *NoLoCo) encodeBody() ([]byte, error) {
	body := make([]byte, 4, 4+len(nl.Phi)*3)
	body, err := nl.encPhi.Append(body, nl.Phi, nl.Step)
	if err != nil {
		return nil, err
	}
	binary.LittleEndian.PutUint32(body, uint32(len(body)-4))
	return nl.encD.Append(body, nl.own, nl.Step)
}

// decodeGossip decodes a gossip body into phi and d, each the model's
// size. dec refuses frames declaring more elements than that (NewNoLoCo
// builds it with MaxElements the model's size), so a frame allocates
// nothing whatever it declares. Every value must be within maxAbs.
func decodeGossip(dec *compression.Decoder, body []byte, phi, d []float32, maxAbs float32) error {
	if len(body) < 4 {
		return fmt.Errorf("%w: gossip body of %d bytes", ErrBadMessage, len(body))
	}
	n := binary.LittleEndian.Uint32(body)
	if uint64(n) > uint64(len(body)-4) {
		return fmt.Errorf("%w: phi frame of %d bytes, %d present", ErrBadMessage, n, len(body)-4)
	}
	for _, f := range []struct {
		name  string
		frame []byte
		dst   []float32
	}{{"phi", body[4 : 4+n], phi}, {"outer gradient", body[4+n:], d}} {
		got, err := dec.DecodeBytes(f.frame, f.dst)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrRejected, f.name, err)
		}
		if len(got) != len(f.dst) {
			return fmt.Errorf("%w: %s of %d elements, want %d", ErrRejected, f.name, len(got), len(f.dst))
		}
		if err := checkFinite(f.dst, maxAbs); err != nil { // beyond maxAbs would overflow the mean
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return nil
}
