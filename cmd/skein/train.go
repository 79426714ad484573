package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/trainer"
)

func trainCommand() *cli.Command {
	d := trainer.DefaultTrainConfig()
	flags := []cli.Flag{
		&cli.StringFlag{Name: "config", EnvVars: envVars("config"), Usage: "TOML file of settings (keys are flag names, e.g. steps = 500)"},
		altsrc.NewStringFlag(&cli.StringFlag{Name: "preset", Value: d.Preset, EnvVars: envVars("preset"),
			Usage: "model size: " + strings.Join(model.PresetNames(), ", ")}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "steps", Value: d.Steps, EnvVars: envVars("steps"), Usage: "optimizer steps to reach (a resumed run continues to this step)"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "batch", Value: d.Batch, EnvVars: envVars("batch"), Usage: "sequences per step"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "seq-len", Value: 0, EnvVars: envVars("seq_len"), Usage: "tokens per sequence (0: the preset's context length)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "tokenizer", Value: "byte", EnvVars: envVars("tokenizer"),
			Usage: "tokenizer: " + strings.Join(data.TokenizerNames(), ", ") + " (gpt2 tokenizes the corpus in memory first and gives the model GPT-2's vocabulary)"}),
		altsrc.NewFloat64Flag(&cli.Float64Flag{Name: "lr", Value: d.AdamW.LR, EnvVars: envVars("lr"), Usage: "peak AdamW learning rate"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "warmup", Value: d.AdamW.Warmup, EnvVars: envVars("warmup"), Usage: "linear warmup steps, then cosine decay"}),
		altsrc.NewFloat64Flag(&cli.Float64Flag{Name: "min-lr-frac", Value: d.AdamW.MinLRFrac, EnvVars: envVars("min-lr-frac"), Usage: "final learning rate as a fraction of --lr"}),
		altsrc.NewFloat64Flag(&cli.Float64Flag{Name: "weight-decay", Value: d.AdamW.WeightDecay, EnvVars: envVars("weight-decay"), Usage: "decoupled AdamW weight decay (matrices and embeddings only)"}),
		altsrc.NewFloat64Flag(&cli.Float64Flag{Name: "clip", Value: d.AdamW.Clip, EnvVars: envVars("clip"), Usage: "global gradient-norm clip (0 disables)"}),
		altsrc.NewUint64Flag(&cli.Uint64Flag{Name: "seed", Value: d.Seed, EnvVars: envVars("seed"), Usage: "seed of the initial weights and the data order"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "threads", Value: 0, EnvVars: envVars("threads"), Usage: "CPU threads (0: all cores)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "device", Value: "auto", EnvVars: envVars("device"), Usage: "what to train on: auto (GPU 0 if one answers, else the CPU, saying why), cpu, or cuda:N[,fp32][,flash] (GEMMs in TF32 unless fp32; flash: the fused attention, no T x T scores)"}),
		altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "corpus", EnvVars: envVars("corpus"),
			Usage: "files or directories to train on (repeatable; default: the Go standard library sources of this Go installation)"}),
		altsrc.NewPathFlag(&cli.PathFlag{Name: "dataset", EnvVars: envVars("dataset"),
			Usage: "train on the packed dataset in DIR (`skein data pack`) instead of --corpus; its tokenizer is the run's"}),
		altsrc.NewPathFlag(&cli.PathFlag{Name: "out", Value: d.Out, EnvVars: envVars("out"), Usage: "run directory for checkpoint.safetensors and metrics.jsonl"}),
		altsrc.NewBoolFlag(&cli.BoolFlag{Name: "resume", EnvVars: envVars("resume"), Usage: "continue from <out>/checkpoint.safetensors if it exists"}),
		altsrc.NewBoolFlag(&cli.BoolFlag{Name: "force", EnvVars: envVars("force"), Usage: "start over, replacing <out>/checkpoint.safetensors (without --resume or --force an existing checkpoint is refused)"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "eval-every", Value: d.EvalEvery, EnvVars: envVars("eval-every"), Usage: "steps between validation losses (0 disables)"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "eval-batches", Value: d.EvalBatches, EnvVars: envVars("eval-batches"), Usage: "held-out batches per validation"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "checkpoint-every", Value: d.CheckpointEvery, EnvVars: envVars("checkpoint-every"), Usage: "steps between checkpoints (0: only at exit)"}),
		altsrc.NewBoolFlag(&cli.BoolFlag{Name: "quiet", EnvVars: envVars("quiet"), Usage: "no progress bar"}),
	}
	return &cli.Command{
		Name:  "train",
		Usage: "train a model in this one process",
		Description: "Single-process training on the local CPU: the baseline that distributed runs are\n" +
			"compared against. Shows step, loss, tokens/s and ETA; reports validation loss every\n" +
			"--eval-every steps; writes <out>/checkpoint.safetensors every --checkpoint-every steps\n" +
			"and on exit. Ctrl-C saves a checkpoint and exits; --resume continues from it with\n" +
			"exactly the losses an uninterrupted run would have had. An existing checkpoint is never\n" +
			"overwritten unless --force says to start over.",
		Flags:  flags,
		Before: altsrc.InitInputSourceWithContext(flags, altsrc.NewTomlSourceFromFlagFunc("config")),
		Action: runTrain,
	}
}

