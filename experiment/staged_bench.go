package experiment

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// The staged benchmark: the same model, data and seed trained as a
// pipeline with and without SkipPipe's skips, and a pipeline that loses a
// stage mid-run and rebuilds it by CheckFree or at random. It has its own
// entry point rather than arms of RunConvergence because its runs are
// configured by StagedConfig, not SwarmConfig; its report reuses
// CurvesSVG.

// StagedArm is one run of the staged benchmark.
type StagedArm struct {
	Name        string
	Description string
	configure   func(c *StagedConfig, failStep int)
}

// StagedArms lists the arms in report order. The failure arms use 4
// stages, one layer each after stage 0, so that stage 2 is intermediate
// (pipeline.Recover: with 3 stages neither stage 1 nor 2 has two
// transformer neighbours) and its neighbours have its shape.
func StagedArms() []StagedArm {
	return []StagedArm{
		{Name: "s3-skip0", Description: "3 stages x 2 replicas, every microbatch visits all 3", configure: func(c *StagedConfig, _ int) {
			c.Stages, c.SkipRatio = 3, 0
		}},
		{Name: "s3-skip1/3", Description: "3 stages x 2 replicas, skip ratio 1/3: stage 0 and one other", configure: func(c *StagedConfig, _ int) {
			c.Stages, c.SkipRatio = 3, 1.0/3
		}},
		{Name: "s4-nofail", Description: "4 stages x 2 replicas, no failure (reference)", configure: func(c *StagedConfig, _ int) {
			c.Stages, c.SkipRatio = 4, 0
		}},
		{Name: "s4-checkfree", Description: "4 stages x 2 replicas, stage 2 wiped, CheckFree rebuild", configure: func(c *StagedConfig, f int) {
			c.Stages, c.SkipRatio = 4, 0
			c.Failure = &StageFailure{Step: f, Stage: 2, Recovery: CheckFree}
		}},
		{Name: "s4-random", Description: "4 stages x 2 replicas, stage 2 wiped, random re-init", configure: func(c *StagedConfig, f int) {
			c.Stages, c.SkipRatio = 4, 0
			c.Failure = &StageFailure{Step: f, Stage: 2, Recovery: RandomInit}
		}},
		// CheckFree+ on 3 stages (layers 1, 1, 2): the edge stage 2 is
		// rebuilt as a copy of its swap partner, stage 1. Its reference
		// trains with the same swaps.
		{Name: "s3plus-nofail", Description: "3 stages x 2 replicas, CheckFree+ swaps, no failure (reference)", configure: func(c *StagedConfig, _ int) {
			c.Stages, c.SkipRatio, c.CheckFreePlus = 3, 0, true
		}},
		{Name: "s3plus-checkfree", Description: "3 stages x 2 replicas, CheckFree+ swaps, stage 2 wiped, copied from stage 1", configure: func(c *StagedConfig, f int) {
			c.Stages, c.SkipRatio, c.CheckFreePlus = 3, 0, true
			c.Failure = &StageFailure{Step: f, Stage: 2, Recovery: CheckFree}
		}},
		{Name: "s3plus-random", Description: "3 stages x 2 replicas, CheckFree+ swaps, stage 2 wiped, random re-init", configure: func(c *StagedConfig, f int) {
			c.Stages, c.SkipRatio, c.CheckFreePlus = 3, 0, true
			c.Failure = &StageFailure{Step: f, Stage: 2, Recovery: RandomInit}
		}},
	}
}

// StagedBenchConfig configures RunStagedBench.
type StagedBenchConfig struct {
	Base     StagedConfig // Stages, SkipRatio and Failure are set per arm
	FailStep int          // the failure arms' step (a multiple of Base.InnerSteps)
	Arms     []string     // empty: all
	Out      string       // directory for results.json, results.md, curves.svg ("": none)
	Progress io.Writer
}

// StagedArmResult is one arm's outcome.
type StagedArmResult struct {
	Arm         string        `json:"arm"`
	Description string        `json:"description"`
	Result      *StagedResult `json:"result"`
}

// RunStagedBench runs the selected arms and writes the report.
func RunStagedBench(ctx context.Context, cfg StagedBenchConfig) ([]StagedArmResult, error) {
	want := map[string]bool{}
	for _, a := range cfg.Arms {
		want[a] = true
	}
	for a := range want {
		if !strings.Contains(","+stagedArmNames()+",", ","+a+",") {
			return nil, fmt.Errorf("%w: unknown staged arm %q (known: %s)", ErrConfig, a, stagedArmNames())
		}
	}
	var out []StagedArmResult
	for _, arm := range StagedArms() {
		if len(want) > 0 && !want[arm.Name] {
			continue
		}
		c := cfg.Base
		c.Failure = nil
		arm.configure(&c, cfg.FailStep)
		say(cfg.Progress, "arm %s: %s, %d steps", arm.Name, arm.Description, c.Steps)
		c.OnEval = func(p StagedPoint) {
			say(cfg.Progress, "  %s step %d (%.0f s): val loss %.4f", arm.Name, p.Step, p.Seconds, p.ValLoss)
		}
		r, err := RunStaged(ctx, c)
		if err != nil {
			return out, fmt.Errorf("staged arm %s: %w", arm.Name, err)
		}
		out = append(out, StagedArmResult{Arm: arm.Name, Description: arm.Description, Result: r})
	}
	if cfg.Out != "" {
		if err := writeStaged(cfg, out); err != nil {
			return out, err
		}
	}
	return out, nil
}

