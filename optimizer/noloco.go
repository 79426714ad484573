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
	OnReject                                  func(from transport.PeerID, err error)
	Logger                                    *slog.Logger
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
// beta = 0.5, slow weights in bf16 and outer gradients in int8.
func DefaultNoLoCo() NoLoCoConfig {
	phi := compression.DefaultConfig()
	phi.Codec, phi.ZstdLevel = compression.BF16, 0
	d := compression.DefaultConfig()
	d.Codec, d.ZstdLevel = compression.Int8, 0
	return NoLoCoConfig{OuterLR: 0.7, Momentum: 0.5, Gamma: 0.7, GroupSize: 2, PhiCodec: phi, DeltaCodec: d,
		InitialDeadline: 2 * time.Minute, MinDeadline: 2 * time.Second, MaxDeadline: 10 * time.Minute, MaxAbs: 1e4}
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

	mu      sync.Mutex
	arrived map[uint64][]envelope // by step, Step to Step+2
	// ahead holds each sender's newest message for a step beyond
	// Step+2: from a member this one is about to catch up with (a joiner,
	// or a member that fell behind, before it adopts a member's state).
	ahead  map[transport.PeerID]envelope
	notify chan struct{}
	est    estimator
	cancel context.CancelFunc
	wg     sync.WaitGroup
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
	dec, err := compression.NewDecoder(cfg.DeltaCodec)
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
		own: make([]float32, n), tmp: make([]float32, n), arrived: map[uint64][]envelope{}, ahead: map[transport.PeerID]envelope{}, notify: make(chan struct{}, 1)}
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

// maxAhead bounds the senders whose message from a later step is kept (a
// member about to catch up averages with at most maxGroup-1 partners):
// each message is as large as the model, so this bounds the memory a
// member far behind holds to maxAhead models, however many members there
// are.
const maxAhead = maxGroup

// dropOldestAhead forgets the kept message of the earliest step. nl.mu is
// held.
func (nl *NoLoCo) dropOldestAhead() {
	var from transport.PeerID
	oldest := uint64(math.MaxUint64)
	for f, e := range nl.ahead {
		if e.h.round < oldest {
			from, oldest = f, e.h.round
		}
	}
	delete(nl.ahead, from)
}

func (nl *NoLoCo) receive(ctx context.Context) {
	for {
		m, err := nl.peers.Recv(ctx)
		if err != nil {
			return
		}
		h, body, err := parseMessage(m.Payload)
		if err == nil && h.kind != kindGossip {
			err = fmt.Errorf("%w: %s message in a NoLoCo swarm", ErrBadMessage, h.kind)
		}
		if err != nil {
			nl.reject(m.From, err)
			continue
		}
		if !slices.Contains(nl.peers.Members(), m.From) {
			continue // only members' weights are averaged
		}
		nl.mu.Lock()
		// Keep one message per sender for the current step and the next
		// two (partners that finished their inner phase earlier), and one
		// per sender, its newest, for any later step (this member is
		// behind and will adopt a state at about that step), from at most
		// maxAhead senders: memory stays bounded whatever they send.
		e := envelope{from: m.From, h: h, body: body, at: time.Now()}
		switch {
		case h.round < nl.Step:
		case h.round <= nl.Step+2:
			if !slices.ContainsFunc(nl.arrived[h.round], func(e envelope) bool { return e.from == m.From }) {
				nl.arrived[h.round] = append(nl.arrived[h.round], e)
			}
		default:
			if old, ok := nl.ahead[m.From]; !ok || old.h.round < h.round {
				if !ok && len(nl.ahead) >= maxAhead {
					nl.dropOldestAhead()
				}
				nl.ahead[m.From] = e
			}
		}
		nl.mu.Unlock()
		select {
		case nl.notify <- struct{}{}:
		default:
		}
	}
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
	self := nl.peers.Self()
	var group []transport.PeerID
	for _, g := range NoLoCoGroups(nl.peers.Members(), nl.Step, nl.cfg.GroupSize) {
		if slices.Contains(g, self) {
			group = g
		}
	}
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
			if err := nl.decodeBody(e.body); err != nil {
				nl.reject(e.from, err)
				heard[e.from] = true // do not wait for it again
				continue
			}
			for i := range nl.phibar {
				nl.phibar[i] += nl.tmp[i]
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

// decodeBody decodes a partner's phi into tmp and adds its D to dbar.
func (nl *NoLoCo) decodeBody(body []byte) error {
	if len(body) < 4 {
		return fmt.Errorf("%w: gossip body of %d bytes", ErrBadMessage, len(body))
	}
	n := binary.LittleEndian.Uint32(body)
	if uint64(n) > uint64(len(body)-4) {
		return fmt.Errorf("%w: phi frame of %d bytes, %d present", ErrBadMessage, n, len(body)-4)
	}
	got, err := nl.dec.DecodeBytes(body[4:4+n], nl.tmp)
	if err != nil || len(got) != len(nl.tmp) {
		return fmt.Errorf("%w: phi: %d elements, %v", ErrRejected, len(got), err)
	}
	if err := checkFinite(nl.tmp, nl.cfg.MaxAbs); err != nil { // weights beyond MaxAbs would overflow the mean
		return err
	}
	d := nl.own // reuse: own was already added to dbar
	got, err = nl.dec.DecodeBytes(body[4+n:], d)
	if err != nil || len(got) != len(d) {
		return fmt.Errorf("%w: outer gradient: %d elements, %v", ErrRejected, len(got), err)
	}
	if err := checkFinite(d, nl.cfg.MaxAbs); err != nil {
		return err
	}
	for i := range d {
		nl.dbar[i] += d[i]
	}
	return nil
}
