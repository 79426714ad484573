package optimizer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestTrimmedMean(t *testing.T) {
	tests := []struct {
		name   string
		inputs [][]float32
		trim   int
		want   []float32
	}{
		{"plain mean", [][]float32{{1, 2}, {3, 4}, {5, 12}}, 0, []float32{3, 6}},
		{"median of 3", [][]float32{{1, -9}, {100, 0}, {2, 5}}, 1, []float32{2, 0}},
		{"trim 1 of 5", [][]float32{{1}, {2}, {3}, {4}, {1000}}, 1, []float32{3}},
		{"trim lowered to keep one", [][]float32{{1}, {5}}, 3, []float32{3}},
		{"no inputs", nil, 1, []float32{0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := []float32{7, 7}[:len(tt.want)]
			TrimmedMean(out, tt.inputs, tt.trim, nil)
			if !slices.Equal(out, tt.want) {
				t.Fatalf("got %v, want %v", out, tt.want)
			}
		})
	}
}

func TestEffectiveTrim(t *testing.T) {
	tests := []struct {
		trim int
		k    []int // contributors
		want []int
	}{
		{TrimMedian, []int{0, 1, 2, 3, 4, 5, 6, 7, 10, 16}, []int{0, 0, 0, 1, 1, 2, 2, 3, 4, 7}},
		{0, []int{1, 7}, []int{0, 0}},
		{1, []int{1, 2, 3, 7, 16}, []int{0, 0, 1, 1, 1}},
		{3, []int{4, 5, 7, 16}, []int{1, 2, 3, 3}},
	}
	for _, tt := range tests {
		for i, k := range tt.k {
			if got := (RobustConfig{Trim: tt.trim}).EffectiveTrim(k); got != tt.want[i] {
				t.Errorf("trim %d, %d contributors: %d, want %d", tt.trim, k, got, tt.want[i])
			}
		}
	}
}

// hostileInput is one of the shapes an attacker's contribution takes.
func hostileInput(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	switch r.IntN(4) {
	case 0: // huge
		for i := range x {
			x[i] = 1e6 * float32(r.NormFloat64())
		}
	case 1: // sign flip of a plausible value, scaled
		for i := range x {
			x[i] = -50 * float32(r.NormFloat64())
		}
	case 2: // constant offset
		for i := range x {
			x[i] = 3000
		}
	default: // just past the honest range on one side
		for i := range x {
			x[i] = 1.5
		}
	}
	return x
}

// At the breakdown point (t hostile of k = 2t+1 contributors) and below
// it, every coordinate of the trimmed mean lies within the honest values'
// range, whatever the hostile values, with and without the norm clip.
func TestTrimmedMeanBreakdown(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const n = 16
	for trial := range 2000 {
		tr := 1 + r.IntN(3)
		k := 2*tr + 1 + r.IntN(3)
		hostile := tr
		inputs := make([][]float32, k)
		lo, hi := make([]float32, n), make([]float32, n)
		for i := range lo {
			lo[i], hi[i] = float32(math.Inf(1)), float32(math.Inf(-1))
		}
		for j := range inputs {
			if j < hostile {
				inputs[j] = hostileInput(r, n)
				continue
			}
			x := make([]float32, n)
			for i := range x {
				x[i] = float32(r.NormFloat64())
				lo[i], hi[i] = min(lo[i], x[i]), max(hi[i], x[i])
			}
			inputs[j] = x
		}
		r.Shuffle(k, func(a, b int) { inputs[a], inputs[b] = inputs[b], inputs[a] })
		for _, cfg := range []RobustConfig{{Trim: tr}, {Trim: tr, ClipFactor: 4}} {
			out := make([]float32, n)
			cfg.Aggregate(out, inputs, nil)
			for i, v := range out {
				// The clip scales honest inputs only when they exceed 4x
				// the median norm, which these never do; a clipped hostile
				// input only moves closer to 0, inside or toward the range.
				if v < lo[i] || v > hi[i] {
					t.Fatalf("trial %d (k=%d, t=%d, %+v): coordinate %d = %g outside the honest range [%g, %g]",
						trial, k, tr, cfg, i, v, lo[i], hi[i])
				}
			}
		}
	}
}

func TestClipNorms(t *testing.T) {
	a, b, c := []float32{3, 4}, []float32{0, 5}, []float32{600, 800} // norms 5, 5, 1000
	tests := []struct {
		name   string
		inputs [][]float32
		factor float64
		want   [][]float32
	}{
		{"off", [][]float32{a, b, c}, 0, [][]float32{a, b, c}},
		{"within the bound", [][]float32{a, b}, 4, [][]float32{a, b}},
		{"one clipped to 4x the median", [][]float32{a, c, b}, 4, [][]float32{a, {12, 16}, b}},
		{"lower median of an even count", [][]float32{a, c}, 2, [][]float32{a, {6, 8}}},
		{"one input", [][]float32{c}, 1, [][]float32{c}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := slices.Clone(c)
			got := ClipNorms(tt.inputs, tt.factor)
			if !slices.EqualFunc(got, tt.want, func(x, y []float32) bool { return slices.Equal(x, y) }) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			if !slices.Equal(c, before) {
				t.Fatal("an input was modified")
			}
		})
	}
}

