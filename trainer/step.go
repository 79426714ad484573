package trainer

import (
	"fmt"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
)

// StepResult is what one training step reports.
type StepResult struct {
	Loss         float32
	GradNorm, LR float64
}

// trainStep runs training step `step` on its batch: forward, backward and a
// clipped AdamW update. in and tg are the caller's reused batch buffers.
func trainStep(stage *model.Stage, opt *optimizer.AdamW, loader *data.Loader, step int, in, tg []int32) (StepResult, error) {
	if err := loader.Batch(step, in, tg); err != nil {
		return StepResult{}, err
	}
	loss, err := stage.Forward(in, nil, tg)
	if err != nil {
		return StepResult{}, fmt.Errorf("trainer: step %d: %w", step, err)
	}
	stage.ZeroGrad()
	if err := stage.Backward(nil); err != nil {
		return StepResult{}, err
	}
	norm, lr, err := opt.Step(stage, step)
	return StepResult{Loss: loss, GradNorm: norm, LR: lr}, err
}

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
