package pipeline

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/skein-ml/skein/sim"
)

func TestRebuild(t *testing.T) {
	tests := []struct {
		name             string
		prev, next, want []float32
		gPrev, gNext     float64
		tol              float64
	}{
		{
			// Equal norms: equal weights, the plain mean; halves are exact.
			name: "equal norms", prev: []float32{1, 2, -3, 0}, next: []float32{3, -2, -5, 8},
			gPrev: 0.5, gNext: 0.5, want: []float32{2, 0, -4, 4},
		},
		{
			// Zero gradients on both sides: the 1e-4 keeps the weights equal
			// instead of 0/0.
			name: "zero norms", prev: []float32{4}, next: []float32{8},
			gPrev: 0, gNext: 0, want: []float32{6},
		},
		{
			// w_prev = 1 + 1e-4, w_next = 3 + 1e-4: next's share is
			// 3.0001/4.0002 = 0.74998750062..., so 4 + 4*0.74998750062 =
			// 6.9999500025 for (prev 4, next 8), and -1 + 2*0.7499875 =
			// 0.499975 for (prev -1, next 1).
			name: "weighted by gradient norm", prev: []float32{4, -1}, next: []float32{8, 1},
			gPrev: 1, gNext: 3, want: []float32{6.9999500025, 0.499975}, tol: 1e-6,
		},
		{
			// A neighbour with a far larger norm is capped at MaxNormRatio
			// times the other's: next's share is 4/5, -7 + 12*0.8 = 2.6.
			name: "larger norm capped", prev: []float32{-7}, next: []float32{5},
			gPrev: 0.5, gNext: 3, want: []float32{2.6}, tol: 1e-6,
		},
		{
			// A claimed norm of 1e300 (a hostile survivor) weighs as much as
			// a capped one, never making the rebuild a copy of its side.
			name: "huge claim capped", prev: []float32{-7}, next: []float32{5},
			gPrev: 0.5, gNext: 1e300, want: []float32{2.6}, tol: 1e-6,
		},
		{
			// Two huge claims do not overflow their sum: the plain mean.
			name: "two huge claims", prev: []float32{4}, next: []float32{8},
			gPrev: 1e308, gNext: 1e308, want: []float32{6},
		},
		{name: "empty", gPrev: 1, gNext: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := make([]float32, len(tt.prev))
			if err := Rebuild(dst, tt.prev, tt.next, tt.gPrev, tt.gNext); err != nil {
				t.Fatal(err)
			}
			for i := range dst {
				if d := math.Abs(float64(dst[i] - tt.want[i])); d > tt.tol*math.Abs(float64(tt.want[i])) {
					t.Errorf("dst[%d] = %v, want %v", i, dst[i], tt.want[i])
				}
			}
		})
	}
}

func TestRebuildRejects(t *testing.T) {
	a, b := make([]float32, 3), make([]float32, 3)
	if err := Rebuild(a, b, make([]float32, 2), 1, 1); !errors.Is(err, ErrShape) {
		t.Errorf("short next: %v", err)
	}
	for _, n := range []float64{-1, math.NaN(), math.Inf(1)} {
		if err := Rebuild(a, b, b, n, 1); !errors.Is(err, ErrNorm) {
			t.Errorf("norm %v: %v", n, err)
		}
	}
}

