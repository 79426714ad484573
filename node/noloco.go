package node

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/transport"
)

// The NoLoCo side of a volunteer (ALGORITHMS.md 2): every member trains H
// inner steps, then averages its slow weights phi and outer gradient with a
// small group drawn from the step number (p2p.ProtoGossip) and takes its own
// outer step. There is no collective, so the members' weights differ by
// design and there is no run state to agree on (rounds are reported with
// state hash 0), only a clock: the members must run the same step to find
// their group. Each gossips its step in its membership metadata (Meta.Round:
// the next step it will run). A joiner, a restarted member behind the
// others, and a member that fell more than one step behind catch up
// (nolocoCatchUp): to the step a majority of the others has reached, with
// the coordinate-wise median of several members' states (step, phi,
// momentum; the bulk key and format of DiLoCo's shared state).

// nolocoState is the NoLoCo side of a volunteer: its outerLoop.
type nolocoState struct {
	v   *Volunteer
	opt *optimizer.NoLoCo
}

// initNoLoCo builds the NoLoCo side of a volunteer: the gossip over
// p2p.ProtoGossip, the optimizer (resumed from the local checkpoint if
// there is one) and what it serves to joiners.
func (v *Volunteer) initNoLoCo() (err error) {
	// One message carries phi and the outer gradient, each at most fp32.
	maxMsg := uint32(min(stateSize(v.n)+1<<20, 1<<30))
	if v.peers, err = p2p.NewPeers(v.pn, p2p.ProtoGossip, maxMsg, 60*time.Second); err != nil {
		return err
	}
	cfg := nolocoConfig(v.run, v.cfg.Collective)
	if cfg.Logger == nil {
		cfg.Logger = v.log
	}
	cfg.PeerStep = func(p transport.PeerID) uint64 { return announcedStep(v.pn, p) }
	cfg.Hostile = nolocoHostile(v.cfg.Hostile)
	// The receiver outlives Run's ctx; Close stops it.
	opt, err := optimizer.NewNoLoCo(context.Background(), cfg, v.peers, v.theta)
	if err != nil {
		return err
	}
	s := &nolocoState{v: v, opt: opt}
	v.outer = s
	if v.resumeLocal(opt) {
		s.setWeights()
		say(v.cfg.Progress, "resumed local checkpoint at round %d", opt.Step)
	}
	v.serve(opt.State())
	return nil
}

// nolocoConfig is the run's NoLoCo: the manifest's outer settings, its wire
// codec for the outer gradient as in DiLoCo, and the volunteer's
// deadlines and bounds. phi, the weights themselves, stays bf16 whatever
// the codec (8 bits would blur the weights, not a difference of them), or
// fp32 when the run asks for lossless fp32 on the wire.
func nolocoConfig(m manifest.Manifest, ring CollectiveConfig) optimizer.NoLoCoConfig {
	c := optimizer.DefaultNoLoCo()
	o := m.Optimizer
	c.OuterLR, c.Momentum, c.Gamma, c.GroupSize = o.OuterLR, o.OuterMomentum, o.Gamma, o.GroupSize
	c.DeltaCodec = m.WireCodec(c.DeltaCodec)
	if m.Codec() == compression.FP32 {
		c.PhiCodec.Codec = compression.FP32
	}
	c.InitialDeadline, c.MinDeadline, c.MaxDeadline = ring.InitialDeadline, ring.MinDeadline, ring.MaxDeadline
	c.MaxAbs, c.MaxStashBytes, c.OnReject, c.Logger = ring.MaxAbs, ring.MaxStashBytes, ring.OnReject, ring.Logger
	return c
}

// start catches up with the run (the median of members' states, when a
// majority is ahead) and installs the state to train from.
func (s *nolocoState) start(ctx context.Context) {
	v, o := s.v, s.opt
	switch ok, err := s.catchUp(ctx, 0); {
	case err != nil:
		v.log.Warn("could not fetch a member's state; starting from the local one", "err", err)
		say(v.cfg.Progress, "could not take a member's state (%v); starting from this volunteer's own, round %d", err, o.Step)
	case ok:
		say(v.cfg.Progress, "caught up with the run: took the median of members' states at round %d", o.Step)
	}
	s.install(ctx)
}

