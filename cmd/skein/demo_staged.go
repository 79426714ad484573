package main

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/skein-ml/skein/experiment"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p/wan"
)

// stagedDemo is `skein demo --stages S`: a staged run over libp2p on
// loopback through the WAN emulator, with a stage lost and rebuilt halfway.
func stagedDemo(c *cli.Context) error {
	for _, f := range []string{"volunteers", "duration", "target-loss", "corpus", "delayed", "chaos", "chaos-every", "chaos-pause", "hostile"} {
		if c.IsSet(f) {
			return fmt.Errorf("--%s applies to the data-parallel demo, not to --stages", f)
		}
	}
	out := c.App.Writer
	// The run, as a manifest: what a bootstrap would serve for it.
	m := manifest.Default()
	m.RunID = "skein-staged-demo"
	m.Model.Batch, m.Model.SeqLen = 4, 64
	m.Optimizer.InnerSteps, m.Optimizer.Warmup = 10, 10
	if c.IsSet("inner-steps") {
		m.Optimizer.InnerSteps = c.Int("inner-steps")
	}
	switch kind := c.String("optimizer"); kind {
	case manifest.KindDiLoCo:
	case manifest.KindNoLoCo: // within each stage, and its random routing between replicas
		m.UseNoLoCo()
	default:
		return fmt.Errorf("--optimizer %q: want %s or %s", kind, manifest.KindDiLoCo, manifest.KindNoLoCo)
	}
	S := c.Int("stages")
	if S < 2 {
		return fmt.Errorf("--stages %d: a staged run needs 2 or more (stage 0 holds the embedding, head and loss)", S)
	}
	k := c.Float64("skip-ratio")
	skip := math.Round(k * float64(S))
	m.Pipeline = manifest.Pipeline{Stages: S, SkipRatio: skip / float64(S), Microbatches: 4, CheckFreePlus: true}
	if math.Abs(m.Pipeline.SkipRatio-k) > 1e-6 && c.IsSet("skip-ratio") {
		fmt.Fprintf(out, "--skip-ratio %.3g: rounded to %.0f of %d stages skipped (%.3f)\n", k, skip, S, m.Pipeline.SkipRatio)
	}
	if err := m.ValidateTemplate(); err != nil {
		return err
	}
	cfg, err := experiment.StagedConfigOf(m)
	if err != nil {
		return err
	}
	// The nodes' own logs at --child-log-level (warn by default): the
	// progress lines say what happens.
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.String("child-log-level"))); err != nil {
		return fmt.Errorf("--child-log-level %q: want debug, info, warn or error", c.String("child-log-level"))
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	cfg.Replicas, cfg.Steps = c.Int("replicas"), c.Int("steps")
	cfg.Threads, cfg.Logger, cfg.Progress = max(c.Int("threads"), 1), log, out
	cfg.Network = &experiment.StagedNetwork{Link: wan.Link{Latency: c.Duration("latency"), Rate: c.Float64("rate") * 1e6}}
	switch fs := c.Int("fail-stage"); {
	case fs == 0:
	case cfg.Steps < 2*cfg.InnerSteps:
		fmt.Fprintf(out, "no stage failure: %d steps are fewer than two rounds of %d\n", cfg.Steps, cfg.InnerSteps)
	default:
		if fs < 0 {
			fs = cfg.Stages - 1
		}
		at := (cfg.Steps / 2 / cfg.InnerSteps) * cfg.InnerSteps // a round boundary: the replicas agree
		cfg.Failure = &experiment.StageFailure{Step: at, Stage: fs, Recovery: experiment.Recovery(c.String("recovery"))}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	L := cfg.Stages - cfg.Skip()
	routing := ""
	if cfg.RandomRouting {
		routing = " (a random replica of each)"
	}
	fmt.Fprintf(out, "run %q: manifest %s\n", m.RunID, m.ShortHash())
	fmt.Fprintf(out, "staged run: the %s model in %d stages x %d replicas = %d libp2p nodes on loopback (QUIC), every link %s one way at %s;\n"+
		"each of %d microbatches of %dx%d tokens per step visits %d of %d stages%s; %s among each stage's replicas every %d steps; %d steps\n",
		cfg.Preset, cfg.Stages, cfg.Replicas, cfg.Stages*cfg.Replicas, c.Duration("latency"), rateString(c.Float64("rate")),
		cfg.Microbatches, cfg.Batch, cfg.SeqLen, L, cfg.Stages, routing, cfg.StageOuter, cfg.InnerSteps, cfg.Steps)
	if f := cfg.Failure; f != nil {
		fmt.Fprintf(out, "after step %d every node of stage %d is killed and replaced; the stage is rebuilt by %s\n", f.Step, f.Stage, f.Recovery)
	}
	dir := c.Path("dir")
	if dir == "" {
		if dir, err = os.MkdirTemp("", "skein-staged-demo-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	page, url, err := startStagedStatus(m, cfg, dir, c.String("http"), log)
	if err != nil {
		return err
	}
	defer page.close()
	cfg.OnStep = page.observe
	fmt.Fprintf(out, "status page: %s (history in %s)\n", url, dir)
	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	began := time.Now()
	res, err := experiment.RunStaged(ctx, cfg)
	if err != nil {
		return fmt.Errorf("staged demo stopped after %v: %w", time.Since(began).Round(time.Second), err)
	}
	fmt.Fprintf(out, "\nsummary: validation loss %.4f -> %.4f in %d steps (%.2fs/step, %.0fs in all); %.1f MB of activations and gradients on the wire\n",
		res.Curve[0].ValLoss, res.FinalValLoss, cfg.Steps, res.StepSeconds, time.Since(began).Seconds(), res.ActivationMB)
	if cfg.Failure != nil {
		back := "not within the run"
		if res.RecoveredAt >= 0 {
			back = fmt.Sprintf("at step %d", res.RecoveredAt)
		}
		fmt.Fprintf(out, "stage %d lost after step %d: validation loss %.4f before, %.4f right after the rebuild, back to the pre-failure loss %s\n",
			cfg.Failure.Stage, cfg.Failure.Step, res.PreFailure, res.PostFailure, back)
	}
	if res.Timing != nil {
		fmt.Fprintln(out, res.Timing)
	}
	return nil
}

func rateString(mbit float64) string {
	if mbit <= 0 {
		return "unlimited rate"
	}
	return fmt.Sprintf("%g Mbit/s", mbit)
}