// With the plain mean, the clip bounds what hostile members add: the
// mean's distance from the honest members' share of it is at most
// t * factor * (largest honest norm) / k, for any hostile values.
func TestClipBoundsTheMean(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n, factor = 32, 4.0
	for trial := range 500 {
		k := 3 + r.IntN(8)
		tr := (k - 1) / 2 // fewer than half hostile
		inputs := make([][]float32, k)
		honestSum := make([]float64, n)
		var maxNorm float64
		for j := range inputs {
			if j < tr {
				inputs[j] = hostileInput(r, n)
				continue
			}
			x := make([]float32, n)
			var s float64
			for i := range x {
				x[i] = float32(r.NormFloat64())
				s += float64(x[i]) * float64(x[i])
				honestSum[i] += float64(x[i])
			}
			maxNorm = max(maxNorm, math.Sqrt(s))
			inputs[j] = x
		}
		out := make([]float32, n)
		RobustConfig{ClipFactor: factor}.Aggregate(out, inputs, nil)
		var d float64
		for i := range out {
			e := float64(out[i]) - honestSum[i]/float64(k)
			d += e * e
		}
		if bound := float64(tr) * factor * maxNorm / float64(k); math.Sqrt(d) > bound*(1+1e-5) {
			t.Fatalf("trial %d: the hostile share has norm %g, bound %g", trial, math.Sqrt(d), bound)
		}
	}
}

func TestRobustConfigValidate(t *testing.T) {
	for _, c := range []RobustConfig{{Trim: -2}, {Trim: maxGroup/2 + 1}, {ClipFactor: 0.5}, {ClipFactor: math.NaN()}, {ClipFactor: math.Inf(1)}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if err := DefaultRobust().Validate(); err != nil {
		t.Fatal(err)
	}
}

// colluders returns m inputs of n values, f of them hostile and identical:
// each puts its whole norm budget, all positive, into the first hot
// coordinates (its 1e4 per coordinate is clipped to 4x the median norm).
// lo and hi are the honest values' range per coordinate.
func colluders(r *rand.Rand, m, f, n, hot int) (inputs [][]float32, lo, hi []float32) {
	lo, hi = make([]float32, n), make([]float32, n)
	for i := range lo {
		lo[i], hi[i] = float32(math.Inf(1)), float32(math.Inf(-1))
	}
	bad := make([]float32, n)
	for i := range hot {
		bad[i] = 1e4
	}
	for j := range m {
		if j < f {
			inputs = append(inputs, bad)
			continue
		}
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
			lo[i], hi[i] = min(lo[i], x[i]), max(hi[i], x[i])
		}
		inputs = append(inputs, x)
	}
	r.Shuffle(m, func(a, b int) { inputs[a], inputs[b] = inputs[b], inputs[a] })
	return inputs, lo, hi
}

// The default rule against colluders that concentrate their norm budget in
// a few coordinates: up to the breakdown point, (M-1)/2 hostile of M, every
// coordinate of the aggregate stays within the honest values' range; one
// colluder more moves some coordinate more than the honest spread past it
// (the bound is tight). The aggregate is the same bits in any input order.
func TestRobustBreakdownColluders(t *testing.T) {
	const n = 64
	r := rand.New(rand.NewPCG(5, 6))
	for _, tt := range []struct{ m, breakdown int }{{4, 1}, {7, 3}, {10, 4}, {16, 7}} {
		for f := 1; f <= tt.breakdown+1; f++ {
			t.Run(fmt.Sprintf("%d of %d", f, tt.m), func(t *testing.T) {
				c := DefaultRobust()
				for trial := range 20 {
					inputs, lo, hi := colluders(r, tt.m, f, n, 1+trial%3)
					out := make([]float32, n)
					c.Aggregate(out, inputs, nil)
					var worst float32 // the furthest past the honest range, in honest spreads
					for i, v := range out {
						worst = max(worst, (v-hi[i])/(hi[i]-lo[i]), (lo[i]-v)/(hi[i]-lo[i]))
					}
					if f <= tt.breakdown && worst > 0 {
						t.Fatalf("trial %d: a coordinate %g honest spreads outside the honest range", trial, worst)
					}
					if f > tt.breakdown && !(worst > 1) {
						t.Fatalf("trial %d: past the breakdown point the aggregate stays within %g spreads", trial, worst)
					}
					r.Shuffle(len(inputs), func(a, b int) { inputs[a], inputs[b] = inputs[b], inputs[a] })
					again := make([]float32, n)
					c.Aggregate(again, inputs, nil)
					if !slices.EqualFunc(out, again, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
						t.Fatalf("trial %d: other bits in another order: %v, %v", trial, out, again)
					}
				}
			})
		}
	}
}

