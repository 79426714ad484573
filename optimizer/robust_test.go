package optimizer

import (
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
	for _, c := range []RobustConfig{{Trim: -1}, {ClipFactor: 0.5}, {ClipFactor: math.NaN()}, {ClipFactor: math.Inf(1)}} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
	if err := DefaultRobust().Validate(); err != nil {
		t.Fatal(err)
	}
}