// contribute exchanges the phase's outer gradient and phi with this step's
// group and takes the outer step; or, when this member fell behind, takes
// the run's state instead.
func (s *nolocoState) contribute(ctx context.Context, ph phase) error {
	v, o := s.v, s.opt
	// Fell behind (slow, or paused): the others run a step at least two
	// ahead, so this member's partners have moved on. Take the run's state
	// instead of offering a stale outer gradient.
	before := o.Step
	switch ok, err := s.catchUp(ctx, 1); {
	case err != nil:
		v.log.Warn("behind the run, but could not fetch a member's state", "round", before, "err", err)
	case ok:
		say(v.cfg.Progress, "behind the run: jumped from round %d to %d", before, o.Step)
		s.adopted(ctx, ph)
		return nil
	}
	v.su.Dev.CopyOut(v.theta, v.su.Stage.Params)
	st, err := o.OuterStep(ctx, v.theta)
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		// Not a missing partner (OuterStep goes on with whoever arrived)
		// but a local failure, such as a diverged inner phase: drop the
		// phase and keep the run's clock.
		v.log.Warn("outer step failed; going on from phi", "round", before, "err", err)
		say(v.cfg.Progress, "round %d: outer step failed (%v); going on from the last slow weights", before+1, err)
		if err := o.SetState(before+1, o.Phi, o.Delta); err != nil {
			return err
		}
		s.install(ctx)
		return nil
	}
	s.install(ctx)
	v.lastReported = o.Step
	averaged := append([]transport.PeerID{v.peers.Self()}, st.Heard...)
	rep := RoundReport{Round: o.Step, Loss: ph.meanLoss(), Members: len(v.peers.Members()),
		Stats: optimizer.RoundStats{Round: o.Step, Group: averaged, Attempts: 1,
			BytesSent: st.BytesSent, BytesRecv: st.BytesRecv, Duration: st.Duration}}
	v.report(rep, ph, len(averaged))
	return nil
}

// setWeights makes phi the stage's weights.
func (s *nolocoState) setWeights() {
	v := s.v
	copy(v.theta, s.opt.Phi)
	v.su.Dev.CopyIn(v.su.Stage.Params, v.theta)
}

// install makes phi the stage's weights and the state what this member
// serves to joiners, and announces the step.
func (s *nolocoState) install(ctx context.Context) {
	v := s.v
	s.setWeights()
	step, phi, mom := s.opt.State()
	if v.cfg.Hostile == HostileNoLoCoJump {
		step, phi, mom = nolocoJump(step, phi, mom)
	}
	v.serve(step, phi, mom)
	// Unlike DiLoCo's gossipRound, NoLoCo waits for the broadcast
	// (p2p.Node.UpdateMeta), as both did before session 10: a member behind
	// catches up from a majority's states at a step, which must still be
	// served when it asks, and without the wait the test's 4-step phases
	// (0.1-0.3 s) moved the others on before a lagging member could fetch
	// them (TestNoLoCoVolunteers failed once in CI).
	if err := v.pn.UpdateMeta(ctx, func(m *p2p.Meta) { m.Round, m.StateHash = step, 0 }); err != nil {
		v.log.Debug("announcing step", "step", step, "err", err)
	}
}

// nolocoJumpAhead is how far ahead of its step HostileNoLoCoJump announces.
const nolocoJumpAhead = 1000

// nolocoJump is HostileNoLoCoJump's lie about its state (step, phi,
// momentum), which it announces and serves instead: nolocoJumpAhead steps
// ahead, with phi + 1 per element (phi changed in place; the momentum its
// own). It trains and gossips with its partners at its true step: only
// joiners and members catching up (nolocoCatchUp) would follow the lie.
func nolocoJump(step uint64, phi, mom []float32) (uint64, []float32, []float32) {
	for i := range phi {
		phi[i]++
	}
	return step + nolocoJumpAhead, phi, mom
}

// nolocoHostile is the hostile mode that the NoLoCo optimizer plays itself
// (optimizer.NoLoCoConfig.Hostile): the lies in what a member sends its
// partners; "" for the volunteer's own modes.
func nolocoHostile(mode string) string {
	if slices.Contains(optimizer.NoLoCoHostileModes, mode) {
		return mode
	}
	return ""
}

// adopted installs a member's state just taken and reports it; the inner
// steps since the last outer step are dropped.
func (s *nolocoState) adopted(ctx context.Context, ph phase) {
	v := s.v
	s.install(ctx)
	if s.opt.Step == v.lastReported {
		return
	}
	v.lastReported = s.opt.Step
	v.report(RoundReport{Round: s.opt.Step, Loss: ph.meanLoss(), Members: len(v.peers.Members()), Adopted: true}, ph, 0)
}

// catchUp catches up with the run (nolocoCatchUp) when it is more than
// slack steps ahead of this member, and reports whether it did.
func (s *nolocoState) catchUp(ctx context.Context, slack uint64) (bool, error) {
	v := s.v
	return nolocoCatchUp(ctx, v.pn, v.log, s.opt, s.opt.Step, slack, v.n, v.cfg.Progress)
}

// NoLoCo has no shared state to certify, so a member catching up trusts no
// single member, neither for the step nor for the weights:
//   - it jumps only when a strict majority of the other volunteers that
//     announce a step, and at least nolocoQuorum of them, announce a later
//     step than its own plus slack, and only to the latest step that such a
//     majority has reached and at least nolocoQuorum members announce
//     (up to nolocoLead steps more: the states it could take;
//     catchUpTarget). A minority announcing far steps moves nobody: the
//     target is never beyond the step of an honest member while the
//     hostile ones are fewer than the quorum, and a far step counts
//     towards no target that only one member could serve (one honest
//     member two steps ahead and one announcing a far step made every
//     member behind the first fetch a state each step and drop it).
//   - it adopts the coordinate-wise median (optimizer.TrimmedMean, trimming
//     (k-1)/2) of the states of up to nolocoSources members that announce
//     the target or at most nolocoLead steps more (members move on while one
//     downloads); a state served for another step is refused, and fewer than
//     nolocoQuorum states are no state. One hostile state among three moves
//     no coordinate outside the honest ones' range.
//
// With a single other volunteer there is no majority to follow: a member
// of a two-member run that fell behind trains on from its own state.
const (
	nolocoQuorum  = 2
	nolocoSources = 3
	nolocoLead    = 2
)

