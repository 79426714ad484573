package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/node"
	"github.com/skein-ml/skein/p2p"
)

func nodeCommand() *cli.Command {
	d := node.DefaultVolunteerConfig("skein-demo")
	flags := []cli.Flag{
		&cli.StringFlag{Name: "config", EnvVars: envVars("config"), Usage: "TOML file of settings (keys are flag names)"},
		altsrc.NewStringFlag(&cli.StringFlag{Name: "run-id", Value: d.RunID, EnvVars: envVars("run-id"), Usage: "the run to join (as given by its bootstrap)"}),
		altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "bootstrap", EnvVars: envVars("bootstrap"),
			Usage: "full multiaddr of the run's bootstrap (repeatable); known peers from earlier runs are tried too"}),
		altsrc.NewPathFlag(&cli.PathFlag{Name: "data-dir", Value: "skein-node", EnvVars: envVars("data-dir"),
			Usage: "directory for the identity key, known peers and the local checkpoint (resumed on restart)"}),
		altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "listen", EnvVars: envVars("listen"), Usage: "multiaddrs to listen on (default: QUIC and TCP, any port)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "timing", Value: "wan", EnvVars: envVars("timing"), Usage: "membership timers: wan, lan or fast (tests)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "preset", Value: d.Preset, EnvVars: envVars("preset"), Usage: "model preset: " + strings.Join(model.PresetNames(), ", ") + " (the whole run must agree)"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "batch", Value: d.Batch, EnvVars: envVars("batch"), Usage: "sequences per inner step"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "seq-len", Value: 0, EnvVars: envVars("seq-len"), Usage: "tokens per sequence (0: the preset's context)"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "inner-steps", Value: d.InnerSteps, EnvVars: envVars("inner-steps"), Usage: "inner AdamW steps between outer DiLoCo rounds (H)"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "rounds", Value: 0, EnvVars: envVars("rounds"), Usage: "leave after this many rounds (0: until Ctrl-C)"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "min-peers", Value: 1, EnvVars: envVars("min-peers"), Usage: "volunteers (self included) to wait for before the first round"}),
		altsrc.NewFloat64Flag(&cli.Float64Flag{Name: "lr", Value: d.AdamW.LR, EnvVars: envVars("lr"), Usage: "inner AdamW learning rate"}),
		altsrc.NewUint64Flag(&cli.Uint64Flag{Name: "seed", Value: d.Seed, EnvVars: envVars("seed"), Usage: "seed of the initial weights (the whole run must agree)"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "threads", Value: 0, EnvVars: envVars("threads"), Usage: "CPU threads to lend (0: all cores)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "codec", Value: "minmax8", EnvVars: envVars("codec"), Usage: "pseudo-gradient codec on the wire: minmax8, int8, int4, bf16, fp16 or fp32"}),
		altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "corpus", EnvVars: envVars("corpus"), Usage: "training files or directories (default: the Go standard library sources)"}),
	}
	join := &cli.Command{
		Name:  "join",
		Usage: "lend this machine to a training run",
		Description: "Joins a run through its bootstrap (or any member it has seen before), downloads the run's\n" +
			"current weights from a member, and trains with DiLoCo: --inner-steps local AdamW steps, then a\n" +
			"fault-tolerant ring all-reduce of the quantized pseudo-gradient with the other volunteers.\n" +
			"Shows one line per round. Ctrl-C saves a local checkpoint and leaves gracefully; running the\n" +
			"same command again resumes it.",
		Flags:  flags,
		Before: altsrc.InitInputSourceWithContext(flags, altsrc.NewTomlSourceFromFlagFunc("config")),
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			cfg := node.DefaultVolunteerConfig(c.String("run-id"))
			cfg.Bootstrap, cfg.DataDir, cfg.Listen = c.StringSlice("bootstrap"), c.Path("data-dir"), c.StringSlice("listen")
			if cfg.Timing, err = p2p.TimingByName(c.String("timing")); err != nil {
				return fmt.Errorf("--timing: %w", err)
			}
			cfg.Preset, cfg.Batch, cfg.SeqLen = c.String("preset"), c.Int("batch"), c.Int("seq-len")
			cfg.InnerSteps, cfg.Rounds, cfg.MinPeers = c.Int("inner-steps"), c.Int("rounds"), c.Int("min-peers")
			cfg.AdamW.LR, cfg.Seed, cfg.Threads = c.Float64("lr"), c.Uint64("seed"), c.Int("threads")
			cfg.Corpus = c.StringSlice("corpus")
			codec, err := compression.ParseCodec(c.String("codec"))
			if err != nil {
				return fmt.Errorf("--codec: %w", err)
			}
			cfg.Ring.Codec.Codec = codec
			if len(cfg.Bootstrap) == 0 {
				fmt.Fprintln(os.Stderr, "skein node join: no --bootstrap given; trying peers known from earlier runs")
			}
			cfg.Logger, cfg.Progress = log, os.Stderr
			return node.Join(c.Context, cfg)
		},
	}
	return &cli.Command{Name: "node", Usage: "volunteer commands", Subcommands: []*cli.Command{join}}
}
