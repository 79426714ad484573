package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/replica"
	"github.com/skein-ml/skein/transport"
)

// The DiLoCo side of a volunteer: every member trains H inner steps, then
// all average their pseudo-gradients in the butterfly collective and take the
// same outer Nesterov step, so that every member holds the same shared
// state (round, phi, momentum) after each round. A member that falls
// behind, or ends a round with another state than the run's, downloads the
// run's state from the others (DESIGN.md, node).

// initDiLoCo builds the DiLoCo side of a volunteer: the collective over
// p2p.ProtoReduce, the shared state (resumed from the local checkpoint if
// there is one) and what it serves to joiners.
func (v *Volunteer) initDiLoCo() (err error) {
	v.outer = dilocoLoop{v} // set first: its close cleans up whatever started
	m := v.run
	maxMsg := uint32(min(stateSize(v.n)+1<<20, 1<<30))
	if v.peers, err = p2p.NewPeers(v.pn, p2p.ProtoReduce, maxMsg, 60*time.Second); err != nil {
		return err
	}
	// The butterfly collective (optimizer/butterfly.go): each round's group
	// agreed before it starts, every part aggregated by two owners with a
	// trimmed mean and cross-checked.
	rc := v.cfg.Collective
	d := optimizer.DefaultDiLoCo()
	d.OuterLR, d.Momentum = m.Optimizer.OuterLR, m.Optimizer.OuterMomentum
	nx := v.n // what the collective averages: every coordinate, or the round's compacted vector
	if s := outerSupport(m.Wire, m.Optimizer.OuterMomentum); s != nil {
		d.Support, nx = s, s.SupportLen(v.n)
	}
	bc := optimizer.DefaultButterflyConfig(nx, v.pn.Signer(), butterflyTick.Seconds())
	bc.Codec = m.WireCodec(bc.Codec)
	bc.MaxAbs = rc.MaxAbs
	bc.Hostile = butterflyHostile(v.cfg.Hostile)
	ticks := func(d time.Duration) int64 { return max(1, int64(d/butterflyTick)) }
	bc.PhaseWait, bc.MinPhase, bc.MaxPhase = ticks(rc.InitialDeadline), ticks(rc.MinDeadline), ticks(rc.MaxDeadline)
	// Room for a few rounds of every member's messages (about 2 bytes per
	// parameter per member and round with an 8-bit codec).
	bc.MaxStashBytes = max(rc.MaxStashBytes, 8*int64(v.n))
	log := rc.Logger
	if log == nil {
		log = v.log
	}
	onReject := func(p transport.PeerID, err error) {
		v.log.Warn("offender excluded from the run", "peer", p, "err", err)
		if rc.OnReject != nil {
			rc.OnReject(p, err)
		}
	}
	if v.coll, err = optimizer.NewButterflyDriver(v.peers, bc, optimizer.ButterflyOptions{Tick: butterflyTick, Logger: log, OnReject: onReject}); err != nil {
		return err
	}
	// The collective outlives ctx long enough to finish cleanly; Close stops it.
	var rctx context.Context
	rctx, v.cancelRing = context.WithCancel(context.Background())
	v.coll.Start(rctx)
	// A delayed round's exchange outlives the run's context too, so a stop
	// can land it (landOnStop); Close, or landOnStop's wait, ends it.
	v.exchange, v.cancelExchange = context.WithCancel(rctx)
	if v.dl, err = optimizer.NewDiLoCo(d, v.coll, v.theta); err != nil {
		return err
	}
	if v.resumeLocal(v.adoptable()) {
		v.setWeights()
		say(v.cfg.Progress, "resumed local checkpoint at round %d", v.dl.Round)
		v.resumeResidual()
	}
	v.serveDiLoCo()
	// The chain of round certificates starts at the state resumed (or the
	// run's start state), trusted because this member holds it.
	anchor := &replica.Certificate{Run: v.pn.RunID(), Round: v.dl.Round, Hash: v.hashNow()}
	certPath := ""
	if v.ckPath != "" {
		certPath = v.ckPath + ".cert"
	}
	v.certs, err = newCerts(v.pn, v.log, anchor, certPath, func() []transport.PeerID { return ids(announcements(v.pn)) })
	if err != nil {
		return err
	}
	v.certs.sybil.Store(v.cfg.Hostile == HostileSybils)
	return nil
}

