package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/skein-ml/skein/experiment"
	"github.com/skein-ml/skein/trainer"
	"github.com/urfave/cli/v2"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure performance (see BENCHMARKS.md)",
		Subcommands: []*cli.Command{convergenceCommand(), stagedCommand(), {
			Name:  "train",
			Usage: "training tokens/s of a preset on random tokens (the counterpart of bench/torch_gpt.py)",
			Description: "Times full training steps (forward, backward, gradient clipping, AdamW) at the\n" +
				"preset's context length and prints one JSON line. bench/train_throughput.sh runs it\n" +
				"side by side with the PyTorch reference and reports the ratio.",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "preset", Value: "tiny", Usage: "model preset"},
				&cli.IntFlag{Name: "batch", Value: 16, Usage: "sequences per step"},
				&cli.IntFlag{Name: "threads", Value: 1, Usage: "CPU threads (0: all cores)"},
				&cli.StringFlag{Name: "device", Value: "cpu", Usage: "cpu, auto or cuda:N[,fp32][,flash] (GEMMs in TF32 unless fp32; flash: the fused attention, no T x T scores)"},
				&cli.IntFlag{Name: "steps", Value: 20, Usage: "timed steps"},
				&cli.IntFlag{Name: "warmup", Value: 3, Usage: "untimed steps first"},
			},
			Action: func(c *cli.Context) error {
				dev, _, release, err := openDevice(c, c.Int("threads"), false)
				if err != nil {
					return err
				}
				defer release()
				res, err := trainer.BenchTrain(c.Context, dev, c.String("preset"), c.Int("batch"), c.Int("threads"), c.Int("steps"), c.Int("warmup"))
				if err != nil {
					return err
				}
				b, _ := json.Marshal(res)
				fmt.Fprintln(os.Stdout, string(b))
				return nil
			},
		}},
	}
}

func convergenceCommand() *cli.Command {
	return &cli.Command{
		Name:  "convergence",
		Usage: "train one model several ways (sync, single, DiLoCo, NoLoCo, codecs) and compare validation loss",
		Description: "Every arm trains the same preset on the same corpus with the same token budget per worker and is\n" +
			"validated on the same held-out batches. Workers run in this process and talk through an in-memory\n" +
			"network, so the benchmark measures the algorithms, not the network. Writes results.json, results.md\n" +
			"(the table for BENCHMARKS.md) and curves.svg (validation loss curves) to --out.\n\n" +
			"Arms: " + strings.Join(experiment.ArmNames(), ", "),
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "preset", Value: "tiny", Usage: "model preset"},
			&cli.IntFlag{Name: "workers", Value: 4, Usage: "workers M of the distributed arms"},
			&cli.IntFlag{Name: "batch", Value: 8, Usage: "sequences per worker step (B); the sync baseline uses M*B"},
			&cli.IntFlag{Name: "seq-len", Value: 0, Usage: "tokens per sequence (0: the preset's context)"},
			&cli.IntFlag{Name: "steps", Value: 400, Usage: "inner steps per worker"},
			&cli.IntFlag{Name: "warm-steps", Value: 200, Usage: "synchronous steps before the warm-start arms (0: skip them)"},
			&cli.IntFlag{Name: "eval-batches", Value: 8, Usage: "held-out batches per validation"},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of weights and data order"},
			&cli.Float64Flag{Name: "lr", Value: 1e-3, Usage: "inner AdamW learning rate"},
			&cli.Float64Flag{Name: "outer-lr", Usage: "override the DiLoCo arms' outer learning rate (0: each arm's own)"},
			&cli.Float64Flag{Name: "outer-momentum", Value: -1, Usage: "override the DiLoCo arms' outer Nesterov momentum (-1: each arm's own)"},
			&cli.Float64Flag{Name: "residual-decay", Usage: "override the error-feedback residual decay of the sparse, support and subspace arms (0: each arm's own)"},
			&cli.StringSliceFlag{Name: "arm", Usage: "run only these arms (repeatable)"},
			&cli.PathFlag{Name: "out", Value: "runs/convergence", Usage: "output directory"},
		},
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			var mom *float64
			if m := c.Float64("outer-momentum"); m >= 0 {
				mom = &m
			}
			res, err := experiment.RunConvergence(c.Context, experiment.ConvergenceConfig{
				Preset: c.String("preset"), Workers: c.Int("workers"), Batch: c.Int("batch"), SeqLen: c.Int("seq-len"),
				Steps: c.Int("steps"), WarmSteps: c.Int("warm-steps"), EvalBatches: c.Int("eval-batches"),
				Seed: c.Uint64("seed"), LR: c.Float64("lr"),
				OuterLR: c.Float64("outer-lr"), OuterMomentum: mom, ResidualDecay: float32(c.Float64("residual-decay")), Arms: c.StringSlice("arm"), Out: c.Path("out"),
				Logger: log, Progress: os.Stderr,
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "%d arms done; results in %s\n", len(res), c.Path("out"))
			return nil
		},
	}
}

func stagedCommand() *cli.Command {
	return &cli.Command{
		Name:  "staged",
		Usage: "train the model split into pipeline stages: skip ratios, and CheckFree against a random re-init of a lost stage",
		Description: "Every arm trains the preset split into stages with replicas, in this process: each microbatch is\n" +
			"relayed along its SkipPipe path over an in-memory network (activations forward, gradients back),\n" +
			"each stage replica takes AdamW steps, and every --inner-steps the replicas of each stage average\n" +
			"with DiLoCo. The failure arms wipe a stage at --fail-step and rebuild it with CheckFree or at random.\n" +
			"Writes results.json, results.md and curves.svg to --out.\n\n" +
			"Arms: " + strings.Join(experiment.StagedArmNames(), ", "),
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "preset", Value: "tiny", Usage: "model preset"},
			&cli.IntFlag{Name: "steps", Value: 300, Usage: "steps per arm"},
			&cli.IntFlag{Name: "inner-steps", Value: experiment.DefaultStagedConfig().InnerSteps, Usage: "steps between DiLoCo rounds of a stage's replicas"},
			&cli.IntFlag{Name: "fail-step", Value: 0, Usage: "step after which the failure arms lose a stage (0: half way, on a round boundary)"},
			&cli.IntFlag{Name: "eval-every", Value: 5, Usage: "steps between validations"},
			&cli.IntFlag{Name: "eval-batches", Value: 8, Usage: "held-out batches per validation"},
			&cli.Uint64Flag{Name: "seed", Value: 1, Usage: "seed of weights and data order"},
			&cli.StringSliceFlag{Name: "arm", Usage: "run only these arms (repeatable)"},
			&cli.PathFlag{Name: "out", Value: "runs/staged", Usage: "output directory"},
		},
		Action: func(c *cli.Context) error {
			base := experiment.DefaultStagedConfig()
			base.Preset, base.Steps, base.InnerSteps = c.String("preset"), c.Int("steps"), c.Int("inner-steps")
			base.EvalEvery, base.EvalBatches, base.Seed = c.Int("eval-every"), c.Int("eval-batches"), c.Uint64("seed")
			fail := c.Int("fail-step")
			if fail == 0 && base.InnerSteps > 0 {
				fail = base.Steps / 2 / base.InnerSteps * base.InnerSteps
			}
			res, err := experiment.RunStagedBench(c.Context, experiment.StagedBenchConfig{Base: base, FailStep: fail,
				Arms: c.StringSlice("arm"), Out: c.Path("out"), Progress: os.Stderr})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "%s\n%d arms done; results in %s\n", experiment.StagedTable(res), len(res), c.Path("out"))
			return nil
		},
	}
}
