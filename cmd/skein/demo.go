package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/skein-ml/skein/demo"
	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/node"
)

func demoCommand() *cli.Command {
	d := demo.DefaultConfig()
	return &cli.Command{
		Name:  "demo",
		Usage: "run a whole training run on this machine: a bootstrap, its status page and volunteers",
		Description: "Starts a bootstrap (with the public status page) and --volunteers `skein node join` processes on\n" +
			"loopback. They train the tiny GPT on the Go standard library's sources, which the bootstrap packs\n" +
			"into shards that travel to the volunteers, with DiLoCo (or --optimizer noloco); each round sends\n" +
			"1536 of every 4096 coordinates of a rotated basis as signs (--outer dense: all of them). Every link goes\n" +
			"through the WAN emulator (--rate, --latency), so the demo shows what the internet costs. The status\n" +
			"page's URL is printed at once. Runs until --duration or --target-loss; Ctrl-C stops every child\n" +
			"(they save and leave gracefully). Ends with a summary: loss, tokens, bytes sent against fp32\n" +
			"data-parallel training, each volunteer's time to its first step and its share of time computing.\n\n" +
			"--chaos turns the demo into a soak test of what strangers on the internet do to a run: volunteers\n" +
			"killed -9 and restarted, a straggler paused, and with --hostile a volunteer that misbehaves. At the\n" +
			"end it prints the invariants it checked (honest state hashes agree after every round, no round lost,\n" +
			"validation loss still falling, no survivor crashed, no leaked process) and fails if one broke.\n\n" +
			"--stages S runs a staged model instead: the same bootstrap and `skein node join` processes with a\n" +
			"manifest that splits the tiny GPT into S pipeline stages; the bootstrap places S x --replicas\n" +
			"volunteers in them. Each microbatch takes a SkipPipe path that skips --skip-ratio of the stages;\n" +
			"activations go forward and gradients back over the network in bf16; each stage's replicas average\n" +
			"with DiLoCo. Halfway through, every volunteer of --fail-stage is killed -9 and as many new ones join;\n" +
			"the bootstrap re-plans, and the volunteers it puts in the lost stage rebuild it with CheckFree from\n" +
			"its neighbours' weights. Runs for --steps iterations, and until the lost stage has trained a round\n" +
			"again (or for --duration). Ends with the training loss, the bytes sent, the stages and how long the\n" +
			"lost stage took to train again.",
		Flags: []cli.Flag{
			&cli.IntFlag{Name: "volunteers", Value: d.Volunteers, Usage: "volunteer processes"},
			&cli.PathFlag{Name: "manifest", Usage: "the run's manifest (TOML, as skein bootstrap --manifest takes; default: the demo's byte-level tiny run); the flags below that are given override it"},
			&cli.StringFlag{Name: "preset", Usage: "the model: " + strings.Join(model.PresetNames(), ", ") + " (default: the manifest's, tiny for the demo's own)"},
			&cli.IntFlag{Name: "batch", Usage: "sequences per inner step and volunteer (default: the manifest's)"},
			&cli.IntFlag{Name: "seq-len", Usage: "tokens per sequence (default: the manifest's; 0 there: the model's context)"},
			&cli.StringFlag{Name: "optimizer", Value: d.Manifest.Optimizer.Kind, Usage: "outer optimizer: diloco or noloco"},
			&cli.BoolFlag{Name: "delayed", Usage: "DiLoCo's overlapped outer step: each round's exchange runs during the next inner phase, whose first steps train from the round's expected result (the outer step with the member's own pseudo-gradient) until the real one lands; volunteers compute nearly all the time, and at equal tokens it ends 0-0.3% behind plain rounds when rounds land within a few steps, 1.2-1.7% when they land 30 steps in (BENCHMARKS.md)"},
			&cli.StringFlag{Name: "outer", Usage: "what of each pseudo-gradient crosses the wire: dense (every coordinate, int8), or support (the round's shared support: --support-k of every 4096 coordinates, rotated by default, see --support-rotate); default: the manifest's, support for the demo's own run (about 2100x less traffic than fp32 data-parallel, where dense sends 128x less; --outer dense for the old exchange)"},
			&cli.IntFlag{Name: "support-k", Value: 1536, Usage: "with --outer support: coordinates of every 4096 sent each round"},
			&cli.IntFlag{Name: "support-block", Value: 256, Usage: "with --outer support: values sharing one scale on the wire (wire.block_size; 256 sends 9% more than 1024 and ends 0.3% lower warm, 2.5% lower in a 3-minute demo)"},
			&cli.StringFlag{Name: "support-codec", Value: "sign", Usage: "with --outer support: the codec of the support's values (sign: 1 bit a value; int2, int4, minmax8, ...)"},
			&cli.BoolFlag{Name: "support-rotate", Value: true, Usage: "with --outer support: take the support in a randomized Hadamard basis of every 4096 coordinates (wire.rotate), drawn once a round and tiled over the chunks with a keyed shift each (wire.tiled), with no residual and the outer Nesterov momentum 0.9 at lr 0.7 x 4096/--support-k; --support-rotate=false: plain coordinates, the residual, outer SGD at lr 3"},
			&cli.Float64Flag{Name: "residual-decay", Value: -1, Usage: "with --outer support: the residual's decay per round, in [0, 1] (default: 0 with --support-rotate, else 0.5)"},
			&cli.Float64Flag{Name: "outer-lr", Usage: "DiLoCo's outer learning rate (default: the manifest's)"},
			&cli.Float64Flag{Name: "outer-momentum", Value: -1, Usage: "DiLoCo's outer momentum, in [0, 1) (default: the manifest's)"},
			&cli.DurationFlag{Name: "duration", Value: d.Duration, Usage: "stop after this long (0: only at --target-loss or Ctrl-C)"},
			&cli.Float64Flag{Name: "target-loss", Usage: "stop once the validation loss reaches this (0: never)"},
			&cli.Float64Flag{Name: "rate", Value: d.RateMbit, Usage: "emulated bandwidth of every link, Mbit/s (0: unlimited)"},
			&cli.DurationFlag{Name: "latency", Value: d.Latency, Usage: "emulated one-way latency of every link"},
			&cli.StringFlag{Name: "http", Value: d.HTTPAddr, Usage: "status page address (port 0: any free port)"},
			&cli.IntFlag{Name: "threads", Value: d.Threads, Usage: "CPU threads per volunteer"},
			&cli.StringFlag{Name: "device", Value: "auto", Usage: "what the volunteers train on: auto (GPU 0 if one answers, else the CPU, each saying why), cpu, or cuda:N[,fp32][,flash]; the volunteers share the GPU, a context each"},
			&cli.IntFlag{Name: "inner-steps", Value: d.Manifest.Optimizer.InnerSteps, Usage: "inner steps per round (H); 10 with --stages unless set"},
			&cli.StringSliceFlag{Name: "corpus", Usage: "files or directories to train on, packed into the run's shards (default: the Go standard library sources)"},
			&cli.PathFlag{Name: "dataset", Usage: "train on the packed dataset in DIR (`skein data pack`) instead of --corpus: each volunteer fetches only the chunks of its blocks"},
			&cli.PathFlag{Name: "dir", Usage: "directory for the children's data and logs (default: a new temporary directory)"},
			&cli.StringFlag{Name: "child-log-level", Value: "warn", Usage: "log level of the children (their logs go to --dir)"},
			&cli.BoolFlag{Name: "chaos", Usage: "chaos soak: kill -9 and restart a third of the volunteers every --chaos-every, pause one (SIGSTOP) between waves, then check the run's invariants (exit status 1 if one broke)"},
			&cli.DurationFlag{Name: "chaos-every", Value: time.Minute, Usage: "period of the chaos soak's kill waves"},
			&cli.DurationFlag{Name: "chaos-pause", Value: 20 * time.Second, Usage: "how long the chaos soak pauses a straggler"},
			&cli.StringFlag{Name: "hostile", Usage: "add hostile volunteers playing one attack, best with --chaos (a mode brings the run it needs: noloco-* a NoLoCo run, staged-* and checkfree-* a staged one, whose invariants are checked without --chaos): " + node.HostileUsage()},
			&cli.IntFlag{Name: "hostile-count", Value: 1, Usage: "with --hostile: how many hostile volunteers (fewer than --volunteers; 2 by default for collude and sybils, which act together)"},
			&cli.IntFlag{Name: "stages", Usage: "split the model into this many pipeline stages (SkipPipe, with CheckFree); 0: data-parallel volunteers"},
			&cli.IntFlag{Name: "replicas", Value: 2, Usage: "with --stages: volunteers per stage (they average with DiLoCo every --inner-steps)"},
			&cli.Float64Flag{Name: "skip-ratio", Value: 1.0 / 3, Usage: "with --stages: k, the share of the S stages each microbatch skips (it visits S(1-k), stage 0 always; rounded to whole stages)"},
			&cli.IntFlag{Name: "steps", Value: 60, Usage: "with --stages: stop after this many iterations (0: at --duration, if set, or Ctrl-C)"},
			&cli.IntFlag{Name: "fail-stage", Value: -1, Usage: "with --stages: the stage whose volunteers are all killed halfway (-1: the last; 0: none)"},
		},
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			cfg := d
			if p := c.Path("manifest"); p != "" {
				m, err := manifest.LoadTemplate(p)
				if err != nil {
					return fmt.Errorf("--manifest: %w", err)
				}
				cfg.Manifest = m
			}
			if c.IsSet("preset") {
				cfg.Manifest.Model.Preset = c.String("preset")
			}
			if c.IsSet("batch") {
				cfg.Manifest.Model.Batch = c.Int("batch")
			}
			if c.IsSet("seq-len") {
				cfg.Manifest.Model.SeqLen = c.Int("seq-len")
			}
			cfg.Volunteers, cfg.Duration, cfg.TargetLoss = c.Int("volunteers"), c.Duration("duration"), c.Float64("target-loss")
			cfg.RateMbit, cfg.Latency, cfg.HTTPAddr = c.Float64("rate"), c.Duration("latency"), c.String("http")
			cfg.Threads, cfg.LogLevel, cfg.Logger, cfg.Out = c.Int("threads"), c.String("child-log-level"), log, os.Stdout
			if cfg.Device = c.String("device"); cfg.Device != "auto" && cfg.Device != "cpu" {
				if _, err := kernels.ParseCUDASpec(cfg.Device); err != nil {
					return err
				}
			}
			switch kind := c.String("optimizer"); {
			case !c.IsSet("optimizer") && c.Path("manifest") != "": // the manifest's
			case kind == manifest.KindDiLoCo:
			case kind == manifest.KindNoLoCo:
				cfg.Manifest.UseNoLoCo()
			default:
				return fmt.Errorf("--optimizer %q: want %s or %s", kind, manifest.KindDiLoCo, manifest.KindNoLoCo)
			}
			cfg.Chaos, cfg.ChaosEvery, cfg.ChaosPause = c.Bool("chaos"), c.Duration("chaos-every"), c.Duration("chaos-pause")
			cfg.ChaosSeed = uint64(time.Now().UnixNano())
			if h := c.String("hostile"); h != "" {
				info, ok := node.Hostile(h)
				if !ok {
					return fmt.Errorf("--hostile %q: want one of %s", h, node.HostileNames())
				}
				cfg.Hostile, cfg.HostileCount = h, c.Int("hostile-count")
				if !c.IsSet("hostile-count") {
					cfg.HostileCount = info.MinCount
				} else if cfg.HostileCount < info.MinCount {
					return fmt.Errorf("--hostile %s needs --hostile-count %d or more", h, info.MinCount)
				}
				if info.Run == node.HostileRunNoLoCo {
					if c.IsSet("optimizer") && c.String("optimizer") != manifest.KindNoLoCo {
						return fmt.Errorf("--hostile %s attacks a NoLoCo run; --optimizer %s contradicts it", h, c.String("optimizer"))
					}
					cfg.Manifest.UseNoLoCo()
				}
				if info.Run == node.HostileRunStaged && !c.IsSet("stages") {
					if err := c.Set("stages", "3"); err != nil { // the staged run the mode needs
						return err
					}
				}
				switch staged := info.Run == node.HostileRunStaged; {
				case staged && c.Int("stages") <= 0:
					return fmt.Errorf("--hostile %s attacks a staged run; --stages %d contradicts it", h, c.Int("stages"))
				case !staged && c.Int("stages") > 0:
					return fmt.Errorf("--hostile %s attacks a run that is not staged; --stages %d contradicts it", h, c.Int("stages"))
				}
			}
			if cfg.ChaosEvery <= 0 || cfg.ChaosPause <= 0 {
				return fmt.Errorf("--chaos-every %v and --chaos-pause %v must be positive", cfg.ChaosEvery, cfg.ChaosPause)
			}
			if c.IsSet("inner-steps") || c.Path("manifest") == "" {
				cfg.Manifest.Optimizer.InnerSteps = c.Int("inner-steps")
			}
			if c.IsSet("delayed") || c.Path("manifest") == "" {
				cfg.Manifest.Optimizer.Delayed = c.Bool("delayed")
			}
			o := c.String("outer")
			for _, f := range []string{"support-k", "support-block", "support-codec", "support-rotate", "residual-decay"} {
				if o == "" && c.IsSet(f) { // a support's setting asks for one
					o = manifest.OuterSupport
				}
			}
			switch o {
			case "":
			case manifest.OuterDense:
				cfg.Manifest.UseDense()
			case manifest.OuterSupport:
				k, rotate, decay := c.Int("support-k"), c.Bool("support-rotate"), c.Float64("residual-decay")
				if k < 1 || k > manifest.SupportChunk {
					return fmt.Errorf("--support-k %d: want 1..%d (coordinates of every %d)", k, manifest.SupportChunk, manifest.SupportChunk)
				}
				// The outer rules measured best with a support (BENCHMARKS.md,
				// issue [3/4]): rotated, no residual and the paper's Nesterov
				// step scaled by how rarely a rotated coordinate is sent;
				// plain, the residual as the momentum and a larger step.
				cfg.Manifest.UseRotatedSupport(k)
				if !rotate {
					cfg.Manifest.Wire.Rotate, cfg.Manifest.Wire.Tiled, cfg.Manifest.Wire.ResidualDecay = false, false, 0.5
					cfg.Manifest.Optimizer.OuterLR, cfg.Manifest.Optimizer.OuterMomentum = 3, 0
				}
				cfg.Manifest.Wire.Codec, cfg.Manifest.Wire.BlockSize = c.String("support-codec"), c.Int("support-block")
				if decay >= 0 {
					cfg.Manifest.Wire.ResidualDecay = decay
				}
			default:
				return fmt.Errorf("--outer %q: want %q or %q", o, manifest.OuterDense, manifest.OuterSupport)
			}
			if c.IsSet("outer-lr") {
				cfg.Manifest.Optimizer.OuterLR = c.Float64("outer-lr")
			}
			if c.IsSet("outer-momentum") {
				cfg.Manifest.Optimizer.OuterMomentum = c.Float64("outer-momentum")
			}
			if err := cfg.Manifest.ValidateTemplate(); err != nil {
				return err
			}
			for _, p := range c.StringSlice("corpus") {
				abs, err := filepath.Abs(p)
				if err != nil {
					return err
				}
				cfg.Corpus = append(cfg.Corpus, abs)
			}
			if p := c.Path("dataset"); p != "" {
				if len(cfg.Corpus) > 0 {
					return fmt.Errorf("--dataset and --corpus: train on one or the other")
				}
				if cfg.Dataset, err = filepath.Abs(p); err != nil {
					return err
				}
			}
			if c.Int("stages") > 0 {
				return stagedDemo(c, cfg)
			}
			if cfg.Duration == 0 && cfg.TargetLoss == 0 {
				fmt.Fprintln(os.Stderr, "skein demo: no --duration or --target-loss: running until Ctrl-C")
			}
			if err := demoPlace(c, &cfg); err != nil {
				return err
			}
			began := time.Now()
			res, err := demo.Run(c.Context, cfg)
			if res != nil && res.Wall > 0 {
				fmt.Print(res.Summary())
				fmt.Printf("logs and data: %s\n", cfg.Dir)
			}
			if err != nil {
				return fmt.Errorf("demo stopped after %v: %w", time.Since(began).Round(time.Second), err)
			}
			return nil
		},
	}
}

// demoPlace sets the demo's binary (this one) and directory (--dir, or a
// new temporary one).
func demoPlace(c *cli.Context, cfg *demo.Config) (err error) {
	if cfg.Binary, err = os.Executable(); err != nil {
		return err
	}
	if cfg.Dir = c.Path("dir"); cfg.Dir == "" {
		cfg.Dir, err = os.MkdirTemp("", "skein-demo-")
		return err
	}
	cfg.Dir, err = filepath.Abs(cfg.Dir)
	return err
}
