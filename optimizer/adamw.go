// Package optimizer owns the update rules: the inner AdamW with its
// learning-rate schedule and gradient clipping, and (in later files) the
// outer optimizers and their averaging collectives.
//
// optimizer must not import p2p or do I/O of its own: it talks to peers only
// through small interfaces that callers implement, so its logic is
// deterministic and testable in process.
package optimizer

import (
	"errors"
	"fmt"
	"math"

	"github.com/skein-ml/skein/model"
)

// ErrConfig is returned (wrapped) for invalid optimizer settings.
var ErrConfig = errors.New("optimizer: invalid config")

// AdamWConfig holds the inner optimizer's settings. The schedule is a linear
// warmup over Warmup steps to LR, then a cosine decay to MinLRFrac*LR at
// TotalSteps (and flat after).
type AdamWConfig struct {
	LR          float64
	MinLRFrac   float64
	Warmup      int
	TotalSteps  int
	Beta1       float64
	Beta2       float64
	Eps         float64
	WeightDecay float64
	// Clip is the maximum global gradient norm (0 disables clipping).
	Clip float64
}

// DefaultAdamW returns the DiLoCo paper's inner settings (ALGORITHMS.md 1):
// lr 4e-4, weight decay 0.1, betas (0.9, 0.95), clip 1.0, cosine to 0.1x.
func DefaultAdamW() AdamWConfig {
	return AdamWConfig{LR: 4e-4, MinLRFrac: 0.1, Warmup: 100, TotalSteps: 1000,
		Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, Clip: 1.0}
}

// Validate names the first invalid field.
func (c AdamWConfig) Validate() error {
	bad := func(f string, v any, want string) error {
		return fmt.Errorf("%w: %s = %v, want %s", ErrConfig, f, v, want)
	}
	switch {
	case !(c.LR > 0) || math.IsInf(c.LR, 0):
		return bad("lr", c.LR, "a positive finite number")
	case c.MinLRFrac < 0 || c.MinLRFrac > 1:
		return bad("min lr fraction", c.MinLRFrac, "in [0, 1]")
	case c.Warmup < 0:
		return bad("warmup", c.Warmup, ">= 0")
	case c.TotalSteps <= 0:
		return bad("total steps", c.TotalSteps, "> 0")
	case c.Beta1 < 0 || c.Beta1 >= 1:
		return bad("beta1", c.Beta1, "in [0, 1)")
	case c.Beta2 < 0 || c.Beta2 >= 1:
		return bad("beta2", c.Beta2, "in [0, 1)")
	case !(c.Eps > 0):
		return bad("eps", c.Eps, "> 0")
	case c.WeightDecay < 0:
		return bad("weight decay", c.WeightDecay, ">= 0")
	case c.Clip < 0:
		return bad("clip", c.Clip, ">= 0")
	}
	return nil
}

// LRAt is the learning rate of 0-based step.
func (c AdamWConfig) LRAt(step int) float64 {
	if step < c.Warmup {
		return c.LR * float64(step+1) / float64(c.Warmup)
	}
	decay := c.TotalSteps - c.Warmup
	if decay <= 0 || step >= c.TotalSteps {
		return c.LR * c.MinLRFrac
	}
	frac := float64(step-c.Warmup) / float64(decay)
	coeff := 0.5 * (1 + math.Cos(math.Pi*frac))
	return c.LR * (c.MinLRFrac + (1-c.MinLRFrac)*coeff)
}

// AdamW applies clipped AdamW steps to a stage's parameters, using the
// stage's own moment buffers (so they checkpoint with it).
type AdamW struct {
	cfg AdamWConfig
	// The last stage stepped and its tensors as segments of its flat
	// buffers (ends, decay), built once so Step does not allocate.
	stage *model.Stage
	ends  []int
	decay []bool
}

// NewAdamW validates cfg.
func NewAdamW(cfg AdamWConfig) (*AdamW, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &AdamW{cfg: cfg}, nil
}

// Config returns the settings.
func (o *AdamW) Config() AdamWConfig { return o.cfg }

// Step clips the stage's gradients to the global norm Clip and applies one
// AdamW update for 0-based step (bias correction uses step+1). It returns the
// gradient norm before clipping and the learning rate used. A non-finite
// gradient norm is an error and leaves the parameters untouched.
func (o *AdamW) Step(s *model.Stage, step int) (gradNorm, lr float64, err error) {
	d := s.Device()
	gradNorm = math.Sqrt(d.SumSquares(s.Grads))
	if math.IsNaN(gradNorm) || math.IsInf(gradNorm, 0) {
		return gradNorm, 0, fmt.Errorf("optimizer: gradient norm is %v at step %d", gradNorm, step)
	}
	gscale := float32(1)
	if o.cfg.Clip > 0 && gradNorm > o.cfg.Clip {
		gscale = float32(o.cfg.Clip / gradNorm)
	}
	lr = o.cfg.LRAt(step)
	c := o.cfg
	if o.stage != s {
		// model.Layout lays a stage's tensors end to end over its flat
		// buffers: each is a segment (AdamWSegments checks that they tile).
		o.stage, o.ends, o.decay = s, o.ends[:0], o.decay[:0]
		for _, t := range s.Tensors() {
			if t.Size() > 0 {
				o.ends, o.decay = append(o.ends, t.Offset+t.Size()), append(o.decay, t.Decay)
			}
		}
	}
	// One call for the whole stage (one launch on a GPU), the clip's scale
	// folded in: the bits of Scale, then AdamW a tensor.
	d.AdamWSegments(s.Params, s.Grads, s.M, s.V, o.ends, o.decay, gscale, float32(lr), float32(c.Beta1), float32(c.Beta2),
		float32(c.Eps), float32(c.WeightDecay), step+1)
	return gradNorm, lr, nil
}
