package pipeline

import (
	"fmt"
	"math"

	"github.com/skein-ml/skein/sim"
)

// Workload is the model and microbatch a schedule is for, in the terms the
// cost model needs. DefaultWorkload is the SkipPipe paper's shape (6 stages
// of 4 layers) at our measured layer: the small preset's width.
type Workload struct {
	// Layers is the number of transformer layers, split over the stages.
	Layers int
	// LayerForward is one layer's forward over one microbatch on the
	// reference machine, in seconds.
	LayerForward float64
	// BackwardRatio is a backward's time over its forward's.
	BackwardRatio float64
	// LossFactor is stage 0's head and loss, as a fraction of its forward.
	LossFactor float64
	// ActivationBytes cross each stage boundary, forward (activations) and
	// backward (their gradients), per microbatch.
	ActivationBytes float64
	// ParamBytesPerLayer is what a layer costs a node to hold: parameters,
	// gradients and the two AdamW moments, fp32.
	ParamBytesPerLayer float64
	// StashBytesPerLayer is what one microbatch's forward keeps for the
	// backward, per layer.
	StashBytesPerLayer float64
}

// DefaultWorkload is 24 layers of the small preset's shape (C = 384, 6 heads,
// microbatch B = 8, T = 256), the layer whose step BENCHMARKS.md measures:
//   - LayerForward, BackwardRatio, LossFactor, ActivationBytes: sim's
//     measured constants (sim/measured.go says where each comes from);
//   - ParamBytesPerLayer: 16 bytes (fp32 value, gradient, two moments) times
//     12C^2 + 13C = 1,774,464 parameters = 28.4 MB;
//   - StashBytesPerLayer: 4 bytes times model.ActivationFloats's per-block
//     term 18NC + 4N + B*heads*T^2 (N = B*T = 2048) = 17,309,696 floats =
//     69.2 MB.
func DefaultWorkload() Workload {
	const (
		c, heads, b, t = 384, 6, 8, 256
		n              = b * t
	)
	return Workload{
		Layers:             24,
		LayerForward:       sim.RefLayerForwardSeconds,
		BackwardRatio:      sim.BackwardRatio,
		LossFactor:         sim.LossFactor,
		ActivationBytes:    sim.ActivationBytes,
		ParamBytesPerLayer: 16 * (12*c*c + 13*c),
		StashBytesPerLayer: 4 * (18*n*c + 4*n + b*heads*t*t),
	}
}

// Validate reports the first field out of range.
func (w Workload) Validate() error {
	switch {
	case w.Layers < 1 || w.Layers > 1<<12:
		return fmt.Errorf("%w: layers %d outside [1, 4096]", ErrConfig, w.Layers)
	case !positive(w.LayerForward):
		return fmt.Errorf("%w: layer forward %v s must be positive", ErrConfig, w.LayerForward)
	case !positive(w.BackwardRatio):
		return fmt.Errorf("%w: backward ratio %v must be positive", ErrConfig, w.BackwardRatio)
	case !nonNegative(w.LossFactor):
		return fmt.Errorf("%w: loss factor %v must be >= 0", ErrConfig, w.LossFactor)
	case !nonNegative(w.ActivationBytes) || !nonNegative(w.ParamBytesPerLayer) || !nonNegative(w.StashBytesPerLayer):
		return fmt.Errorf("%w: byte counts %v, %v, %v must be >= 0", ErrConfig, w.ActivationBytes, w.ParamBytesPerLayer, w.StashBytesPerLayer)
	}
	return nil
}

// StageLayers returns how many layers stage s of stages holds: an even
// split, the first Layers%stages stages taking one more.
func (w Workload) StageLayers(s, stages int) int {
	n := w.Layers / stages
	if s < w.Layers%stages {
		n++
	}
	return n
}

// Forward returns stage s's forward over one microbatch in reference
// seconds; Backward and Loss follow from it.
func (w Workload) Forward(s, stages int) float64 {
	return float64(w.StageLayers(s, stages)) * w.LayerForward
}

// Backward returns stage s's backward in reference seconds.
func (w Workload) Backward(s, stages int) float64 { return w.BackwardRatio * w.Forward(s, stages) }

// Loss returns stage 0's head and loss in reference seconds.
func (w Workload) Loss(stages int) float64 { return w.LossFactor * w.Forward(0, stages) }

// Memory returns what a node serving stage s needs to hold its layers and
// mu stashed microbatches.
func (w Workload) Memory(s, stages, mu int) float64 {
	return float64(w.StageLayers(s, stages)) * (w.ParamBytesPerLayer + float64(mu)*w.StashBytesPerLayer)
}

func positive(v float64) bool    { return v > 0 && !math.IsInf(v, 0) }
func nonNegative(v float64) bool { return v >= 0 && !math.IsInf(v, 0) }

// WorkloadOf is the workload of a model of the given shape trained on
// microbatches of b sequences of t tokens, scaled from DefaultWorkload's
// measured layer: a layer's forward by its multiply-adds (12C^2 per token),
// the activations crossing a stage boundary as bf16.
func WorkloadOf(layers, c, heads, b, t int) Workload {
	ref := DefaultWorkload()
	const refC, refN = 384, 8 * 256
	n := b * t
	return Workload{
		Layers:             layers,
		LayerForward:       ref.LayerForward * float64(c*c) * float64(n) / (refC * refC * refN),
		BackwardRatio:      ref.BackwardRatio,
		LossFactor:         ref.LossFactor,
		ActivationBytes:    2 * float64(n*c),
		ParamBytesPerLayer: 16 * float64(12*c*c+13*c),
		StashBytesPerLayer: 4 * float64(18*n*c+4*n+b*heads*t*t),
	}
}