func runTrain(c *cli.Context) error {
	cfg, err := trainConfig(c)
	if err != nil {
		return err
	}
	dev, _, release, err := openDevice(c, cfg.Threads, false)
	if err != nil {
		return err
	}
	defer release()
	cfg.Dev = dev
	mc, _ := model.Preset(cfg.Preset)
	tokenizer := "byte"
	if cfg.Dataset != "" {
		if ds, err := data.ReadDataset(cfg.Dataset); err == nil {
			cfg.Tokenizer = ds.Tokenizer
		}
	}
	if t := cfg.Tokenizer; t != "" && t != "byte" {
		tokenizer = t
		if tok, err := data.NewTokenizer(t); err == nil {
			mc = mc.WithVocab(tok.VocabSize())
		}
	}
	fmt.Fprintf(os.Stderr, "skein train: %s model (%.2fM parameters), %s tokenizer, batch %d, %d steps\n",
		mc.Name, float64(mc.NumParams())/1e6, tokenizer, cfg.Batch, cfg.Steps)
	res, err := trainer.Train(c.Context, cfg)
	if res != nil {
		fmt.Fprintf(os.Stderr, "device %s: steps %d..%d at %.0f tokens/s\n", res.Device, res.StartStep, res.EndStep, res.TokensPerSec)
		if n := len(res.Losses); n > 0 {
			fmt.Fprintf(os.Stderr, "train loss %.4f -> %.4f\n", res.Losses[0], res.Losses[n-1])
		}
		if res.Checkpoint != "" {
			fmt.Fprintf(os.Stderr, "checkpoint: %s\n", res.Checkpoint)
		}
		if res.Interrupted {
			fmt.Fprintf(os.Stderr, "interrupted at step %d; continue with --resume\n", res.EndStep)
		}
	}
	return err
}

// trainConfig builds the trainer's settings from flags, environment and the
// config file (already merged by urfave/cli and altsrc, in that order).
func trainConfig(c *cli.Context) (trainer.TrainConfig, error) {
	if c.NArg() > 0 {
		return trainer.TrainConfig{}, fmt.Errorf("unexpected arguments %q (corpora go in --corpus)", c.Args().Slice())
	}
	log, err := logger(c)
	if err != nil {
		return trainer.TrainConfig{}, err
	}
	cfg := trainer.DefaultTrainConfig()
	cfg.Preset = c.String("preset")
	cfg.Steps = c.Int("steps")
	cfg.Batch = c.Int("batch")
	cfg.SeqLen = c.Int("seq-len")
	cfg.AdamW.LR = c.Float64("lr")
	cfg.AdamW.Warmup = c.Int("warmup")
	cfg.AdamW.MinLRFrac = c.Float64("min-lr-frac")
	cfg.AdamW.WeightDecay = c.Float64("weight-decay")
	cfg.AdamW.Clip = c.Float64("clip")
	cfg.Seed = c.Uint64("seed")
	cfg.Threads = c.Int("threads")
	cfg.Corpus = c.StringSlice("corpus")
	cfg.Tokenizer = c.String("tokenizer")
	if cfg.Dataset = c.Path("dataset"); cfg.Dataset != "" {
		if len(cfg.Corpus) > 0 {
			return trainer.TrainConfig{}, fmt.Errorf("--dataset and --corpus: train on one or the other")
		}
		if !c.IsSet("tokenizer") {
			cfg.Tokenizer = "" // the dataset's
		}
	}
	cfg.Out = c.Path("out")
	cfg.Resume = c.Bool("resume")
	cfg.Force = c.Bool("force")
	cfg.EvalEvery = c.Int("eval-every")
	cfg.EvalBatches = c.Int("eval-batches")
	cfg.CheckpointEvery = c.Int("checkpoint-every")
	cfg.Logger = log
	if !c.Bool("quiet") {
		cfg.Progress = os.Stderr
	}
	return cfg, cfg.Validate()
}
