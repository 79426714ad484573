package optimizer

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
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
	// Hostile makes this member lie to its partners, for chaos tests only
	// (skein demo --chaos --hostile): one of NoLoCoHostileModes
	// (noloco_hostile.go), "" for an honest member.
	Hostile string
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
	case c.Hostile != "" && !slices.Contains(NoLoCoHostileModes, c.Hostile):
		return fmt.Errorf("%w: hostile %q (want one of %v)", ErrConfig, c.Hostile, NoLoCoHostileModes)
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
	Outliers  []transport.PeerID // those clipped from past outlierFactor times a bound: offenders
	BytesSent int64
	BytesRecv int64
	Duration  time.Duration
}

// NoLoCo is one member's NoLoCo state: its own slow weights phi and outer
// momentum. No collective: each outer step averages with a random group,
// the exchange run by a Gossip machine on a driver (driver.go).
type NoLoCo struct {
	cfg   NoLoCoConfig
	Phi   []float32
	Delta []float32
	Step  uint64
	own   []float32
	g     *Gossip
	d     *driver[GossipResult]
}

// NewNoLoCo starts from slow weights phi (copied) with zero momentum and
// starts its driver, which runs until ctx ends or Close.
func NewNoLoCo(ctx context.Context, cfg NoLoCoConfig, peers transport.Peers, phi []float32) (*NoLoCo, error) {
	g, err := NewGossip(cfg, peers.Self(), len(phi))
	if err != nil {
		return nil, err
	}
	if cfg.Hostile == HostileNoLoCoRollback {
		// The weights this member starts from, before any resumed or
		// adopted state: the run's initial weights (every member builds the
		// same from the manifest's seed).
		g.lie.initial = slices.Clone(phi)
	}
	sync := func() {
		g.SetMembers(peers.Members())
		for _, p := range g.Awaited() {
			if cfg.PeerStep != nil {
				g.Announce(p, cfg.PeerStep(p))
			}
		}
	}
	nl := &NoLoCo{cfg: cfg, Phi: slices.Clone(phi), Delta: make([]float32, len(phi)), own: make([]float32, len(phi)), g: g,
		d: newDriver[GossipResult](peers, g, cfg.tick(), cfg.Logger, cfg.OnReject, sync)}
	// A partner's message must find it in the group.
	nl.d.syncEach = true
	nl.d.start(ctx)
	return nl, nil
}

// Close stops the driver.
func (nl *NoLoCo) Close() {
	nl.d.close()
	nl.g.Close()
}

// State returns copies of this member's state: the next outer step to run,
// phi and the outer momentum delta. It is what a joiner adopts and what a
// checkpoint keeps; call it between outer steps.
func (nl *NoLoCo) State() (step uint64, phi, delta []float32) {
	return nl.Step, slices.Clone(nl.Phi), slices.Clone(nl.Delta)
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
	nl.Step = step
	nl.d.do(func() { nl.g.Advance(step) })
	return nil
}

// OuterStep exchanges phi and D = theta - phi with this step's group, waits
// for the partners up to the adaptive deadline, applies the NoLoCo update
// with whatever arrived, and resets theta to the new phi. A missing partner
// is not an error.
func (nl *NoLoCo) OuterStep(ctx context.Context, theta []float32) (GossipStats, error) {
	st := GossipStats{Step: nl.Step}
	if len(theta) != len(nl.Phi) {
		return st, fmt.Errorf("optimizer: %d local parameters, phi has %d", len(theta), len(nl.Phi))
	}
	for i := range theta {
		nl.own[i] = theta[i] - nl.Phi[i]
	}
	r := nl.d.call(ctx, func() error { return nl.g.Start(nl.Step, nl.Phi, nl.own) })
	if r.res != nil {
		st, r.err = r.res.GossipStats, cmp.Or(r.err, r.res.Err)
		st.Duration = r.took
	}
	if r.err != nil {
		return st, r.err
	}
	if log := nl.d.log; len(st.Outliers) > 0 {
		log.Warn("offender: a partner's phi or outer gradient lies far past the bounds; clipped", "step", st.Step, "peers", st.Outliers)
	} else if len(st.Clipped) > 0 {
		log.Info("clipped partners' contributions", "step", st.Step, "peers", st.Clipped)
	}
	if len(st.Heard) < len(st.Group)-1 {
		nl.d.log.Info("partners missing; updated with what arrived", "step", st.Step, "heard", len(st.Heard), "group", len(st.Group)-1)
	}
	NoLoCoUpdate(nl.Phi, nl.Delta, r.res.PhiBar, r.res.DBar, float32(nl.cfg.OuterLR), float32(nl.cfg.Momentum), float32(nl.cfg.Gamma))
	copy(theta, nl.Phi)
	nl.Step++
	return st, nil
}
