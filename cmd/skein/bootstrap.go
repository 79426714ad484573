package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"

	"github.com/skein-ml/skein/p2p"
)

func bootstrapCommand() *cli.Command {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "config", EnvVars: envVars("config"), Usage: "TOML file of settings (keys are flag names)"},
		altsrc.NewStringFlag(&cli.StringFlag{Name: "run-id", Value: "skein-demo", EnvVars: envVars("run-id"),
			Usage: "name of the training run; nodes of another run are refused"}),
		altsrc.NewPathFlag(&cli.PathFlag{Name: "data-dir", Value: "skein-bootstrap", EnvVars: envVars("data-dir"),
			Usage: "directory for the identity key (kept across restarts, mode 0600) and known peers"}),
		altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "listen", EnvVars: envVars("listen"),
			Usage: "multiaddrs to listen on (default: QUIC and TCP on port 4001, all IPv4 interfaces)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "advertise", EnvVars: envVars("advertise"),
			Usage: "public ip:port of the QUIC listener when it differs from the listen address (behind a port forward)"}),
		altsrc.NewStringFlag(&cli.StringFlag{Name: "timing", Value: "wan", EnvVars: envVars("timing"),
			Usage: "membership timers: wan (internet), lan or fast (tests)"}),
	}
	return &cli.Command{
		Name:  "bootstrap",
		Usage: "run the entry point of a training run: membership seed and relay",
		Description: "Starts a libp2p host with a stable identity that volunteers join through: it is the\n" +
			"membership seed (memberlist gossip over libp2p) and a relay v2 for volunteers behind NAT. It is\n" +
			"never on the training critical path: members keep training, and new ones join through any\n" +
			"member, while it is down. Prints the full multiaddr to give to `skein node join --bootstrap`.\n" +
			"Runs until Ctrl-C, then leaves the membership gracefully.",
		Flags:  flags,
		Before: altsrc.InitInputSourceWithContext(flags, altsrc.NewTomlSourceFromFlagFunc("config")),
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			cfg := p2p.DefaultSeedConfig(c.String("run-id"), c.Path("data-dir"))
			if l := c.StringSlice("listen"); len(l) > 0 {
				cfg.ListenAddrs = l
			}
			cfg.AdvertiseAddr = c.String("advertise")
			cfg.Version = version
			cfg.Logger = log
			if cfg.Timing, err = timing(c.String("timing")); err != nil {
				return err
			}
			seed, err := p2p.NewSeed(c.Context, cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stdout, "%s\n", seed.FullAddr())
			fmt.Fprintf(os.Stderr, "skein bootstrap: run %q; volunteers join with\n  skein node join --run-id %s --bootstrap %s\n",
				cfg.RunID, cfg.RunID, seed.FullAddr())
			sub := seed.Subscribe()
			defer sub.Close()
			for {
				select {
				case <-c.Context.Done():
					fmt.Fprintln(os.Stderr, "skein bootstrap: leaving")
					return seed.Close()
				case ev, ok := <-sub.C:
					if !ok {
						return seed.Close()
					}
					log.Info("membership", "event", ev.Kind, "peer", ev.Member.ID, "role", ev.Member.Meta.Role,
						"members", seed.NumMembers())
				}
			}
		},
	}
}