// Combine takes the coordinate median of a neighbouring stage's survivors
// and the median of their capped norms; a minority of liars moves neither,
// and values that are not finite are refused.
func TestCombine(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	honest := func(norm float64, w ...float32) Survivor { return Survivor{Weights: w, Norm: norm} }
	tests := []struct {
		name    string
		from    []Survivor
		maxNorm float64
		want    []float32
		norm    float64
		err     error
	}{
		{name: "one", from: []Survivor{honest(0.5, 1, -2)}, want: []float32{1, -2}, norm: 0.5},
		{name: "two: the mean", from: []Survivor{honest(0.5, 1, -2), honest(1.5, 3, 2)}, want: []float32{2, 0}, norm: 1},
		{name: "one liar of three", maxNorm: 1,
			from: []Survivor{honest(0.4, 1, -2), {Weights: []float32{1e30, -1e30}, Norm: 1e300}, honest(0.6, 1.5, -1)},
			want: []float32{1.5, -2}, norm: 0.6},
		{name: "two liars of five", maxNorm: 1,
			from: []Survivor{honest(0.3, 1), {Weights: []float32{1e30}, Norm: 1e300}, honest(0.4, 2), {Weights: []float32{1e30}, Norm: 1e300}, honest(0.5, 3)},
			want: []float32{3}, norm: 0.5},
		{name: "claims capped at the clip", maxNorm: 1, from: []Survivor{honest(1e300, 1), honest(1e300, 1)}, want: []float32{1}, norm: 1},
		{name: "NaN weights", from: []Survivor{honest(0.5, 1), honest(0.5, nan), honest(0.5, 1)}, err: ErrWeights},
		{name: "Inf weights", from: []Survivor{honest(0.5, inf)}, err: ErrWeights},
		{name: "NaN norm", from: []Survivor{honest(math.NaN(), 1)}, err: ErrNorm},
		{name: "negative norm", from: []Survivor{honest(-1, 1)}, err: ErrNorm},
		{name: "other length", from: []Survivor{honest(0.5, 1, 2)}, want: []float32{0}, err: ErrShape},
		{name: "none", err: ErrShape},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := len(tt.want)
			if n == 0 && len(tt.from) > 0 {
				n = len(tt.from[0].Weights)
			}
			dst := make([]float32, n)
			norm, err := Combine(dst, tt.from, tt.maxNorm)
			if !errors.Is(err, tt.err) {
				t.Fatalf("err %v, want %v", err, tt.err)
			}
			if err == nil && (norm != tt.norm || !slices.Equal(dst, tt.want)) {
				t.Fatalf("Combine = %v, norm %v; want %v, norm %v", dst, norm, tt.want, tt.norm)
			}
		})
	}
}

