package optimizer

import (
	"fmt"
	"slices"
)

// Robust aggregation of one part of a round (ALGORITHMS.md 6).
//
// The butterfly collective gives the owner of a part every member's whole
// contribution to it, so the owner can aggregate with a rule that no minority
// of contributors controls. Skein uses the coordinate-wise trimmed mean:
// for each coordinate, sort the k contributed values, drop the t smallest and
// the t largest, and average the k-2t that remain.
//
// Breakdown point. With k contributions of which at most t are hostile and
// k >= 2t+1, every coordinate of the result lies within the range
// [min, max] of the honest contributions' values for that coordinate: each
// of the k-2t kept values has at least t values at or below it and t at or
// above it, so at least one honest value lies on each side of it. No choice
// of the hostile values moves a coordinate outside that range, so a hostile
// member can at most bias the result within the honest spread (and the
// honest members' norm bound on the average then holds for the result). The
// owner lowers t to (k-1)/2 when fewer members contributed (at k=3, t=1 is
// the median), and t=0 is the plain mean, which one member controls.
//
// The rule is deterministic and exact in float32 with a fixed order of
// operations (sort, then sum in float64 in sorted order, rounded once), so
// the two owners of a part compute the same bits from the same inputs.

// RobustConfig selects the aggregation rule.
type RobustConfig struct {
	// Trim is t above: the values dropped at each end of every coordinate.
	// 0 is the plain mean.
	Trim int
}

// Validate names the first invalid field.
func (c RobustConfig) Validate() error {
	if c.Trim < 0 || c.Trim > maxGroup/2 {
		return fmt.Errorf("%w: trim %d must be in [0, %d]", ErrConfig, c.Trim, maxGroup/2)
	}
	return nil
}

// EffectiveTrim is the trim applied to k contributions: Trim, lowered so
// that at least one value is kept (k >= 2t+1).
func (c RobustConfig) EffectiveTrim(k int) int {
	t := c.Trim
	if k < 2*t+1 {
		t = (k - 1) / 2
	}
	return max(t, 0)
}

// TrimmedMean writes into out the coordinate-wise trimmed mean of inputs
// (each len(out) long, in a fixed order), dropping t values at each end.
// scratch is reused between calls when large enough.
func TrimmedMean(out []float32, inputs [][]float32, t int, scratch []float32) []float32 {
	k := len(inputs)
	if k == 0 {
		clear(out)
		return scratch
	}
	if 2*t >= k {
		t = (k - 1) / 2
	}
	if t == 0 {
		for i := range out {
			var s float64
			for _, x := range inputs {
				s += float64(x[i])
			}
			out[i] = float32(s / float64(k))
		}
		return scratch
	}
	if cap(scratch) < k {
		scratch = make([]float32, k)
	}
	v := scratch[:k]
	kept := float64(k - 2*t)
	for i := range out {
		for j, x := range inputs {
			v[j] = x[i]
		}
		slices.Sort(v)
		var s float64
		for _, y := range v[t : k-t] {
			s += float64(y)
		}
		out[i] = float32(s / kept)
	}
	return scratch
}
