package optimizer

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
)

// AdamW.Step makes one kernels call for the whole stage, the clip's scale
// folded in, and gives the bits of the per-tensor steps after Scale (the
// rule as written before): with and without clipping, over several steps,
// on whole and partial stages (the head's tied embedding included).
func TestAdamWStepMatchesPerTensor(t *testing.T) {
	c, err := model.Preset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	for _, spec := range []model.StageSpec{model.FullSpec(c), {FirstLayer: 1, LastLayer: 2}} {
		for _, clip := range []float64{0, 1e-3} {
			dev := kernels.NewCPU(2)
			a, err := model.NewStage(dev, c, spec, 1, 8, 7)
			if err != nil {
				t.Fatal(err)
			}
			b, err := model.NewStage(dev, c, spec, 1, 8, 7)
			if err != nil {
				t.Fatal(err)
			}
			cfg := DefaultAdamW()
			cfg.Clip, cfg.WeightDecay = clip, 0.1
			opt, err := NewAdamW(cfg)
			if err != nil {
				t.Fatal(err)
			}
			n := a.Params.Len()
			r := rand.New(rand.NewPCG(1, uint64(n)))
			g := make([]float32, n)
			clipped := false
			for step := range 4 {
				for i := range g {
					g[i] = float32(r.NormFloat64() * 0.01)
				}
				dev.CopyIn(a.Grads, g)
				dev.CopyIn(b.Grads, g)
				norm, lr, err := opt.Step(a, step)
				if err != nil {
					t.Fatal(err)
				}
				if len(opt.ends) != len(a.Tensors()) {
					t.Fatalf("%d segments for %d tensors: Step did not take the one-call path", len(opt.ends), len(a.Tensors()))
				}
				// The reference: Scale, then AdamW a tensor.
				if clip > 0 && norm > clip {
					clipped = true
					dev.Scale(b.Grads, float32(clip/norm))
				}
				for _, tn := range b.Tensors() {
					wd := float32(0)
					if tn.Decay {
						wd = float32(cfg.WeightDecay)
					}
					sl := func(x kernels.Buffer) kernels.Buffer { return x.Slice(tn.Offset, tn.Size()) }
					dev.AdamW(sl(b.Params), sl(b.Grads), sl(b.M), sl(b.V), float32(lr), float32(cfg.Beta1), float32(cfg.Beta2), float32(cfg.Eps), wd, step+1)
				}
				for _, pair := range [][2]kernels.Buffer{{a.Params, b.Params}, {a.M, b.M}, {a.V, b.V}} {
					x, y := make([]float32, n), make([]float32, n)
					dev.CopyOut(x, pair[0])
					dev.CopyOut(y, pair[1])
					for i := range x {
						if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
							t.Fatalf("spec %+v clip %v step %d: [%d] %v, per tensor %v", spec, clip, step, i, x[i], y[i])
						}
					}
				}
			}
			if clip > 0 && !clipped {
				t.Fatalf("clip %v never clipped: the test does not test the folded scale", clip)
			}
		}
	}
}