// outerSupport is the shared support a run's wire.outer asks for, or nil
// for a dense exchange. With an outer momentum, half of each chunk's
// coordinates follow the certified momentum and half a keyed hash of the
// round; without one the "momentum" is the last aggregate, whose largest
// coordinates were just sent, so all come from the hash (measured better:
// BENCHMARKS.md, issue [3/4]).
func outerSupport(w manifest.Wire, momentum float64) *optimizer.SupportConfig {
	if w.Outer != manifest.OuterSupport {
		return nil
	}
	// The residual keeps what the wire's rounding lost too (the butterfly
	// reports what it sent): int2 and sign lose much of each value.
	s := &optimizer.SupportConfig{Chunk: manifest.SupportChunk, K: w.SupportK, Decay: float32(w.ResidualDecay), FeedRounding: w.ResidualDecay > 0, Rotate: w.Rotate, Tiled: w.Tiled}
	if momentum > 0 && !w.Rotate { // a rotated support picks rotated coordinates, all by the hash
		s.FromMomentum = w.SupportK / 2
	}
	return s
}

// butterflyTick is the collective's clock.
const butterflyTick = 50 * time.Millisecond

// dilocoLoop is the DiLoCo side of a volunteer as its outerLoop: the
// butterfly collective, the shared state and its round certificates.
type dilocoLoop struct{ v *Volunteer }

func (d dilocoLoop) round() uint64 {
	if d.v.dl == nil {
		return 0
	}
	return d.v.dl.Round
}

// start catches up with the run's certified state and announces the state
// this member trains from.
func (d dilocoLoop) start(ctx context.Context) {
	v := d.v
	if err := v.catchUp(ctx); err != nil {
		v.log.Warn("could not fetch the run's state; starting from the local one", "err", err)
	} else {
		v.setWeights()
	}
	v.announce(ctx)
}

func (d dilocoLoop) contribute(ctx context.Context, ph phase) error {
	if d.v.run.Optimizer.Delayed {
		return d.v.contributeDelayed(ctx, ph)
	}
	return d.v.contribute(ctx, ph)
}

func (d dilocoLoop) rollback(ctx context.Context) error { return d.v.rollbackDiLoCo(ctx) }

func (d dilocoLoop) state() outerState {
	if d.v.dl == nil {
		return nil
	}
	return d.v.dl
}

func (d dilocoLoop) finish(ph phase) { d.v.landOnStop(ph) }

func (d dilocoLoop) close() {
	v := d.v
	if v.cancelRing != nil {
		v.cancelRing() // its sends end now, not at their timeouts
	}
	if v.coll != nil {
		v.coll.Close()
	}
	if v.certs != nil {
		v.certs.close()
	}
}

// contributeDelayed is contribute for the overlapped outer step
// (ALGORITHMS.md 1): the round started after the previous inner phase
// landed during this one as soon as its exchange ended (landEarly), or
// lands now; it reports that round, starts this phase's in the background
// and goes on training from the round's expected result (the eager start), so the
// network's time hides behind compute. A round in flight is abandoned
// whenever the member takes the run's state instead.
func (v *Volunteer) contributeDelayed(ctx context.Context, ph phase) error {
	early := v.early
	v.early = nil
	// Members land a round one by one as their exchanges end, so one round
	// ahead is the others landing first; two is falling behind.
	if before := v.dl.Round; runAhead(v.pn) > before+1 {
		if v.catchUp(ctx) == nil && v.dl.Round > before {
			say(v.cfg.Progress, "behind the run: jumped from round %d to %d", before, v.dl.Round)
			v.adopted(ctx, ph)
			return nil
		}
	}
	v.su.Dev.CopyOut(v.theta, v.su.Stage.Params)
	before := v.dl.Round
	var st optimizer.RoundStats
	var err error
	switch {
	case early != nil && early.err != nil: // the round landing during the phase failed
		before, err = early.before, early.err
	case early != nil: // it landed during the phase: report it now
		if _, err = v.dl.OuterStepDelayed(v.exchange, v.theta); err == nil {
			before, st = early.before, early.stats
		}
	default:
		st, err = v.dl.OuterStepDelayed(v.exchange, v.theta)
	}
	// Stopping: a round that landed is still reported below (the round
	// just started is landOnStop's); a failure is not worth a re-sync.
	if ctx.Err() != nil && (err != nil || v.dl.Round == before) {
		return nil
	}
	if err != nil {
		// The round in flight failed: nothing of it was applied. Start over
		// from the run's state (or our phi) with nothing in flight.
		v.log.Warn("delayed round failed", "round", before+1, "err", err)
		say(v.cfg.Progress, "round %d did not complete (%v); re-syncing", before+1, err)
		v.dl.Abandon()
		if cerr := v.catchUp(ctx); cerr != nil {
			v.log.Warn("re-sync failed", "err", cerr)
		}
		v.adopted(ctx, ph)
		return nil
	}
	// theta is the eager start: train on from there.
	v.su.Dev.CopyIn(v.su.Stage.Params, v.theta)
	v.publish(ctx)
	if v.dl.Round == before {
		say(v.cfg.Progress, "round %d started; its result lands during the next inner phase", before+1)
		return nil
	}
	v.certs.vote(v.dl.Round, v.stateHash, st.Group)
	if v.resynced(ctx) { // the others ended the landed round with another result
		v.adopted(ctx, ph)
		return nil
	}
	landed := 0
	if early != nil {
		landed = early.step
	}
	v.reportRound(ph, st, landed)
	return nil
}

