package optimizer

import (
	"fmt"
	"math"
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
// honest members' norm bound on the average then holds for the result).
//
// The trim follows the group. By default (TrimMedian) t = (k-1)/2, the
// most that keeps a value: the coordinate-wise median (the mean of the
// middle two when k is even). It tolerates f hostile of k for every
// f <= (k-1)/2, any minority: 1 of 3 or 4, 2 of 5 or 6, 3 of 7 or 8, 7 of
// 15 or 16. No rule tolerates more: f+1 colluders are half of k or more,
// and a rule that treats contributors alike cannot tell them from the
// honest ones (robust_test.go breaks the median there). It is also what
// the rest of the design assumes (groups, certificates and re-syncs take a
// majority). A fixed trim does not scale: with trim 1, 2 colluders of 7
// that spend their clipped norm in a few coordinates keep one of their
// values in the mean and move it up to 14 honest spreads past the honest
// range (the attack of robust_test.go). The price is noise: the median of
// k honest values varies more than their mean (1.4 to 1.5 times the
// variance for Gaussian spread at k from 5 to 32, against 1.01 to 1.14
// with trim 1). At k <= 4 it is the former default, trim 1; k = 2 is the
// plain mean (one member of two cannot be outvoted) and k = 1 the
// contribution itself. An explicit Trim is lowered the same way to (k-1)/2
// when fewer members contributed; t = 0 is the plain mean, which one
// member controls.
//
// Norm bound. Before the trimmed mean, the owner clips every contribution
// to the part to at most ClipFactor times the median of the contributions'
// norms for that part (the lower median, in this round). The bound adapts
// to the run, round by round, with no history for the two owners to agree
// on: both compute it from the same inputs. While hostile contributions are
// fewer than half (f <= (k-1)/2), the lower median norm lies within the
// honest norms' range, so each hostile contribution, whatever its values,
// enters with a norm of at most ClipFactor times the largest honest norm:
// even with the plain mean (Trim 0), the f hostile contributions' share of
// the aggregate has a norm of at most f*ClipFactor*max_honest_norm/k,
// instead of no bound at all. Honest pseudo-gradients start from the same
// weights and take the same number of steps on batches of one
// distribution, so their norms are close, and the default factor of 4
// leaves them untouched (the convergence benchmark's arms without an
// attacker give the same bits with and without it; BENCHMARKS.md).
//
// The rule is deterministic and exact in float32 with a fixed order of
// operations (sort, then sum in float64 in sorted order, rounded once), so
// the two owners of a part compute the same bits from the same inputs,
// in any order.

// RobustConfig selects the aggregation rule.
type RobustConfig struct {
	// Trim is t above: the values dropped at each end of every coordinate.
	// 0 is the plain mean; TrimMedian derives t from the contributors.
	Trim int
	// ClipFactor bounds each contribution's norm, for its part, by this
	// many times the median of the contributions' norms (0: no bound).
	ClipFactor float64
}

// TrimMedian, as RobustConfig.Trim, trims (k-1)/2 of k contributions: the
// coordinate-wise median, robust to any minority.
const TrimMedian = -1

// DefaultRobust is the rule of open runs: norms clipped at 4x the median,
// then the coordinate-wise median.
func DefaultRobust() RobustConfig { return RobustConfig{Trim: TrimMedian, ClipFactor: 4} }

// Validate names the first invalid field.
func (c RobustConfig) Validate() error {
	switch {
	case c.Trim != TrimMedian && (c.Trim < 0 || c.Trim > maxGroup/2):
		return fmt.Errorf("%w: trim %d must be %d (median) or in [0, %d]", ErrConfig, c.Trim, TrimMedian, maxGroup/2)
	case c.ClipFactor != 0 && !(c.ClipFactor >= 1 && c.ClipFactor <= 1e6):
		return fmt.Errorf("%w: clip factor %g must be 0 (off) or in [1, 1e6]", ErrConfig, c.ClipFactor)
	}
	return nil
}

// EffectiveTrim is the trim applied to k contributions: (k-1)/2 for
// TrimMedian, else Trim lowered so that at least one value is kept
// (k >= 2t+1). It is also the most hostile contributors of k that keep
// every coordinate within the honest range.
func (c RobustConfig) EffectiveTrim(k int) int {
	t := c.Trim
	if t == TrimMedian || k < 2*t+1 {
		t = (k - 1) / 2
	}
	return max(t, 0)
}

// Aggregate writes into out the robust aggregate of inputs (each len(out)
// long, in a fixed order): each clipped to ClipFactor times the median norm,
// then the trimmed mean with EffectiveTrim. The inputs are not modified.
// scratch is reused between calls when large enough.
func (c RobustConfig) Aggregate(out []float32, inputs [][]float32, scratch []float32) []float32 {
	return TrimmedMean(out, ClipNorms(inputs, c.ClipFactor), c.EffectiveTrim(len(inputs)), scratch)
}

// ClipNorms returns inputs with every one whose L2 norm exceeds factor
// times the lower median of their norms scaled down to that bound; the
// others (and the slice, when none is clipped or factor is 0) are shared,
// never modified. Norms are summed in float64 in index order and the scale
// is applied in float32, so every member computes the same bits.
func ClipNorms(inputs [][]float32, factor float64) [][]float32 {
	if factor <= 0 || len(inputs) < 2 {
		return inputs
	}
	norms := make([]float64, len(inputs))
	if len(inputs) == 8 && sameLen(inputs) {
		sumSquares8(norms, inputs)
	} else {
		for i, x := range inputs {
			var s float64
			for _, v := range x {
				s += float64(v) * float64(v)
			}
			norms[i] = s
		}
	}
	for i, s := range norms {
		norms[i] = math.Sqrt(s)
	}
	sorted := slices.Clone(norms)
	slices.Sort(sorted)
	bound := factor * sorted[(len(sorted)-1)/2]
	var out [][]float32
	for i, x := range inputs {
		if !(norms[i] > bound) {
			continue
		}
		if out == nil {
			out = slices.Clone(inputs)
		}
		scale := float32(bound / norms[i])
		y := make([]float32, len(x))
		for j, v := range x {
			y[j] = v * scale
		}
		out[i] = y
	}
	if out == nil {
		return inputs
	}
	return out
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
	if k <= netMax {
		trimmedMeanNet(out, inputs, t)
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

// netMax is the most contributions that TrimmedMean sorts with a network.
const netMax = 16

// sortNets[k] is a sorting network for k values (k <= 8: size-optimal
// ones, known from Knuth, TAOCP 5.3.4), as compare-exchange pairs in
// order; larger k take odd-even transposition (oddEvenNet). Tests check
// each on every 0-1 input, which suffices (the 0-1 principle).
var sortNets = func() (nets [netMax + 1][][2]uint8) {
	nets[2] = [][2]uint8{{0, 1}}
	nets[3] = [][2]uint8{{0, 2}, {0, 1}, {1, 2}}
	nets[4] = [][2]uint8{{0, 2}, {1, 3}, {0, 1}, {2, 3}, {1, 2}}
	nets[5] = [][2]uint8{{0, 3}, {1, 4}, {0, 2}, {1, 3}, {0, 1}, {2, 4}, {1, 2}, {3, 4}, {2, 3}}
	nets[6] = [][2]uint8{{0, 5}, {1, 3}, {2, 4}, {1, 2}, {3, 4}, {0, 3}, {2, 5}, {0, 1}, {2, 3}, {4, 5}, {1, 2}, {3, 4}}
	nets[7] = [][2]uint8{{0, 6}, {2, 3}, {4, 5}, {0, 2}, {1, 4}, {3, 6}, {0, 1}, {2, 5}, {3, 4}, {1, 2}, {4, 6}, {2, 3}, {4, 5}, {1, 2}, {3, 4}, {5, 6}}
	nets[8] = [][2]uint8{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {0, 4}, {1, 5}, {2, 6}, {3, 7}, {0, 1}, {2, 3}, {4, 5}, {6, 7}, {2, 4}, {3, 5}, {1, 4}, {3, 6}, {1, 2}, {3, 4}, {5, 6}}
	for k := 9; k <= netMax; k++ {
		nets[k] = oddEvenNet(k)
	}
	return nets
}()

// oddEvenNet is odd-even transposition sort's network for k values.
func oddEvenNet(k int) [][2]uint8 {
	var net [][2]uint8
	for r := range k {
		for j := r & 1; j+1 < k; j += 2 {
			net = append(net, [2]uint8{uint8(j), uint8(j + 1)})
		}
	}
	return net
}

// trimmedMeanNet is TrimmedMean for 2 <= len(inputs) <= netMax and t > 0:
// each coordinate's values sorted by a sorting network on ordered integer
// keys (no branch to mispredict, where a comparison sort costs several per
// coordinate), the kept ones summed in increasing order as the sort would.
// The sum is the same bits: equal keys are equal values, and -0 (ordered
// before +0 here, equal to it for slices.Sort) adds to a float64 sum that
// starts at +0 as +0 does. A NaN sorts beyond +-Inf, by its sign, and is
// trimmed before any finite value.
func trimmedMeanNet(out []float32, inputs [][]float32, t int) {
	k := len(inputs)
	kept := float64(k - 2*t)
	if k == 8 {
		median8(out, inputs, t)
		return
	}
	net := sortNets[k]
	var key [netMax]int32
	for i := range out {
		for j, x := range inputs {
			key[j] = orderedKey(x[i])
		}
		for _, c := range net {
			a, b := key[c[0]&(netMax-1)], key[c[1]&(netMax-1)]
			key[c[0]&(netMax-1)], key[c[1]&(netMax-1)] = min(a, b), max(a, b)
		}
		var s float64
		for _, y := range key[t : k-t] {
			s += float64(fromOrderedKey(y))
		}
		out[i] = float32(s / kept)
	}
}

// orderedKey maps a float32 to an int32 whose order is the floats' (with
// -0 before +0): a negative float's magnitude bits are flipped.
func orderedKey(v float32) int32 {
	b := int32(math.Float32bits(v))
	return b ^ int32(uint32(b>>31)>>1)
}

// fromOrderedKey inverts orderedKey.
func fromOrderedKey(k int32) float32 {
	return math.Float32frombits(uint32(k ^ int32(uint32(k>>31)>>1)))
}

// median8 is trimmedMeanNet for 8 contributions, the network unrolled on
// registers; the median (t = 3, TrimMedian's) by median8AVX2 where the
// CPU has AVX2, which does the same operations 8 coordinates at a time
// (TestMedian8AsmBits).
func median8(out []float32, inputs [][]float32, t int) {
	kept := float64(8 - 2*t)
	x0, x1, x2, x3, x4, x5, x6, x7 := inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], inputs[5], inputs[6], inputs[7]
	n := len(out)
	x0, x1, x2, x3, x4, x5, x6, x7 = x0[:n], x1[:n], x2[:n], x3[:n], x4[:n], x5[:n], x6[:n], x7[:n]
	cx := func(a, b int32) (int32, int32) { return min(a, b), max(a, b) }
	var key [8]int32
	i := 0
	if t == 3 && hasMedianAsm { // the default rule: 8 coordinates a pass
		i = median8Asm(out, inputs)
	}
	for ; i < n; i++ {
		k0, k1, k2, k3 := orderedKey(x0[i]), orderedKey(x1[i]), orderedKey(x2[i]), orderedKey(x3[i])
		k4, k5, k6, k7 := orderedKey(x4[i]), orderedKey(x5[i]), orderedKey(x6[i]), orderedKey(x7[i])
		k0, k2 = cx(k0, k2)
		k1, k3 = cx(k1, k3)
		k4, k6 = cx(k4, k6)
		k5, k7 = cx(k5, k7)
		k0, k4 = cx(k0, k4)
		k1, k5 = cx(k1, k5)
		k2, k6 = cx(k2, k6)
		k3, k7 = cx(k3, k7)
		k0, k1 = cx(k0, k1)
		k2, k3 = cx(k2, k3)
		k4, k5 = cx(k4, k5)
		k6, k7 = cx(k6, k7)
		k2, k4 = cx(k2, k4)
		k3, k5 = cx(k3, k5)
		k1, k4 = cx(k1, k4)
		k3, k6 = cx(k3, k6)
		k1, k2 = cx(k1, k2)
		k3, k4 = cx(k3, k4)
		k5, k6 = cx(k5, k6)
		if t == 3 { // the median; a sum that starts at +0, as below
			var s float64
			out[i] = float32((s + float64(fromOrderedKey(k3)) + float64(fromOrderedKey(k4))) / 2)
			continue
		}
		key = [8]int32{k0, k1, k2, k3, k4, k5, k6, k7}
		var s float64
		for _, y := range key[t : 8-t] {
			s += float64(fromOrderedKey(y))
		}
		out[i] = float32(s / kept)
	}
}

// sameLen reports whether every input has the first's length.
func sameLen(inputs [][]float32) bool {
	for _, x := range inputs {
		if len(x) != len(inputs[0]) {
			return false
		}
	}
	return true
}

// sumSquares8 writes each of 8 inputs' sum of squares (float64, in index
// order: the bits of one input's loop) into sums, the eight chains of
// dependent adds interleaved in one loop, where one at a time waits on
// each add.
func sumSquares8(sums []float64, inputs [][]float32) {
	n := len(inputs[0])
	x0, x1, x2, x3 := inputs[0][:n], inputs[1][:n], inputs[2][:n], inputs[3][:n]
	x4, x5, x6, x7 := inputs[4][:n], inputs[5][:n], inputs[6][:n], inputs[7][:n]
	var s0, s1, s2, s3, s4, s5, s6, s7 float64
	for i := range n {
		s0 += float64(x0[i]) * float64(x0[i])
		s1 += float64(x1[i]) * float64(x1[i])
		s2 += float64(x2[i]) * float64(x2[i])
		s3 += float64(x3[i]) * float64(x3[i])
		s4 += float64(x4[i]) * float64(x4[i])
		s5 += float64(x5[i]) * float64(x5[i])
		s6 += float64(x6[i]) * float64(x6[i])
		s7 += float64(x7[i]) * float64(x7[i])
	}
	copy(sums, []float64{s0, s1, s2, s3, s4, s5, s6, s7})
}
