package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"

	"github.com/skein-ml/skein/bootstrap"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p"
)

func bootstrapCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "config", EnvVars: envVars("config"), Usage: "TOML file of settings (keys are flag names)"},
		altsrc.NewPathFlag(&cli.PathFlag{Name: "manifest", EnvVars: envVars("manifest"),
			Usage: "the run's manifest (TOML: run id, model, optimizer, data; see manifest); default: the demo run, tiny model, corpus packed into shards"}),
		altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "corpus", EnvVars: envVars("corpus"),
			Usage: "files or directories packed into the run's shards when the manifest's data source is \"shards\" and lists none (default: the Go standard library sources)"}),
		altsrc.NewPathFlag(&cli.PathFlag{Name: "dataset", EnvVars: envVars("dataset"),
			Usage: "train on the packed dataset in DIR (`skein data pack`): serve its shards, list them in the manifest (data.source = \"dataset\"); each volunteer fetches only the chunks it trains on"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "http", EnvVars: envVars("http"),
			Usage: "serve the public status page, its JSON/SSE API and /metrics on ADDR (e.g. :8080); read-only, safe to expose"}),
		altsrc.NewPathFlag(&cli.PathFlag{Name: "data-dir", Value: "skein-bootstrap", EnvVars: envVars("data-dir"),
			Usage: "directory for the identity key (kept across restarts, mode 0600) and known peers"}),
		altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "listen", EnvVars: envVars("listen"),
			Usage: "multiaddrs to listen on (default: QUIC and TCP on port 4001, all IPv4 interfaces)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "advertise", EnvVars: envVars("advertise"),
			Usage: "public ip:port of the QUIC listener when it differs from the listen address (behind a port forward)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "timing", Value: "wan", EnvVars: envVars("timing"),
			Usage: "membership timers: wan (internet), lan or fast (tests)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "token", EnvVars: envVars("token"),
			Usage: "closed runs: this bootstrap's join token (role bootstrap, for its peer ID), or @FILE holding it"}),
		altsrc.NewPathFlag(&cli.PathFlag{Name: "run-key", EnvVars: envVars("run-key"),
			Usage: "closed runs: the run key file (`skein token keygen`); the bootstrap then issues and renews its own token instead of taking --token"}),
	}
	flags = append(flags, emulationFlags()...)
	return &cli.Command{
		Name:  "bootstrap",
		Usage: "run the entry point of a training run: manifest, corpus shards, membership seed, relay, status page",
		Description: "Starts a libp2p host with a stable identity that volunteers join through: it serves the run's\n" +
			"manifest and corpus shards (packing the corpus at start when the manifest lists none), is the\n" +
			"membership seed (memberlist gossip over libp2p) and a relay v2 for volunteers behind NAT, keeps the\n" +
			"volunteers' telemetry in DATA-DIR/history.db and, with --http, serves the public status page. It is\n" +
			"never on the training critical path: members keep training, and new ones join through any\n" +
			"member, while it is down. Prints the full multiaddr to give to `skein node join --bootstrap`.\n" +
			"Runs until Ctrl-C, then leaves the membership gracefully.\n\n" +
			"A closed run's bootstrap is a member like any other: give it a token of role bootstrap for its\n" +
			"peer ID (--token; started without one, it prints the peer ID and the command to make one) or\n" +
			"the run key itself (--run-key), which need not otherwise be on the bootstrap.",
		Flags:  flags,
		Before: altsrc.InitInputSourceWithContext(flags, altsrc.NewTomlSourceFromFlagFunc("config")),
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			cfg := bootstrap.DefaultConfig(c.Path("data-dir"))
			if p := c.Path("manifest"); p != "" {
				if cfg.Manifest, err = manifest.LoadTemplate(p); err != nil {
					return fmt.Errorf("--manifest: %w", err)
				}
			}
			cfg.Corpus, cfg.HTTPAddr, cfg.Dataset = c.StringSlice("corpus"), c.String("http"), c.Path("dataset")
			cfg.Listen, cfg.Advertise = c.StringSlice("listen"), c.String("advertise")
			if v := c.String("token"); v != "" {
				if cfg.Token, err = readToken(v); err != nil {
					return fmt.Errorf("--token: %w", err)
				}
			}
			if p := c.Path("run-key"); p != "" {
				if cfg.RunKey, err = p2p.LoadRunKey(p); err != nil {
					return fmt.Errorf("--run-key: %w", err)
				}
			}
			cfg.WAN = emulatedLink(c)
			cfg.Version, cfg.Logger, cfg.Out = version, log, os.Stderr
			if cfg.Timing, err = p2p.TimingByName(c.String("timing")); err != nil {
				return fmt.Errorf("--timing: %w", err)
			}
			// The first line on stdout is the address to join through, alone,
			// for scripts; everything for people goes to stderr.
			cfg.Ready = func(info bootstrap.Info) {
				if len(info.Addrs) > 0 {
					fmt.Fprintln(os.Stdout, info.Addrs[0])
				}
			}
			return tokenHint(bootstrap.Run(c.Context, cfg), "bootstrap")
		},
	}
}
