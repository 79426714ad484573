package node

import (
	"context"
	"time"

	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/replica"
)

// outerLoop is the outer optimiser of a whole-model volunteer's replica
// group, as runReplica drives it round after round: DiLoCo over the
// butterfly with round certificates (dilocoLoop, diloco.go) or NoLoCo's
// gossip (nolocoState, noloco.go). runReplica owns the skeleton (start,
// inner phase, contribute, roll back, stop after --rounds); an
// implementation owns how a round is contributed, applied, published,
// checkpointed and caught up. Staged volunteers still run their own loop
// (staged.go), and the in-process experiments theirs.
type outerLoop interface {
	// round is the next round (DiLoCo) or step (NoLoCo) to run.
	round() uint64
	// start takes the run's state when this member is behind and installs
	// the state it trains from.
	start(ctx context.Context)
	// contribute offers the inner phase's result and installs the outcome:
	// the round's result, or the run's state when this member fell behind.
	contribute(ctx context.Context, ph phase) error
	// rollback drops a phase that went non-finite and reinstalls the last
	// good state (the run's, when this member's own is poisoned).
	rollback(ctx context.Context) error
	// state is the outer state the local checkpoint saves (nil before
	// there is one).
	state() outerState
	// finish ends the loop when the run stops during the inner phase ph:
	// a delayed round whose exchange ends soon is landed and reported
	// rather than lost (DiLoCo); nothing for NoLoCo.
	finish(ph phase)
	// close stops what the loop started.
	close()
}

// runReplica trains round after round: an inner phase, then the
// contribution to the replica group's outer round.
func (v *Volunteer) runReplica(ctx context.Context) error {
	o := v.outer
	v.runAtStart = max(o.round(), medianRound(v.pn))
	o.start(ctx)
	v.lastReported = o.round()
	// --rounds counts rounds the run completes while this volunteer is in
	// it (a round adopted from the others counts; a failed one does not).
	stopAt := o.round() + uint64(v.cfg.Rounds)
	for v.cfg.Rounds == 0 || o.round() < stopAt {
		ph, err := v.trainPhase(ctx)
		if isNonFinite(err) {
			v.rollback(ctx, err) // back to phi; the others finish the round without us
			continue
		}
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			o.finish(ph)
			return nil
		}
		if err := o.contribute(ctx, ph); err != nil {
			return err
		}
		if ctx.Err() != nil {
			o.finish(phase{began: time.Now()}) // no inner step since
			return nil
		}
		if why := v.runComplete(); why != "" {
			say(v.cfg.Progress, "the run is complete: %s; leaving", why)
			return nil
		}
	}
	return nil
}

// medianRound is the median of the rounds the other volunteers announce
// (a few sybils announcing far rounds do not move it); 0 with none.
func medianRound(pn *p2p.Node) uint64 {
	var rs []uint64
	for _, a := range announcements(pn) {
		rs = append(rs, a.round)
	}
	return replica.MedianRound(rs)
}
