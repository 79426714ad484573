package pipeline

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// CheckFree (ALGORITHMS.md 4) recovers a lost stage without checkpoints: an
// intermediate stage i is rebuilt as the average of its neighbours i-1 and
// i+1, each weighted by the norm of its last gradient, and starts a fresh
// optimizer at RebuildLRFactor times the learning rate. CheckFree+ makes
// the edge stages (1 and S-1, which have only one transformer neighbour
// that can stand in for them) recoverable too: odd microbatches swap the
// execution order of stages (1, 2) and (S-2, S-1), so each of those stages
// also learns its partner's role, and a lost one is copied from it.
//
// Trust: what survivors serve is their word. Combine takes a neighbouring
// stage's weights and norm as medians over its survivors, refusing values
// that are not finite and capping the norms at the run's gradient clip,
// and Rebuild caps either side's weight at MaxNormRatio times the other's,
// so no claim makes the rebuilt stage a copy of one neighbour's weights.

// GradNormEpsilon is added to each neighbour's gradient norm so that two
// neighbours with zero gradients still average evenly.
const GradNormEpsilon = 1e-4

// RebuildLRFactor is the learning-rate multiplier of a rebuilt stage's fresh
// optimizer: the paper uses 1.1-1.2x; we take the middle.
const RebuildLRFactor = 1.15

// RebuildWeight is a neighbour's weight in the rebuild: ||g|| + 1e-4, the
// norm being of its last clipped gradient.
func RebuildWeight(gradNorm float64) float64 { return gradNorm + GradNormEpsilon }

// MaxNormRatio caps either neighbour's weight in Rebuild at this multiple
// of the other's: whatever norm one side claims, its share of the rebuilt
// stage is at most 4/5. Honest neighbours' norms, both clipped to the
// run's gradient clip, seldom differ by more.
const MaxNormRatio = 4

// Rebuild writes the lost stage's weights into dst:
//
//	dst = (w_next*next + w_prev*prev) / (w_next + w_prev),  w_j = ||g_j|| + 1e-4
//
// with each w_j capped at MaxNormRatio times the other. prev and next are
// the neighbours' flat parameter buffers, of dst's length. The two
// coefficients are computed once in float64 and every product is
// rounded to float32 before the sum (explicit conversions, so no platform
// fuses a multiply-add), which makes the result bit-identical on every node
// that rebuilds the same stage.
func Rebuild(dst, prev, next []float32, prevGradNorm, nextGradNorm float64) error {
	if len(prev) != len(dst) || len(next) != len(dst) {
		return fmt.Errorf("%w: rebuild into %d values from %d and %d", ErrShape, len(dst), len(prev), len(next))
	}
	for _, n := range []float64{prevGradNorm, nextGradNorm} {
		if !(n >= 0) || math.IsInf(n, 0) {
			return fmt.Errorf("%w: %v", ErrNorm, n)
		}
	}
	wp, wn := RebuildWeight(prevGradNorm), RebuildWeight(nextGradNorm)
	wp, wn = min(wp, MaxNormRatio*wn), min(wn, MaxNormRatio*wp)
	m := max(wp, wn) // so that the sum of two huge claims does not overflow
	wp, wn = wp/m, wn/m
	a := float32(wn / (wn + wp)) // next's share
	b := float32(wp / (wn + wp)) // prev's share
	for i := range dst {
		dst[i] = float32(a*next[i]) + float32(b*prev[i])
	}
	return nil
}

// Survivor is what one member of a neighbouring stage served for a
// rebuild: its weights and the norm of its last gradient, as it claims.
type Survivor struct {
	Weights []float32
	Norm    float64
}

// Combine writes into dst the weights a rebuild takes from the survivors
// of one neighbouring stage, and returns that stage's gradient norm for
// Rebuild: the coordinate median of their weights and the median of their
// norms, each norm first capped at maxNorm (the run's gradient clip, to
// which an honest replica's last norm is clipped; 0: no cap). Fewer than
// half of the survivors move neither; a side with one or two survivors is
// theirs, and Rebuild's MaxNormRatio bounds its share. The median is of
// sorted values, so every node that combines the same survivors, in any
// order, gets the same bits. Weights of another length (ErrShape) or not
// finite (ErrWeights), or a norm negative or not finite (ErrNorm), are
// refused.
func Combine(dst []float32, from []Survivor, maxNorm float64) (float64, error) {
	if len(from) == 0 {
		return 0, fmt.Errorf("%w: no survivors to combine", ErrShape)
	}
	norms := make([]float64, len(from))
	for i, s := range from {
		if len(s.Weights) != len(dst) {
			return 0, fmt.Errorf("%w: survivor %d serves %d values, want %d", ErrShape, i, len(s.Weights), len(dst))
		}
		if !(s.Norm >= 0) || math.IsInf(s.Norm, 0) {
			return 0, fmt.Errorf("%w: survivor %d claims %v", ErrNorm, i, s.Norm)
		}
		if j := nonFinite(s.Weights); j >= 0 {
			return 0, fmt.Errorf("%w: survivor %d, value %d is %v", ErrWeights, i, j, s.Weights[j])
		}
		norms[i] = s.Norm
		if maxNorm > 0 {
			norms[i] = min(s.Norm, maxNorm)
		}
	}
	col := make([]float32, len(from))
	for i := range dst {
		for j, s := range from {
			col[j] = s.Weights[i]
		}
		dst[i] = float32(median(col))
	}
	return median(norms), nil
}