// catchUpTarget returns the latest step that a strict majority (and at
// least nolocoQuorum) of steps, the steps the other volunteers announce,
// has reached and that at least nolocoQuorum of them announce (or at most
// nolocoLead steps more), and whether it lies beyond own+slack.
func catchUpTarget(own, slack uint64, steps []uint64) (uint64, bool) {
	q := max(nolocoQuorum, len(steps)/2+1)
	if len(steps) < q {
		return 0, false
	}
	sorted := slices.Sorted(slices.Values(steps))
	// Each candidate is reached by at least q of steps, the first by
	// exactly q.
	for i := len(sorted) - q; i >= 0; i-- {
		target := sorted[i]
		served := 0
		for _, s := range sorted[i:] {
			if s <= target+nolocoLead {
				served++
			}
		}
		if served >= nolocoQuorum {
			return target, target > own+slack
		}
	}
	return 0, false
}

// nolocoCatchUp moves st, at step own, to the run's step with the median of
// several members' states when the run is more than slack steps ahead, and
// reports whether it did.
func nolocoCatchUp(ctx context.Context, pn *p2p.Node, log *slog.Logger, st outerState, own, slack uint64, n int, progress io.Writer) (bool, error) {
	var steps []uint64
	var cands []p2p.Member
	for _, m := range pn.Members() {
		if m.Meta.Role == p2p.RoleVolunteer && m.ID != pn.ID() {
			steps = append(steps, m.Meta.Round)
			cands = append(cands, m)
		}
	}
	target, ok := catchUpTarget(own, slack, steps)
	if !ok {
		return false, nil
	}
	// The members nearest the target first.
	cands = slices.DeleteFunc(cands, func(m p2p.Member) bool { return m.Meta.Round < target || m.Meta.Round > target+nolocoLead })
	slices.SortFunc(cands, func(a, b p2p.Member) int {
		return cmp.Or(cmp.Compare(a.Meta.Round, b.Meta.Round), cmp.Compare(a.ID, b.ID))
	})
	var rounds []uint64
	var phis, moms [][]float32
	var from []transport.PeerID
	for _, m := range cands {
		if len(phis) == nolocoSources {
			break
		}
		id := transport.PeerID(m.ID.String())
		round, phi, mom, _, err := fetchVerifiedState(ctx, pn, log, n, target, 0, []transport.PeerID{id}, progress)
		if err == nil && round > target+nolocoLead {
			err = fmt.Errorf("%w: %s serves step %d, the run is at %d", ErrBadState, shortPeer(m.ID), round, target)
		}
		if err != nil {
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			log.Info("could not take a member's state", "peer", m.ID, "err", err)
			continue
		}
		rounds, phis, moms, from = append(rounds, round), append(phis, phi), append(moms, mom), append(from, id)
	}
	if len(phis) < nolocoQuorum {
		return false, fmt.Errorf("%w: %d member state(s) at step %d to %d, want %d", ErrBadState, len(phis), target, target+nolocoLead, nolocoQuorum)
	}
	t := (len(phis) - 1) / 2
	phi, mom := make([]float32, n), make([]float32, n)
	scratch := optimizer.TrimmedMean(phi, phis, t, nil)
	optimizer.TrimmedMean(mom, moms, t, scratch)
	slices.Sort(rounds)
	if err := st.SetState(rounds[(len(rounds)-1)/2], phi, mom); err != nil {
		return false, err
	}
	log.Info("adopted the median of members' states", "step", target, "from", from)
	return true, nil
}

func (s *nolocoState) state() outerState {
	if s.opt == nil {
		return nil
	}
	return s.opt
}

// finish does nothing: a NoLoCo step has no exchange left in flight
// between inner phases.
func (s *nolocoState) finish(phase) {}

func (s *nolocoState) close() {
	if s.opt != nil {
		s.opt.Close()
	}
}

func (s *nolocoState) round() uint64 {
	if s.opt == nil {
		return 0
	}
	return s.opt.Step
}

// announcedStep is the next step member p announces it will run;
// math.MaxUint64 when p is no longer a member.
func announcedStep(pn *p2p.Node, p transport.PeerID) uint64 {
	id, err := peer.Decode(string(p))
	if err != nil {
		return math.MaxUint64
	}
	m, ok := pn.Member(id)
	if !ok {
		return math.MaxUint64
	}
	return m.Meta.Round
}