// landWait bounds how long a stopping volunteer waits for the exchange of
// a delayed round in flight to land it (landOnStop): a volunteer leaves
// within 5 s of Ctrl-C (demo.maxStop), and the demo's volunteers finish
// their exchanges in a few hundred milliseconds.
const landWait = 3 * time.Second

// landOnStop is the end of an overlapped run stopped during the inner
// phase ph: the round in flight, or one that landed during ph, is not
// lost. A round that landed is reported, as the phase's end would have;
// one still in flight is waited for up to landWait (its exchange outlives
// the run's context: v.exchange), then applied and reported, or abandoned
// with its exchange. The local checkpoint Close saves then holds it.
func (v *Volunteer) landOnStop(ph phase) {
	if v.dl == nil {
		return
	}
	early := v.early
	v.early = nil
	before := v.dl.Round
	deadline := time.Now().Add(landWait)
	var st optimizer.RoundStats
	switch {
	case early != nil && early.err != nil: // it failed: nothing was applied
		v.dl.Abandon()
		return
	case early != nil: // it landed during the phase
		before, st = early.before, early.stats
		v.dl.Abandon() // forget the phase start: the checkpoint holds phi
	case v.dl.InFlight():
		say(v.cfg.Progress, "stopping: landing round %d, whose exchange is under way (at most %v)", before+1, landWait)
		for !v.dl.ExchangeDone() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if !v.dl.ExchangeDone() {
			v.cancelExchange()
			v.dl.Abandon()
			say(v.cfg.Progress, "round %d's exchange did not end in %v: left unfinished", before+1, landWait)
			return
		}
		var err error
		if st, err = v.dl.Flush(v.theta); err != nil {
			say(v.cfg.Progress, "round %d did not complete (%v)", before+1, err)
			return
		}
	default:
		return
	}
	if v.dl.Round == before {
		return
	}
	v.install(context.Background())
	v.certs.vote(v.dl.Round, v.stateHash, st.Group)
	v.reportRound(ph, st, 0)
	v.awaitLanded(st.Group, v.dl.Round, deadline)
}

