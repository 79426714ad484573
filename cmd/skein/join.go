package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/node"
	"github.com/skein-ml/skein/p2p"
)

func nodeCommand() *cli.Command {
	d := node.DefaultVolunteerConfig("")
	flags := []cli.Flag{
		&cli.StringFlag{Name: "config", EnvVars: envVars("config"), Usage: "TOML file of settings (keys are flag names)"},
		altsrc.NewStringFlag(&cli.StringFlag{Name: "run-id", Value: d.RunID, EnvVars: envVars("run-id"), Usage: "the run to join (default: the run the --bootstrap serves; needed only to rejoin through known peers)"}),
		altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "bootstrap", EnvVars: envVars("bootstrap"),
			Usage: "full multiaddr of the run's bootstrap (repeatable); known peers from earlier runs are tried too"}),
		altsrc.NewPathFlag(&cli.PathFlag{Name: "data-dir", Value: "skein-node", EnvVars: envVars("data-dir"),
			Usage: "directory for the identity key, known peers, the run's manifest and corpus shards, and the local checkpoint (resumed on restart); one process at a time"}),
		altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "listen", EnvVars: envVars("listen"), Usage: "multiaddrs to listen on (default: QUIC and TCP, any port)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "timing", Value: "wan", EnvVars: envVars("timing"), Usage: "membership timers: " + strings.Join(p2p.TimingNames(), ", ") + " (tests)"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "threads", Value: 0, EnvVars: envVars("threads"), Usage: "CPU threads to lend (0: all cores)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "device", Value: "auto", EnvVars: envVars("device"), Usage: "what to train on: auto (GPU 0 if one answers, else the CPU, saying why), cpu, or cuda:N[,fp32][,flash] (an NVIDIA GPU through its driver; GEMMs in TF32 unless fp32; flash: the fused attention, no T x T scores in memory)"}),
		altsrc.NewFloat64Flag(&cli.Float64Flag{Name: "max-upload", EnvVars: envVars("max-upload"), Usage: "cap what this volunteer sends, in Mbit/s, on every stream (0: no cap); the run's planners are told"}),
		altsrc.NewFloat64Flag(&cli.Float64Flag{Name: "max-download", EnvVars: envVars("max-download"), Usage: "cap what this volunteer receives, in Mbit/s, on every stream (0: no cap)"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "max-memory", EnvVars: envVars("max-memory"), Usage: "refuse a run whose model, optimizer state and activations need more than this many MiB (0: the system's available memory)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "active-hours", EnvVars: envVars("active-hours"), Usage: "train only in these hours of local time, e.g. 22:00-07:00 or 9:00-12:00,14:00-18:00 (default: all day); outside them the volunteer leaves the run with its checkpoint saved and joins again when they start. SIGUSR1 pauses and SIGUSR2 resumes it the same way"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "rounds", Value: 0, EnvVars: envVars("rounds"), Usage: "leave after this many rounds (0: until Ctrl-C)"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "min-peers", Value: 1, EnvVars: envVars("min-peers"), Usage: "volunteers (self included) to wait for before the first round"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "val-batches", Value: d.ValBatches, EnvVars: envVars("val-batches"), Usage: "held-out batches evaluated after each round for the validation loss (0: none)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "metrics", EnvVars: envVars("metrics"), Usage: "serve Prometheus metrics on http://ADDR/metrics (e.g. 127.0.0.1:9101)"}),
		&cli.StringFlag{Name: "hostile", Hidden: true, Usage: "chaos tests only (skein demo --chaos --hostile): misbehave as one of " + node.HostileNames()},
		altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "corpus", EnvVars: envVars("corpus"), Usage: "training files or directories, for a run whose manifest says data source \"local\" (default: the Go standard library sources); a \"shards\" run brings its own"}),
		altsrc.NewPathFlag(&cli.PathFlag{Name: "manifest", EnvVars: envVars("manifest"), Usage: "pin the run: refuse to join unless it serves exactly this manifest file"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "token", EnvVars: envVars("token"), Usage: "join token of a closed run, or @FILE holding it; the run's operator makes it for this node's peer ID (`skein token issue`); a closed run refuses a volunteer without one and says which peer ID to ask for"}),
		// Run-wide settings come from the run's manifest. Given here, each
		// must agree with it, or the volunteer is refused with the field.
		altsrc.NewStringFlag(&cli.StringFlag{Name: "preset", EnvVars: envVars("preset"), Usage: "check: the run's model preset must be this (" + strings.Join(model.PresetNames(), ", ") + ")"}),
		altsrc.NewUint64Flag(&cli.Uint64Flag{Name: "seed", EnvVars: envVars("seed"), Usage: "check: the run's seed must be this"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "batch", EnvVars: envVars("batch"), Usage: "check: the run's batch must be this"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "seq-len", EnvVars: envVars("seq-len"), Usage: "check: the run's sequence length must be this"}),
		altsrc.NewIntFlag(&cli.IntFlag{Name: "inner-steps", EnvVars: envVars("inner-steps"), Usage: "check: the run's inner steps per round (H) must be this"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "codec", EnvVars: envVars("codec"), Usage: "check: the run's wire codec must be this (" + strings.Join(compression.CodecNames(), ", ") + ")"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "optimizer", EnvVars: envVars("optimizer"), Usage: "check: the run's optimizer must be this (diloco, noloco)"}),
	}
	flags = append(flags, emulationFlags()...)
	join := &cli.Command{
		Name:  "join",
		Usage: "lend this machine to a training run",
		Description: "Joins a run through its bootstrap (or any member it has seen before), fetches the run's\n" +
			"manifest (model, optimizer, data: every run-wide setting) and its corpus shards from the members,\n" +
			"downloads the run's current weights, and trains: the manifest's inner steps of local AdamW, then\n" +
			"the outer step: DiLoCo's robust average of the quantized pseudo-gradient with the other volunteers\n" +
			"(the butterfly: each part aggregated by two members with a trimmed mean and cross-checked; plain or\n" +
			"overlapped with the next inner phase), or NoLoCo's averaging with a random partner.\n" +
			"Shows one line per round (loss, validation loss, tokens/s) and reports it to the bootstrap's status\n" +
			"page. Ctrl-C saves a local checkpoint and leaves gracefully; the same command resumes it (an\n" +
			"overlapped run first lands the round whose exchange is under way, waiting at most 3 s).\n\n" +
			"A closed run (manifest [admission] mode = \"closed\") admits only nodes with a join token for their\n" +
			"peer ID: without one (or with an expired one) the volunteer stops at once and prints its peer ID\n" +
			"and the command the run's operator runs to make one; then join with --token.",
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
			cfg.Rounds, cfg.MinPeers, cfg.Threads = c.Int("rounds"), c.Int("min-peers"), c.Int("threads")
			cfg.MaxUploadMbps, cfg.MaxDownloadMbps, cfg.MaxMemoryMiB = c.Float64("max-upload"), c.Float64("max-download"), c.Int("max-memory")
			cfg.ValBatches, cfg.MetricsAddr, cfg.Corpus = c.Int("val-batches"), c.String("metrics"), c.StringSlice("corpus")
			if h := c.String("hostile"); h != "" {
				if cfg.Hostile = node.HostileMode(h); cfg.Hostile == "" {
					return fmt.Errorf("--hostile %q: want one of %s", h, node.HostileNames())
				}
				fmt.Fprintf(c.App.ErrWriter, "warning: this volunteer is hostile (%s), for chaos tests\n", h)
			}
			cfg.Local = manifest.Local{Preset: c.String("preset"), Batch: c.Int("batch"), SeqLen: c.Int("seq-len"),
				InnerSteps: c.Int("inner-steps"), Codec: c.String("codec"), Optimizer: c.String("optimizer")}
			if c.IsSet("seed") {
				seed := c.Uint64("seed")
				cfg.Local.Seed = &seed
			}
			if p := c.Path("manifest"); p != "" {
				m, err := manifest.Load(p)
				if err != nil {
					return fmt.Errorf("--manifest: %w", err)
				}
				cfg.Manifest = &m
			}
			if len(cfg.Bootstrap) == 0 {
				fmt.Fprintln(os.Stderr, "skein node join: no --bootstrap given; trying peers known from earlier runs")
			}
			if v := c.String("token"); v != "" {
				if cfg.Token, err = readToken(v); err != nil {
					return fmt.Errorf("--token: %w", err)
				}
			}
			cfg.WAN = emulatedLink(c)
			cfg.Version, cfg.Logger, cfg.Progress = version, log, os.Stderr
			if cfg.Hostile == node.HostileGhosts {
				return node.RunGhosts(c.Context, cfg) // an outsider: it never joins
			}
			dev, _, release, err := openDevice(c, cfg.Threads, false)
			if err != nil {
				return err
			}
			defer release()
			cfg.Device = dev
			hours, err := node.ParseActiveHours(c.String("active-hours"))
			if err != nil {
				return fmt.Errorf("--active-hours: %w", err)
			}
			return tokenHint(node.JoinScheduled(c.Context, cfg, hours, pauseSignals(c.Context)), "volunteer")
		},
	}
	return &cli.Command{Name: "node", Usage: "volunteer commands", Subcommands: []*cli.Command{join, doctorCommand(), pullCommand()}}
}
