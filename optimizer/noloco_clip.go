package optimizer

import (
	"math"
	"slices"
)

// Bounds on a NoLoCo partner's contribution (ALGORITHMS.md 2).
//
// NoLoCo has no collective: a member averages with one or two partners,
// so there is no majority to trim with, and a plain mean lets a partner set
// the result (its phi moves this member's by gamma/|group| of whatever
// distance it claims, its outer gradient by eta/|group|). Each partner's
// contribution is therefore clipped:
//   - its outer gradient to a norm of ClipFactor times the median of this
//     member's own outer-gradient norms over the last normWindow steps (as
//     the butterfly clips a contribution to a multiple of the median norm);
//   - the distance of its phi to this member's phi to PhiClip times the
//     larger of that median and the median of the last normWindow partner
//     distances accepted (after clipping).
//
// Honest members' slow weights differ by a few outer steps, and an outer
// step is about an outer gradient long. The own norms are the floor: they
// exist from the first step, before any partner was heard (in a fresh run
// every member starts from the same weights, so the first distances are
// 0), and no partner can lower them, so honest partners are never all
// clipped away. The partners' distances let the bound follow a run whose
// members lie further apart than their outer gradients are long. A partner
// can raise that median only by supplying most of a member's partner
// samples, that is by being its only partner most steps (a run of two),
// where it sets half of every average anyway; with random groups of M > 2
// members it supplies about 1/(M-1) of them.
//
// What this buys is bounded damage, not none: a partner still moves phi
// by up to gamma/|group| times the bound each step it is drawn. Sending the
// run's initial weights every step (TestNoLoCoRollbackAttack, 4 honest
// members, 30 steps) erased 87% of the progress without the bound (its pull
// grows with the progress, which stalls) and 44% with PhiClip 1.5 (54% at
// 2, 76% at 3). The factors trade that against clipping honest partners:
// on the tiny model (4 members, H = 8, 12 steps) honest distances reached
// 2.1 times the median own norm early on, and PhiClip 1.5 clipped 4 of 48
// honest contributions (2: 3, 3: none), the validation loss within 0.04%. A partner's outer gradient has a norm close to this member's (the
// same H steps on the same distribution), so ClipFactor 2 leaves it alone.

// observeNorm records this step's own outer-gradient norm and returns the
// lower median of the last normWindow. A norm of 0 (no inner steps ran)
// says nothing of the run's scale and is not recorded.
func (g *Gossip) observeNorm(norm float64) float64 {
	if norm > 0 {
		g.norms = pushWindow(g.norms, norm)
	}
	return lowerMedian(g.norms)
}

// pushWindow appends v to the last normWindow values in w.
func pushWindow(w []float64, v float64) []float64 {
	if len(w) == normWindow {
		w = append(w[:0], w[1:]...)
	}
	return append(w, v)
}

func lowerMedian(w []float64) float64 {
	if len(w) == 0 {
		return 0
	}
	sorted := slices.Sorted(slices.Values(w))
	return sorted[(len(sorted)-1)/2]
}

// distance is the L2 norm of a-b, summed in float64.
func distance(a, b []float32) float64 {
	var s float64
	for i, v := range a {
		d := float64(v) - float64(b[i])
		s += d * d
	}
	return math.Sqrt(s)
}

// outlierFactor: a partner whose phi or outer gradient lies more than that
// many times past its bound is named an offender (GossipStats.Outliers),
// though clipped like any other. Honest partners came within 1.4 times the
// bounds (2.1 times the median own norm, above); one restarted from a
// checkpoint a round old lies a few outer steps away. Clipping bounds the
// damage either way: the name is for the operator.
const outlierFactor = 100

// clipPartner bounds a partner's phi (in place) to within PhiClip times
// max(ref, the median accepted partner distance) of this member's phi own
// and its outer gradient d to a norm of ClipFactor*ref, where ref is the
// median own norm, records the distance accepted, and says whether it
// clipped and whether the partner lay more than outlierFactor times past
// either bound.
func (g *Gossip) clipPartner(own, phi, d []float32, ref float64) (clipped, outlier bool) {
	past := func(x, bound float64) bool { return bound > 0 && x > outlierFactor*bound }
	dist, bound := distance(phi, own), g.cfg.PhiClip*max(ref, lowerMedian(g.dists))
	if dist > bound {
		outlier = past(dist, bound)
		s := float32(bound / dist)
		for i, p := range own {
			phi[i] = p + (phi[i]-p)*s
		}
		dist, clipped = bound, true
	}
	g.dists = pushWindow(g.dists, dist)
	if norm, bound := l2(d), g.cfg.ClipFactor*ref; norm > bound {
		outlier = outlier || past(norm, bound)
		s := float32(bound / norm)
		for i := range d {
			d[i] *= s
		}
		clipped = true
	}
	return clipped, outlier
}
