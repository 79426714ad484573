package pipeline

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
)

const testB, testT = 2, 16

func tinyConfig(t testing.TB) model.Config {
	c, err := model.Preset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestSplitLayers(t *testing.T) {
	c := tinyConfig(t) // 4 layers
	type r = [2]int
	for _, tc := range []struct {
		stages int
		want   []r // layer ranges; stage 0 embeds
		err    bool
	}{
		{stages: 1, want: []r{{0, 4}}},
		{stages: 2, want: []r{{0, 2}, {2, 4}}},
		{stages: 3, want: []r{{0, 1}, {1, 2}, {2, 4}}},
		{stages: 4, want: []r{{0, 1}, {1, 2}, {2, 3}, {3, 4}}},
		{stages: 5, want: []r{{0, 0}, {0, 1}, {1, 2}, {2, 3}, {3, 4}}},
		{stages: 6, err: true},
		{stages: 0, err: true},
	} {
		specs, err := SplitLayers(c, tc.stages)
		if (err != nil) != tc.err {
			t.Fatalf("%d stages: %v", tc.stages, err)
		}
		var got []r
		for s, sp := range specs {
			if sp.Embedding != (s == 0) || sp.Head {
				t.Errorf("%d stages: stage %d spec %+v", tc.stages, s, sp)
			}
			if err := sp.Validate(c); err != nil {
				t.Errorf("%d stages: stage %d: %v", tc.stages, s, err)
			}
			got = append(got, r{sp.FirstLayer, sp.LastLayer})
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%d stages: %v, want %v", tc.stages, got, tc.want)
		}
	}
}

func randVec(n int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 5))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	return x
}

func bitsEqual(a, b []float32) bool {
	return len(a) == len(b) && slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// TestModelRunnerRecomputeIsExact: two microbatches forwarded before
// either's backward make the runner recompute a forward; the input
// gradients and the accumulated parameter gradients are bit for bit those
// of a stage that ran each microbatch's forward and backward back to back
// (in the same order of backwards).
func TestModelRunnerRecomputeIsExact(t *testing.T) {
	c := tinyConfig(t)
	specs, err := SplitLayers(c, 3)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewModelRunner(ModelRunnerConfig{Device: kernels.NewCPU(1), Model: c, Specs: specs, Stage: 2, B: testB, T: testT, Seed: 3, Mu: 2})
	if err != nil {
		t.Fatal(err)
	}
	n := r.ActivationLen()
	in := [][]float32{randVec(n, 1), randVec(n, 2)}
	dout := [][]float32{randVec(n, 3), randVec(n, 4)}
	for mb := range 2 {
		if _, err := r.Forward(1, mb, in[mb]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Forward(1, 2, in[0]); err == nil {
		t.Fatal("a third microbatch past mu = 2 accepted")
	}
	var din [2][]float32
	for _, mb := range []int{0, 1} {
		if din[mb], err = r.Backward(1, mb, dout[mb]); err != nil {
			t.Fatal(err)
		}
	}
	if r.Recomputes() != 2 || r.Backwards() != 2 {
		t.Fatalf("%d recomputes, %d backwards; want 2, 2", r.Recomputes(), r.Backwards())
	}
	ref, err := model.NewStage(kernels.NewCPU(1), c, specs[2], testB, testT, 3)
	if err != nil {
		t.Fatal(err)
	}
	dev := ref.Device()
	ib, db := dev.Alloc(n), dev.Alloc(n)
	for _, mb := range []int{0, 1} {
		dev.CopyIn(ib, in[mb])
		if _, err := ref.Forward(nil, ib, nil); err != nil {
			t.Fatal(err)
		}
		dev.CopyIn(db, dout[mb])
		if err := ref.Backward(db); err != nil {
			t.Fatal(err)
		}
		want := make([]float32, n)
		dev.CopyOut(want, ref.InputGrad())
		if !bitsEqual(din[mb], want) {
			t.Fatalf("microbatch %d: input gradient differs", mb)
		}
	}
	for _, name := range r.GradNames() {
		want := make([]float32, ref.GradView(name).Len())
		dev.CopyOut(want, ref.GradView(name))
		if !bitsEqual(r.Grad(name), want) {
			t.Fatalf("%s: gradient differs", name)
		}
	}
	if _, err := r.Backward(1, 0, dout[0]); err == nil {
		t.Fatal("a second backward of microbatch 0 accepted")
	}
}