// median sorts x and returns its median (the mean of the two middle values
// for an even count).
func median[T float32 | float64](x []T) float64 {
	slices.Sort(x)
	k := len(x)
	if k%2 == 1 {
		return float64(x[k/2])
	}
	return (float64(x[k/2-1]) + float64(x[k/2])) / 2
}

// nonFinite is the index of the first value of x that is not finite, or -1.
func nonFinite(x []float32) int {
	for i, v := range x {
		if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) {
			return i
		}
	}
	return -1
}

// Recovery says how to rebuild a lost stage.
type Recovery struct {
	Lost int
	// From are the stages whose weights rebuild it: two neighbours to
	// average (Rebuild), or one to copy (CheckFree+ at an edge).
	From []int
}

// Copy reports whether the stage is copied from a single stage.
func (r Recovery) Copy() bool { return len(r.From) == 1 }

// Recover returns how to rebuild stage lost of stages. Intermediate stages
// 2..S-2 average their neighbours. Stages 1 and S-1 have a transformer
// neighbour on one side only (stage 0 is the embedding and head's, the
// other end is the head): with plus (CheckFree+) they are copied from their
// swap partner (2 and S-2; with 3 stages 2 and 1; with 4 stages the last has
// none, see CheckFreePlus), without it they are ErrUnrecoverable. Stage 0 is
// never rebuilt this way (ErrUnrecoverable): its embedding and head are
// restored from the copies neighbouring stages keep.
func Recover(lost, stages int, plus bool) (Recovery, error) {
	switch {
	case stages < 2 || lost < 0 || lost >= stages:
		return Recovery{}, fmt.Errorf("%w: stage %d of %d", ErrConfig, lost, stages)
	case lost == 0:
		return Recovery{}, fmt.Errorf("%w: stage 0 (embedding and head) is restored from copies, not from neighbours", ErrUnrecoverable)
	case lost >= 2 && lost <= stages-2:
		return Recovery{Lost: lost, From: []int{lost - 1, lost + 1}}, nil
	case !plus:
		return Recovery{}, fmt.Errorf("%w: edge stage %d of %d needs CheckFree+", ErrUnrecoverable, lost, stages)
	case stages < 3:
		return Recovery{}, fmt.Errorf("%w: stage %d has no swap partner in %d stages", ErrUnrecoverable, lost, stages)
	case lost == 1:
		return Recovery{Lost: 1, From: []int{2}}, nil
	case stages == 3: // lost == 2, the partner of the (1, 2) swap
		return Recovery{Lost: 2, From: []int{1}}, nil
	case stages == 4: // lost == 3: (2, 3) would overlap (1, 2), so it is never swapped
		return Recovery{}, fmt.Errorf("%w: with 4 stages CheckFree+ swaps only (1, 2); stage 3 has no partner", ErrUnrecoverable)
	default: // lost == stages-1
		return Recovery{Lost: lost, From: []int{stages - 2}}, nil
	}
}

// CheckFreePlus applies CheckFree+'s swap schedule to microbatch m's path:
// for odd m, wherever stages 1 and 2 are visited one right after the other
// they trade places (with their nodes), and likewise S-2 and S-1; even
// microbatches keep their path. Pairs are only swapped when both stages are
// on the path and neighbours in it, and when the two pairs are distinct
// stages (S >= 5), so each swap is one the swap rule counts. The input is
// not modified.
//
// Apply it to paths scheduled with no swaps of their own (Rules.MaxSwaps =
// 0): the result then has at most 2 swaps and obeys every rule with
// MaxSwaps = 2 (TestCheckFreePlusKeepsRules).
func CheckFreePlus(p Path, m, stages int) Path {
	q := p.Clone()
	if m%2 == 0 {
		return q
	}
	swapPair(q, 1, 2)
	if stages-2 > 2 {
		swapPair(q, stages-2, stages-1)
	}
	return q
}

// swapPair swaps the visits of stages a and b if b directly follows a.
func swapPair(p Path, a, b int) {
	for i := 1; i+1 < len(p.Stages); i++ {
		if p.Stages[i] == a && p.Stages[i+1] == b {
			p.Stages[i], p.Stages[i+1] = b, a
			p.Nodes[i], p.Nodes[i+1] = p.Nodes[i+1], p.Nodes[i]
			return
		}
	}
}

// The weights a node serves to a replacement of a neighbouring stage,
// little-endian: the float64 gradient norm, then n fp32 parameters. Its
// size is fixed by n, which both sides know; DecodeStageWeights checks it
// before reading, and refuses a norm or a parameter that is not finite.
func StageWeightsSize(n int) int { return 8 + 4*n }

func EncodeStageWeights(norm float64, params []float32) []byte {
	b := make([]byte, 0, StageWeightsSize(len(params)))
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(norm))
	for _, x := range params {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
	}
	return b
}

// DecodeStageWeights parses n parameters' weights; it never panics.
func DecodeStageWeights(b []byte, n int) (float64, []float32, error) {
	if n < 0 || n > len(b)/4 || len(b) != StageWeightsSize(n) { // n first: 4n must not overflow
		return 0, nil, fmt.Errorf("%w: stage weights of %d bytes cannot hold %d parameters", ErrShape, len(b), n)
	}
	norm := math.Float64frombits(binary.LittleEndian.Uint64(b))
	if math.IsNaN(norm) || math.IsInf(norm, 0) || norm < 0 {
		return 0, nil, fmt.Errorf("%w: stage weights with gradient norm %v", ErrNorm, norm)
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[8+4*i:]))
	}
	if i := nonFinite(out); i >= 0 {
		return 0, nil, fmt.Errorf("%w: parameter %d is %v", ErrWeights, i, out[i])
	}
	return norm, out, nil
}