// The sorting network gives the bits a comparison sort gave, whatever the
// ties, zeros of either sign and magnitudes, for every group size and trim.
func TestTrimmedMeanNetMatchesSort(t *testing.T) {
	ref := func(out []float32, inputs [][]float32, t int) {
		k := len(inputs)
		if 2*t >= k {
			t = (k - 1) / 2
		}
		v := make([]float32, k)
		for i := range out {
			for j, x := range inputs {
				v[j] = x[i]
			}
			slices.Sort(v)
			var s float64
			for _, y := range v[t : k-t] {
				s += float64(y)
			}
			out[i] = float32(s / float64(k-2*t))
		}
	}
	r := rand.New(rand.NewPCG(7, 8))
	negZero := float32(math.Copysign(0, -1))
	draw := func() float32 {
		switch r.IntN(6) {
		case 0:
			return 0
		case 1:
			return negZero
		case 2:
			return float32(r.IntN(5) - 2) // ties
		case 3:
			return float32(r.NormFloat64() * 1e30)
		case 4:
			return float32(r.NormFloat64() * 1e-30)
		}
		return float32(r.NormFloat64())
	}
	for k := 3; k <= netMax+2; k++ {
		for trim := 1; 2*trim < k; trim++ {
			inputs := make([][]float32, k)
			for j := range inputs {
				inputs[j] = make([]float32, 500)
				for i := range inputs[j] {
					inputs[j][i] = draw()
				}
			}
			got, want := make([]float32, 500), make([]float32, 500)
			TrimmedMean(got, inputs, trim, nil)
			ref(want, inputs, trim)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("k %d trim %d coordinate %d: %v, the sort gives %v", k, trim, i, got[i], want[i])
				}
			}
		}
	}
	// A NaN sorts beyond the finite values and is trimmed.
	nan := float32(math.NaN())
	out := make([]float32, 1)
	TrimmedMean(out, [][]float32{{1}, {nan}, {2}, {-nan}, {3}}, 1, nil)
	if out[0] != 2 {
		t.Fatalf("median of 1, NaN, 2, -NaN, 3 is %v, want 2", out[0])
	}
}

// BenchmarkTrimmedMean is the median of 8 contributions of a butterfly
// part, GPT-2 small's 124M over 8 members.
func BenchmarkTrimmedMean(b *testing.B) {
	const n = 124_439_808 / 8
	r := rand.New(rand.NewPCG(1, 2))
	inputs := make([][]float32, 8)
	for j := range inputs {
		inputs[j] = make([]float32, n)
		for i := range inputs[j] {
			inputs[j][i] = float32(r.NormFloat64())
		}
	}
	out := make([]float32, n)
	b.SetBytes(8 * 4 * n)
	b.ResetTimer()
	for range b.N {
		TrimmedMean(out, inputs, 3, nil)
	}
}

// Every network sorts every 0-1 input, so it sorts every input.
func TestSortNets(t *testing.T) {
	for k := 2; k <= netMax; k++ {
		for bits := range 1 << k {
			var v [netMax]int32
			for j := range k {
				v[j] = int32(bits >> j & 1)
			}
			for _, c := range sortNets[k] {
				a, b := v[c[0]], v[c[1]]
				v[c[0]], v[c[1]] = min(a, b), max(a, b)
			}
			if !slices.IsSorted(v[:k]) {
				t.Fatalf("network for %d leaves %v unsorted", k, v[:k])
			}
		}
	}
}

// Eight inputs' norms, summed side by side, are each input's own loop's
// bits: the clipped input is scaled by the same float32.
func TestClipNorms8MatchesLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	inputs := make([][]float32, 8)
	for j := range inputs {
		inputs[j] = make([]float32, 10_001)
		for i := range inputs[j] {
			inputs[j][i] = float32(r.NormFloat64() * math.Exp(4*r.NormFloat64()))
		}
	}
	for i := range inputs[5] {
		inputs[5][i] *= 100
	}
	norm := func(x []float32) float64 {
		var s float64
		for _, v := range x {
			s += float64(v) * float64(v)
		}
		return math.Sqrt(s)
	}
	norms := make([]float64, 8)
	for j, x := range inputs {
		norms[j] = norm(x)
	}
	sorted := slices.Clone(norms)
	slices.Sort(sorted)
	scale := float32(4 * sorted[3] / norms[5])
	out := ClipNorms(inputs, 4)
	for j := range out {
		for i, v := range out[j] {
			want := inputs[j][i]
			if j == 5 {
				want *= scale
			}
			if math.Float32bits(v) != math.Float32bits(want) {
				t.Fatalf("input %d [%d]: %v, want %v", j, i, v, want)
			}
		}
	}
}
