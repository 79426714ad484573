package trainer

import (
	"errors"
	"math"
	"testing"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/optimizer"
)

// Ten training steps of the tiny preset on the GPU follow the CPU's: the
// same batches, the same initial weights, the loss of every step and the
// final weights within the precision of the GEMMs. Skipped without a GPU.
func TestCUDATrainingParity(t *testing.T) {
	if c, err := kernels.OpenCUDA(0); errors.Is(err, kernels.ErrNoCUDA) {
		t.Skipf("no GPU to train on: %v", err)
	} else if err != nil {
		t.Fatal(err)
	} else {
		c.Close()
	}
	const steps = 10
	run := func(dev kernels.Device) ([]float32, []float32) {
		a := optimizer.DefaultAdamW()
		a.TotalSteps = steps
		// The corpus is this repository's kernels sources: a GPU machine may
		// have no Go installation for the default corpus.
		su, err := NewSetup(SetupConfig{Preset: "tiny", Batch: 8, Seed: 3, Dev: dev, AdamW: a, CorpusPaths: []string{"../kernels"}})
		if err != nil {
			t.Fatal(err)
		}
		defer su.Close()
		var losses []float32
		for i := 0; i < steps; i++ {
			r, err := su.Step(i)
			if err != nil {
				t.Fatal(err)
			}
			losses = append(losses, r.Loss)
		}
		p := make([]float32, su.Stage.NumParams())
		dev.CopyOut(p, su.Stage.Params)
		return losses, p
	}
	wantL, wantP := run(kernels.NewCPU(0))
	for _, tc := range []struct {
		name     string
		cfg      kernels.CUDAConfig
		lossTol  float64
		paramTol float64
	}{
		{"fp32", kernels.CUDAConfig{FP32: true}, 1e-4, 1e-4},
		{"tf32", kernels.CUDAConfig{}, 3e-3, 3e-3},
		{"tiled", kernels.CUDAConfig{NoCUBLAS: true}, 1e-4, 1e-4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := kernels.NewCUDA(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			gotL, gotP := run(c)
			for i := range wantL {
				d := math.Abs(float64(gotL[i]-wantL[i])) / float64(wantL[i])
				t.Logf("%s step %d: loss %.6f, CPU %.6f (relative difference %.2g)", c.Name(), i, gotL[i], wantL[i], d)
				if !(d <= tc.lossTol) {
					t.Errorf("step %d: loss %v, CPU %v", i, gotL[i], wantL[i])
				}
			}
			var num, den float64
			for i := range wantP {
				d := float64(gotP[i] - wantP[i])
				num += d * d
				den += float64(wantP[i]) * float64(wantP[i])
			}
			e := math.Sqrt(num / den)
			t.Logf("weights after %d steps: relative difference %.2g", steps, e)
			if !(e <= tc.paramTol) {
				t.Errorf("weights after %d steps differ by %.3g", steps, e)
			}
		})
	}
}