// StagedArmNames lists the staged arms' names.
func StagedArmNames() []string {
	var n []string
	for _, a := range StagedArms() {
		n = append(n, a.Name)
	}
	return n
}

func stagedArmNames() string { return strings.Join(StagedArmNames(), ",") }

func writeStaged(cfg StagedBenchConfig, results []StagedArmResult) error {
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return fmt.Errorf("experiment: creating %s: %w", cfg.Out, err)
	}
	base := cfg.Base
	base.Logger, base.OnEval = nil, nil
	n := base.NoLoCo
	record := map[string]any{"config": base, "fail_step": cfg.FailStep, "arms": results,
		"noloco": map[string]any{"outer_lr": n.OuterLR, "momentum": n.Momentum, "gamma": n.Gamma, "group_size": n.GroupSize}}
	js, err := json.MarshalIndent(record, "", "  ")
	if err != nil {
		return fmt.Errorf("experiment: encoding the staged results: %w", err)
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, "results.json"), js, 0o644); err != nil {
		return fmt.Errorf("experiment: writing results.json: %w", err)
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, "results.md"), []byte(StagedTable(results)), 0o644); err != nil {
		return fmt.Errorf("experiment: writing results.md: %w", err)
	}
	var curves []ArmResult
	for _, r := range results {
		a := ArmResult{Arm: r.Arm, Final: r.Result.FinalValLoss, Seconds: r.Result.Seconds}
		for _, p := range r.Result.Curve {
			a.Curve = append(a.Curve, EvalPoint{Step: p.Step, ValLoss: p.ValLoss})
		}
		curves = append(curves, a)
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, "curves.svg"), []byte(CurvesSVG(curves)), 0o644); err != nil {
		return fmt.Errorf("experiment: writing curves.svg: %w", err)
	}
	return nil
}

// LossAt is the validation loss of curve at training time seconds,
// interpolated linearly between validations (the last one past its end).
func LossAt(curve []StagedPoint, seconds float64) float32 {
	if len(curve) == 0 {
		return 0
	}
	for i := 1; i < len(curve); i++ {
		a, b := curve[i-1], curve[i]
		if seconds <= b.Seconds {
			if b.Seconds == a.Seconds {
				return b.ValLoss
			}
			f := (seconds - a.Seconds) / (b.Seconds - a.Seconds)
			return a.ValLoss + float32(f)*(b.ValLoss-a.ValLoss)
		}
	}
	return curve[len(curve)-1].ValLoss
}

// StagedTable renders the results as markdown: each arm's figures, then
// the skip pair at equal wall time (the shorter run's) and the failure
// arms' recovery.
func StagedTable(results []StagedArmResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| arm | steps | s/step | final val loss | before failure | after rebuild | back at step |\n|---|---|---|---|---|---|---|\n")
	by := map[string]*StagedResult{}
	for _, r := range results {
		res := r.Result
		by[r.Arm] = res
		pre, post, back := "", "", ""
		if res.PreFailure != 0 {
			pre, post = fmt.Sprintf("%.4f", res.PreFailure), fmt.Sprintf("%.4f", res.PostFailure)
			back = "not within the run"
			if res.RecoveredAt >= 0 {
				back = fmt.Sprintf("%d", res.RecoveredAt)
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %.3f | %.4f | %s | %s | %s |\n", r.Arm, len(res.TrainLoss), res.StepSeconds, res.FinalValLoss, pre, post, back)
	}
	if a, k := by["s3-skip0"], by["s3-skip1/3"]; a != nil && k != nil {
		t := min(a.Seconds, k.Seconds)
		fmt.Fprintf(&b, "\nAt equal training time (%.0f s, the shorter run): skip 0 %.4f, skip 1/3 %.4f. Per step: %.3f s vs %.3f s (%.0f%% shorter).\n",
			t, LossAt(a.Curve, t), LossAt(k.Curve, t), a.StepSeconds, k.StepSeconds, 100*(1-k.StepSeconds/a.StepSeconds))
	}
	for _, name := range []string{"s4-checkfree", "s4-random"} {
		r, ref := by[name], by["s4-nofail"]
		if r == nil || r.PreFailure == 0 {
			continue
		}
		gap := ""
		if ref != nil {
			gap = fmt.Sprintf(", %+.4f vs the run without failure", r.FinalValLoss-ref.FinalValLoss)
		}
		fmt.Fprintf(&b, "\n%s: %.4f before the failure, %.4f right after the rebuild, final %.4f%s.\n", name, r.PreFailure, r.PostFailure, r.FinalValLoss, gap)
	}
	return b.String()
}