// TestRebuildConvex: every rebuilt value lies between its two neighbours'
// (a convex combination), whatever the norms.
func TestRebuildConvex(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	prev, next, dst := make([]float32, 256), make([]float32, 256), make([]float32, 256)
	for range 100 {
		for i := range prev {
			prev[i], next[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
		}
		if err := Rebuild(dst, prev, next, rng.ExpFloat64(), rng.ExpFloat64()); err != nil {
			t.Fatal(err)
		}
		for i := range dst {
			lo, hi := min(prev[i], next[i]), max(prev[i], next[i])
			if slack := 1e-6 * (1 + hi - lo); dst[i] < lo-slack || dst[i] > hi+slack {
				t.Fatalf("dst[%d] = %v outside [%v, %v]", i, dst[i], lo, hi)
			}
		}
	}
}

func TestRecover(t *testing.T) {
	tests := []struct {
		lost, stages int
		plus         bool
		from         []int
		err          error
	}{
		{2, 6, false, []int{1, 3}, nil},
		{4, 6, false, []int{3, 5}, nil},
		{1, 6, false, nil, ErrUnrecoverable},
		{5, 6, false, nil, ErrUnrecoverable},
		{1, 6, true, []int{2}, nil},
		{5, 6, true, []int{4}, nil},
		{0, 6, true, nil, ErrUnrecoverable},
		{2, 3, true, []int{1}, nil}, // S = 3: stage 2 is the last, its partner is 1
		{1, 2, true, nil, ErrUnrecoverable},
		{3, 4, true, nil, ErrUnrecoverable}, // (2,3) overlaps (1,2): never swapped
		{1, 4, true, []int{2}, nil},
		{6, 6, true, nil, ErrConfig},
	}
	for _, tt := range tests {
		r, err := Recover(tt.lost, tt.stages, tt.plus)
		if !errors.Is(err, tt.err) || (err == nil && !slices.Equal(r.From, tt.from)) {
			t.Errorf("Recover(%d, %d, %v) = %v, %v; want from %v, %v", tt.lost, tt.stages, tt.plus, r.From, err, tt.from, tt.err)
		}
	}
}

func TestCheckFreePlus(t *testing.T) {
	p := Path{Nodes: []int{10, 11, 12, 13, 14, 15}, Stages: []int{0, 1, 2, 3, 4, 5}}
	if got := CheckFreePlus(p, 0, 6); !slices.Equal(got.Stages, p.Stages) {
		t.Errorf("even microbatch reordered: %v", got.Stages)
	}
	got := CheckFreePlus(p, 1, 6)
	if want := []int{0, 2, 1, 3, 5, 4}; !slices.Equal(got.Stages, want) || !slices.Equal(got.Nodes, []int{10, 12, 11, 13, 15, 14}) {
		t.Errorf("odd microbatch: stages %v nodes %v, want stages %v with their nodes", got.Stages, got.Nodes, want)
	}
	if p.Stages[1] != 1 {
		t.Error("CheckFreePlus modified its input")
	}
	// A path that skips stage 2 has no (1, 2) pair to swap.
	skip := Path{Nodes: []int{10, 11, 13, 14, 15}, Stages: []int{0, 1, 3, 4, 5}}
	if got := CheckFreePlus(skip, 3, 6); !slices.Equal(got.Stages, []int{0, 1, 3, 5, 4}) {
		t.Errorf("skipping stage 2: %v", got.Stages)
	}
	// S = 4: the pairs (1,2) and (2,3) overlap; only (1,2) is swapped.
	four := Path{Nodes: []int{0, 1, 2, 3}, Stages: []int{0, 1, 2, 3}}
	if got := CheckFreePlus(four, 1, 4); !slices.Equal(got.Stages, []int{0, 2, 1, 3}) {
		t.Errorf("4 stages: %v", got.Stages)
	}
}

// TestCheckFreePlusKeepsRules: paths scheduled without swaps of their own,
// transformed by CheckFree+, obey every rule with MaxSwaps = 2, on random
// networks.
func TestCheckFreePlusKeepsRules(t *testing.T) {
	for seed := range uint64(cases(400)) {
		c := drawCase(t, seed)
		c.rules.MaxSwaps, c.rules.MaxJump = 0, 3
		pl, err := Plan(c.net, PlanConfig{Stages: c.rules.Stages, Mu: c.rules.Mu, Workload: c.w, MaxRounds: 1}, nil)
		if err != nil {
			continue
		}
		sc, err := SchedulePaths(c.net, pl, ScheduleConfig{Rules: c.rules, Workload: c.w, Seed: seed})
		if err != nil {
			continue
		}
		out := make([]Path, len(sc.Paths))
		for m, p := range sc.Paths {
			out[m] = CheckFreePlus(p, m, c.rules.Stages)
		}
		r := c.rules
		r.MaxSwaps = 2
		if err := Validate(out, pl, r); err != nil {
			t.Fatalf("seed %d %+v: %v", seed, r, err)
		}
		if _, err := Simulate(c.net, out, r.Stages, c.w, sim.Faults{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRecoverMatchesSwaps: whenever Recover copies an edge stage from a
// partner, CheckFree+ swaps exactly that pair on odd microbatches of the
// full path, so the partner has been trained in the lost stage's place.
func TestRecoverMatchesSwaps(t *testing.T) {
	for S := 3; S <= 12; S++ {
		full := Path{}
		for s := range S {
			full.Nodes, full.Stages = append(full.Nodes, s), append(full.Stages, s)
		}
		odd := CheckFreePlus(full, 1, S)
		for lost := 1; lost < S; lost++ {
			r, err := Recover(lost, S, true)
			if err != nil || !r.Copy() {
				continue
			}
			i, j := slices.Index(odd.Stages, lost), slices.Index(odd.Stages, r.From[0])
			if i != r.From[0] || j != lost { // the two trade positions
				t.Errorf("S=%d: stage %d copied from %d, but odd microbatches run them at positions %d and %d", S, lost, r.From[0], i, j)
			}
		}
	}
}
