package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/replica"
	"github.com/skein-ml/skein/trainer"
)

// A volunteer protects the run, and itself, from a poisoned inner phase: a
// step whose loss or gradient is not finite (trainer.ErrNonFinite; a
// diverged step, a bad batch, a flipped bit) means the stage's weights
// can no longer be trusted. The volunteer never exits for it and never
// saves those weights (saveState refuses non-finite state too): it drops
// the phase and trains the next round from the last good shared state, phi;
// if phi itself is poisoned, from the run's state taken from the others.

// maxRollbackWait bounds the pause between rollbacks that follow each
// other without a good inner phase between them.
const maxRollbackWait = time.Minute

// rollback drops the inner phase that failed with cause (wrapping
// trainer.ErrNonFinite) and goes back to the last good shared state: phi
// becomes the stage's weights again, AdamW moments no longer finite are
// cleared, and a poisoned phi is replaced by the run's state. The caller
// goes on with the next round. A volunteer that keeps failing waits longer
// each time (up to maxRollbackWait) instead of spinning.
func (v *Volunteer) rollback(ctx context.Context, cause error) {
	round := v.round() + 1 // the round whose inner phase failed
	v.rollbacks++
	v.log.Warn("non-finite loss or gradient: dropping the inner phase, back to the last shared state",
		"round", round, "err", cause, "in_a_row", v.rollbacks)
	say(v.cfg.Progress, "warning: round %d: %v; dropped the inner phase and went back to the last shared state", round, cause)
	v.clearBadMoments()
	err := v.outer.rollback(ctx)
	if err != nil {
		v.log.Error("could not take the run's state to replace a poisoned one", "round", round, "err", err)
		say(v.cfg.Progress, "warning: round %d: could not take the run's state (%v); trying again", round, err)
	}
	if v.rollbacks > 1 || err != nil {
		wait := min(time.Second<<min(v.rollbacks-1, 6), maxRollbackWait)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// rollbackDiLoCo gives up the phase's progress (and a delayed round in
// flight, which the others finish without this member) and installs phi;
// a poisoned phi is first replaced by the run's state: a later one if a
// certificate names it (catchUp), else the one the certificate of this
// round names.
func (v *Volunteer) rollbackDiLoCo(ctx context.Context) error {
	v.dl.Abandon()
	v.early = nil
	if finiteState(v.dl) {
		v.setWeights()
		return nil
	}
	before := v.dl.Round
	if err := v.catchUp(ctx); err != nil || v.dl.Round == before {
		// This member's own state counts for nothing: take the state the
		// certificate of its round names (never what most announce: sybils
		// can be most), from its holders. Without one yet (its votes are
		// on their way), the caller tries again after a pause.
		var cert *replica.Certificate
		ok := v.certs != nil
		if ok {
			cert, ok = v.certs.book.At(v.dl.Round)
		}
		if !ok {
			return fmt.Errorf("node: phi is not finite and round %d has no certificate (yet) naming the run's state", v.dl.Round)
		}
		if err := adoptFrom(ctx, v.pn, v.log, v.dl, v.n, holders(cert, announcements(v.pn)), cert.Hash, v.cfg.Progress); err != nil {
			return err
		}
	}
	if !finiteState(v.dl) {
		return errors.New("node: the state taken is not finite")
	}
	v.install(ctx)
	return nil
}

// rollback keeps the run's clock, as a failed outer step does: the member
// goes on from phi at the next step, or from a member's state when its own
// phi is poisoned.
func (s *nolocoState) rollback(ctx context.Context) error {
	v, o := s.v, s.opt
	if finiteState(o) {
		if err := o.SetState(o.Step+1, o.Phi, o.Delta); err != nil {
			return err
		}
		s.install(ctx)
		return nil
	}
	// The median of several members' states, as a catch-up takes: never
	// one member's word.
	ok, err := nolocoCatchUp(ctx, v.pn, v.log, o, max(o.Step, 1)-1, 0, v.n, v.cfg.Progress)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("node: phi is not finite and no majority of the other volunteers is at round %d or later", o.Step)
	}
	v.log.Info("replaced a poisoned phi with the median of members' states", "round", o.Step)
	s.install(ctx)
	return nil
}

// finiteState reports whether an outer state holds only finite values.
func finiteState(st outerState) bool {
	_, phi, mom := st.State()
	return nonFinite(phi) < 0 && nonFinite(mom) < 0
}

// clearBadMoments zeroes the AdamW moments if they are no longer finite
// (moments that are finite stay: clearing them would change the scale of
// the next steps).
func (v *Volunteer) clearBadMoments() {
	st := v.su.Stage
	buf := make([]float32, v.n)
	for _, m := range []kernels.Buffer{st.M, st.V} {
		v.su.Dev.CopyOut(buf, m)
		if nonFinite(buf) >= 0 {
			v.log.Warn("AdamW moments not finite; clearing them")
			v.su.Dev.Zero(st.M)
			v.su.Dev.Zero(st.V)
			return
		}
	}
}

// isNonFinite reports whether err is a poisoned inner phase.
func isNonFinite(err error) bool { return errors.Is(err, trainer.ErrNonFinite) }
