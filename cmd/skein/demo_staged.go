package main

import (
	"fmt"
	"math"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/skein-ml/skein/demo"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/node"
)

// stagedDemo is `skein demo --stages S`: a bootstrap and S x --replicas
// `skein node join` processes with a staged manifest, a stage lost and
// rebuilt halfway (demo.RunStaged); with --hostile (a staged mode, which
// brings --stages 3 unless given) hostile volunteers beside them, and the
// run's invariants checked at the end.
func stagedDemo(c *cli.Context, cfg demo.Config) error {
	for _, f := range []string{"volunteers", "target-loss", "delayed", "chaos", "chaos-every", "chaos-pause"} {
		if c.IsSet(f) {
			return fmt.Errorf("--%s applies to the data-parallel demo, not to --stages", f)
		}
	}
	if h, ok := node.Hostile(cfg.Hostile); cfg.Hostile != "" && (!ok || h.Run != node.HostileRunStaged) {
		return fmt.Errorf("--hostile %s attacks a run that is not staged; --stages contradicts it", cfg.Hostile)
	}
	if kind := c.String("optimizer"); kind != manifest.KindDiLoCo {
		return fmt.Errorf("--optimizer %q: a staged run's volunteers average each stage's replicas with %s (NoLoCo between them is not built)", kind, manifest.KindDiLoCo)
	}
	out := c.App.Writer
	m := &cfg.Manifest
	m.RunID = "skein-staged-demo"
	m.Model.Batch, m.Model.SeqLen = 4, 64
	m.Optimizer.InnerSteps, m.Optimizer.Warmup = 10, 10
	if c.IsSet("inner-steps") {
		m.Optimizer.InnerSteps = c.Int("inner-steps")
	}
	S := c.Int("stages")
	if S < 2 {
		return fmt.Errorf("--stages %d: a staged run needs 2 or more (stage 0 holds the embedding, head and loss)", S)
	}
	k := c.Float64("skip-ratio")
	skip := math.Round(k * float64(S))
	m.Pipeline = manifest.Pipeline{Stages: S, SkipRatio: skip / float64(S), Microbatches: 4, CheckFreePlus: true}
	if m.Wire.Compacted() && !c.IsSet("outer") {
		m.UseDense() // a staged run's replicas average every coordinate
	}
	if math.Abs(m.Pipeline.SkipRatio-k) > 1e-6 && c.IsSet("skip-ratio") {
		fmt.Fprintf(out, "--skip-ratio %.3g: rounded to %.0f of %d stages skipped (%.3f)\n", k, skip, S, m.Pipeline.SkipRatio)
	}
	if err := m.ValidateTemplate(); err != nil {
		return err
	}
	sc := demo.StagedConfig{Config: cfg, Replicas: c.Int("replicas"), FailStage: c.Int("fail-stage"), Iterations: c.Int("steps")}
	switch fs := sc.FailStage; {
	case fs == 0:
		sc.FailStage = -1
	case fs < 0:
		sc.FailStage = S - 1
	case fs >= S:
		return fmt.Errorf("--fail-stage %d: the run has stages 0 to %d", fs, S-1)
	}
	if !c.IsSet("duration") {
		sc.Duration = 0 // --steps ends the run
	}
	if sc.Iterations == 0 && sc.Duration == 0 {
		fmt.Fprintln(os.Stderr, "skein demo: no --steps or --duration: running until Ctrl-C")
	}
	L := S - int(skip)
	fmt.Fprintf(out, "staged run %q: the %s model in %d stages x %d replicas, each of %d microbatches of %dx%d tokens per iteration visiting %d of %d stages; DiLoCo among each stage's replicas every %d iterations\n",
		m.RunID, m.Model.Preset, S, sc.Replicas, m.Pipeline.Microbatches, m.Model.Batch, m.Model.SeqLen, L, S, m.Optimizer.InnerSteps)
	if sc.FailStage >= 0 {
		fmt.Fprintf(out, "halfway every volunteer of stage %d is killed -9; new volunteers join and rebuild it with CheckFree\n", sc.FailStage)
	}
	if n := cfg.HostileCount; cfg.Hostile != "" {
		fmt.Fprintf(out, "%d hostile volunteer(s) join too (--hostile %s); the stage lost halfway is one without them", n, cfg.Hostile)
		if cfg.Hostile == node.HostileCheckFreeNorm {
			fmt.Fprint(out, ", rebuilt from their stage")
		}
		fmt.Fprintln(out, "; the run's invariants are checked at the end")
	}
	if err := demoPlace(c, &sc.Config); err != nil {
		return err
	}
	sc.Out = out
	began := time.Now()
	res, err := demo.RunStaged(c.Context, sc)
	if res != nil && res.Wall > 0 {
		fmt.Fprint(out, res.Summary())
		fmt.Fprintf(out, "logs and data: %s\n", sc.Dir)
	}
	if err != nil {
		return fmt.Errorf("staged demo stopped after %v: %w", time.Since(began).Round(time.Second), err)
	}
	return nil
}