// awaitLanded keeps this stopping member in the round's exchange until
// every other member of its group announces the round as landed, or has
// left, or the deadline passes: a member that closed its collective the
// moment its own exchange ended could leave a slower one without the parts
// it owns.
func (v *Volunteer) awaitLanded(group []transport.PeerID, round uint64, deadline time.Time) {
	for time.Now().Before(deadline) {
		at := map[transport.PeerID]uint64{}
		for _, a := range announcements(v.pn) {
			at[a.id] = a.round
		}
		behind := false
		for _, p := range group {
			if r, ok := at[p]; ok && r < round {
				behind = true
			}
		}
		if !behind {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// earlyLanding is a delayed round that landed during an inner phase
// (landEarly), reported at the phase's end.
type earlyLanding struct {
	before uint64 // the round before it landed
	step   int    // the inner steps of the phase before it landed
	stats  optimizer.RoundStats
	err    error
}

// landEarly applies the delayed round in flight as soon as its exchange
// has ended, a few inner steps into the phase (optimizer.DiLoCo.Land), so
// the phase trains on from the round's result rather than from a state a
// round stale; the exchange still hides behind those steps. What follows a
// landed round (serving and announcing the state, the certificate vote,
// the round line) waits for the phase's end (contributeDelayed), as when
// rounds landed there: the shared state is the same bits either way, only
// this member's local progress moves sooner.
func (v *Volunteer) landEarly(step int) {
	before := v.dl.Round
	v.su.Dev.CopyOut(v.theta, v.su.Stage.Params)
	st, err := v.dl.Land(v.theta)
	if err == nil { // a failed round applied nothing; the phase's end re-syncs
		v.su.Dev.CopyIn(v.su.Stage.Params, v.theta)
	}
	v.early = &earlyLanding{before: before, step: step, stats: st, err: err}
}

// contribute offers the round's pseudo-gradient to the collective and installs
// the result; or, when this member fell behind or diverged, takes the run's
// state instead.
func (v *Volunteer) contribute(ctx context.Context, ph phase) error {
	// Fell behind (joined late, or slow): take the run's state instead of
	// offering a pseudo-gradient for a round the others have finished.
	if before := v.dl.Round; v.catchUp(ctx) == nil && v.dl.Round > before {
		say(v.cfg.Progress, "behind the run: jumped from round %d to %d", before, v.dl.Round)
		v.adopted(ctx, ph)
		return nil
	}
	// Ended the last round with another state than the run's (the others'
	// announcements have arrived by now): train from theirs.
	if v.resynced(ctx) {
		v.adopted(ctx, ph)
		return nil
	}
	v.su.Dev.CopyOut(v.theta, v.su.Stage.Params)
	st, err := v.outerStep(ctx)
	if ctx.Err() != nil {
		return nil
	}
	if err != nil {
		v.adopted(ctx, ph) // the run's state if newer; else back to phi
		return nil
	}
	v.advanceLedger(st)
	v.install(ctx) // OuterStep left theta = phi
	v.certs.vote(v.dl.Round, v.stateHash, st.Group)
	if v.resynced(ctx) { // the others finished this round with another result
		v.install(ctx)
	}
	v.reportRound(ph, st, 0)
	return nil
}

// reportRound reports the round this member contributed to and installed
// (its line, telemetry, checkpoint): the inner phase ph, the round's stats
// and, for a delayed round that landed during ph, the step it landed at.
func (v *Volunteer) reportRound(ph phase, st optimizer.RoundStats, landedStep int) {
	v.lastReported = v.dl.Round
	v.report(RoundReport{Round: v.dl.Round, Loss: ph.meanLoss(), Members: len(st.Group), Stats: st,
		StateHash: v.stateHash, LandedStep: landedStep}, ph, len(st.Group))
}

// outerStep offers theta to the round, retrying a failed round at once with
// the same pseudo-gradient (up to roundTries) while nobody finishes it.
func (v *Volunteer) outerStep(ctx context.Context) (optimizer.RoundStats, error) {
	for try := 1; ; try++ {
		st, err := v.dl.OuterStep(ctx, v.theta)
		if err == nil || ctx.Err() != nil {
			return st, err
		}
		v.log.Warn("round failed", "round", v.dl.Round+1, "try", try, "err", err)
		if errors.Is(err, optimizer.ErrExcluded) && v.resynced(ctx) {
			return st, err // started from another state than the run's: took the run's
		}
		say(v.cfg.Progress, "round %d did not complete (%v); re-syncing and retrying", v.dl.Round+1, err)
		before := v.dl.Round
		if cerr := v.catchUp(ctx); cerr != nil {
			// A transient failure (a slow link, a member gone mid-download):
			// go back to phi; the next round's catch-up tries again.
			v.log.Warn("re-sync failed", "round", v.dl.Round+1, "err", cerr)
			return st, err
		}
		if v.dl.Round > before || try == roundTries {
			return st, err // the others finished it without us (adopted), or give this pseudo-gradient up
		}
		// Nobody finished the round: offer the same pseudo-gradient again at
		// once (OuterStep left theta and the error feedback as they were),
		// so that members that failed together retry together; retraining
		// first would spread them an inner phase apart, and the first back
		// would exclude the others.
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(time.Duration(try) * 500 * time.Millisecond):
		}
	}
}

// setWeights makes phi the stage's weights.
func (v *Volunteer) setWeights() {
	copy(v.theta, v.dl.Phi)
	v.su.Dev.CopyIn(v.su.Stage.Params, v.theta)
}

// install makes the shared state the stage's weights, what this member
// serves to joiners and what it announces.
func (v *Volunteer) install(ctx context.Context) {
	v.setWeights()
	v.publish(ctx)
}

// publish makes the shared state what this member serves to joiners and
// what it announces.
func (v *Volunteer) publish(ctx context.Context) {
	v.stateHash = v.serveDiLoCo()
	switch v.cfg.Hostile {
	case HostileLoneJump:
		v.loneJump(ctx)
		return
	case HostileSybils:
		v.sybilJump(ctx)
		return
	}
	v.gossipRound(v.dl.Round, v.stateHash)
}

// announce gossips this member's round and state hash in its metadata.
func (v *Volunteer) announce(ctx context.Context) {
	v.stateHash = v.hashNow()
	v.gossipRound(v.dl.Round, v.stateHash)
}

// resynced takes the run's state when this member ended its round with
// another state than the one the round's certificate names (a strict
// majority of the round's group; DESIGN.md, consistency), or the state its
// own vote would certify (replica.Book.Swing), and says whether it did.
// Otherwise nothing changes: no plurality, no single member decides.
func (v *Volunteer) resynced(ctx context.Context) bool {
	if v.certs == nil || v.cfg.Hostile == HostileLoneJump || v.cfg.Hostile == HostileSybils {
		return false // a jumper knows it lies, and contributes honestly
	}
	cert, ok := v.certs.book.At(v.dl.Round)
	if !ok {
		// No certificate: this member's own vote may be what splits the
		// group (it ended the round apart, and a hostile member dissents).
		cert, ok = v.certs.book.Swing(v.dl.Round, v.stateHash)
	}
	if !ok || cert.Hash == v.stateHash {
		return false
	}
	v.log.Warn("state differs from the round's certificate; re-syncing", "round", v.dl.Round)
	if _, err := adoptState(ctx, v.pn, v.log, v.adoptable(), v.n, v.dl.Round, cert.Hash, holders(cert, announcements(v.pn)), v.cfg.Progress); err != nil {
		v.log.Warn("re-sync failed", "err", err)
		return false
	}
	return true
}

// adopted installs the run's state just taken and reports the rounds it
// covers; the inner steps since the last round are dropped.
func (v *Volunteer) adopted(ctx context.Context, ph phase) {
	v.install(ctx)
	if v.dl.Round == v.lastReported {
		v.corrected()
		return
	}
	v.lastReported = v.dl.Round
	rep := RoundReport{Round: v.dl.Round, Loss: ph.meanLoss(), Members: len(v.peers.Members()),
		StateHash: v.stateHash, Adopted: true}
	v.report(rep, ph, 0)
}

// corrected tells the bootstrap, when this member has just taken the run's
// state for the round it last reported with another state (it ended that
// round apart from the others: it was cut off or stalled while they
// decided; DESIGN.md, consistency), the state it holds for that round now:
// the report replaces the earlier one, so the run's history shows what
// every member went on from.
func (v *Volunteer) corrected() {
	sent := v.lastSent
	if sent.Round != v.dl.Round || sent.StateHash == 0 || sent.StateHash == v.stateHash || v.stateHash == 0 {
		return
	}
	say(v.cfg.Progress, "round %d: ended it apart from the run (state %016x); took the run's state (state %016x)",
		sent.Round, sent.StateHash, v.stateHash)
	sent.StateHash, sent.UnixMS = v.stateHash, time.Now().UnixMilli()
	v.lastSent = sent
	v.reporter.send(sent)
}

// catchUp adopts the run's state when a chain of round certificates leads
// from this member's trusted one past its round (certs.certifiedAhead):
// the latest certified state, downloaded from its holders and checked
// against the certified hash. A member announcing a later round without
// such a chain (a lone jump, sybils) is never followed.
func (v *Volunteer) catchUp(ctx context.Context) error {
	if v.certs == nil {
		return nil // not set up yet
	}
	others := announcements(v.pn)
	cert := v.certs.certifiedAhead(ctx, v.dl.Round, others)
	if cert == nil {
		return nil
	}
	if _, err := adoptState(ctx, v.pn, v.log, v.adoptable(), v.n, cert.Round, cert.Hash, holders(cert, others), v.cfg.Progress); err != nil {
		return err
	}
	v.log.Info("adopted the run's certified state", "round", v.dl.Round)
	return nil
}

// announcement is what one volunteer gossips: its round and state hash.
type announcement struct {
	id    transport.PeerID
	round uint64
	hash  uint64
}

// announcements lists the other volunteers' announcements.
func announcements(pn *p2p.Node) []announcement {
	var out []announcement
	for _, m := range pn.Members() {
		if m.Meta.Role == p2p.RoleVolunteer && m.ID != pn.ID() {
			out = append(out, announcement{transport.PeerID(m.ID.String()), m.Meta.Round, m.Meta.StateHash})
		}
	}
	return out
}

// runAhead is the highest round another volunteer announces.
func runAhead(pn *p2p.Node) uint64 {
	var r uint64
	for _, a := range announcements(pn) {
		r = max(r, a.round)
	}
	return r
}

// adoptFrom downloads the shared state with hash want from the first of ids
// that serves it (at this member's round or later), and installs it.
func adoptFrom(ctx context.Context, pn *p2p.Node, log *slog.Logger, dl *optimizer.DiLoCo, n int, ids []transport.PeerID, want uint64, progress io.Writer) error {
	_, err := adoptState(ctx, pn, log, dl, n, dl.Round, want, ids, progress)
	return err
}
