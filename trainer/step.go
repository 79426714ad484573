package trainer

import (
	"errors"
	"fmt"
	"math"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
)

// StepResult is what one training step reports.
type StepResult struct {
	Loss         float32
	GradNorm, LR float64
}

// ErrNonFinite is returned (wrapped) when a step's loss or gradient norm is
// NaN or infinite. The step changed no weights and no AdamW moments; the
// weights that produced it are suspect, and a caller holding a good copy
// (a volunteer's phi) goes back to it.
var ErrNonFinite = errors.New("trainer: non-finite loss or gradient")

// trainStep runs training step `step` on its batch: forward, backward and a
// clipped AdamW update. in and tg are the caller's reused batch buffers.
func trainStep(stage *model.Stage, opt *optimizer.AdamW, loader *data.Loader, step int, in, tg []int32) (StepResult, error) {
	if err := loader.Batch(step, in, tg); err != nil {
		return StepResult{}, err
	}
	loss, err := stage.Forward(in, nil, tg)
	if err != nil {
		if !finite(float64(loss)) {
			return StepResult{Loss: loss}, fmt.Errorf("%w: step %d: loss %v", ErrNonFinite, step, loss)
		}
		return StepResult{}, fmt.Errorf("trainer: step %d: %w", step, err)
	}
	stage.ZeroGrad()
	if err := stage.Backward(nil); err != nil {
		return StepResult{}, err
	}
	norm, lr, err := opt.Step(stage, step)
	if err != nil && !finite(norm) {
		return StepResult{Loss: loss, GradNorm: norm}, fmt.Errorf("%w: step %d: gradient norm %v", ErrNonFinite, step, norm)
	}
	return StepResult{Loss: loss, GradNorm: norm, LR: lr}, err
}

func finite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// evalLoss is the mean loss of the stage over the first n batches of val.
func evalLoss(stage *model.Stage, val *data.Loader, n int, in, tg []int32) (float32, error) {
	var sum float64
	for i := 0; i < n; i++ {
		if err := val.Batch(i, in, tg); err != nil {
			return 0, err
		}
		l, err := stage.Forward(in, nil, tg)
		if err != nil {
			return 0, err
		}
		sum += float64(l)
	}
	return float32(sum / float64(n)), nil
}
