package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"

	"github.com/skein-ml/skein/node"
	"github.com/skein-ml/skein/p2p"
)

// doctorCommand is `skein node doctor`.
func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "check, before joining, whether this machine and network can help a run",
		Description: `Joins the run's swarm through its bootstrap as an observer (it trains and serves nothing)
   and checks: the bootstrap and the run's manifest, whether the connection to the bootstrap is
   direct or relayed and its round trip, the download rate from it (on one of the run's shards)
   and the upload rate to it (timed where the bytes arrive), this machine's clock against the
   bootstrap's, whether others can dial this machine (the bootstrap dials it back on a new
   connection; without an answer, whether it has a public address), the device (--device) and
   its training throughput on the run's model, and whether the run fits in memory (or in
   --max-memory; on a GPU, the model in the GPU's free memory). Each line says pass, warn or
   fail, with advice; the command fails when a check fails. --json prints the checks for scripts.`,
		Flags: append([]cli.Flag{
			altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "bootstrap", EnvVars: envVars("bootstrap"), Usage: "the run's bootstrap multiaddr, as `skein bootstrap` prints it"}),
			altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "listen", EnvVars: envVars("listen"), Usage: "multiaddrs to listen on (default: QUIC and TCP, any port)"}),
			altsrc.NewStringFlag(&cli.StringFlag{Name: "timing", Value: "wan", EnvVars: envVars("timing"), Usage: "membership timers: " + strings.Join(p2p.TimingNames(), ", ")}),
			altsrc.NewIntFlag(&cli.IntFlag{Name: "threads", EnvVars: envVars("threads"), Usage: "CPU threads to measure with (0: all cores)"}),
			altsrc.NewStringFlag(&cli.StringFlag{Name: "device", Value: "auto", EnvVars: envVars("device"), Usage: "the device to measure: auto, cpu or cuda:N[,fp32][,flash] (as node join)"}),
			altsrc.NewIntFlag(&cli.IntFlag{Name: "max-memory", EnvVars: envVars("max-memory"), Usage: "judge the memory check against this many MiB, as node join --max-memory would"}),
			&cli.BoolFlag{Name: "json", Usage: "print the checks as JSON"},
		}, emulationFlags()...),
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			cfg := node.DoctorConfig{Bootstrap: c.StringSlice("bootstrap"), Listen: c.StringSlice("listen"),
				Threads: c.Int("threads"), MaxMemoryMiB: c.Int("max-memory"), WAN: emulatedLink(c), Logger: log}
			if cfg.Timing, err = p2p.TimingByName(c.String("timing")); err != nil {
				return fmt.Errorf("--timing: %w", err)
			}
			var release func()
			if cfg.Device, cfg.DeviceNote, release, err = openDevice(c, cfg.Threads, true); err != nil {
				return err
			}
			defer release()
			if !c.Bool("json") {
				fmt.Fprintln(os.Stderr, "skein node doctor: joining the run as an observer and measuring (seconds; the device is timed on the run's model)")
			}
			checks, err := node.Doctor(c.Context, cfg)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				if err := enc.Encode(checks); err != nil {
					return err
				}
				for _, ch := range checks {
					if ch.Status == node.CheckFail {
						return cli.Exit("", 1)
					}
				}
				return nil
			}
			return node.WriteChecks(c.App.Writer, checks)
		},
	}
}

// pullCommand is `skein node pull`.
func pullCommand() *cli.Command {
	return &cli.Command{
		Name:      "pull",
		Usage:     "download a run's certified weights into a checkpoint",
		ArgsUsage: " ",
		Description: `Joins the run's swarm through its bootstrap as an observer (it trains and serves nothing),
   takes the latest round certificate the bootstrap countersigned (checked against the
   bootstrap's peer ID), and downloads that round's weights from the volunteers that hold them,
   every chunk checked against the certified state hash. The checkpoint (--out) holds the
   weights the run agreed on, without optimizer state: skein eval, sample and export take it.
   Data-parallel DiLoCo runs only (NoLoCo members hold different weights; staged runs are not
   built yet).`,
		Flags: []cli.Flag{
			altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "bootstrap", EnvVars: envVars("bootstrap"), Usage: "the run's bootstrap multiaddr, as `skein bootstrap` prints it"}),
			altsrc.NewStringSliceFlag(&cli.StringSliceFlag{Name: "listen", EnvVars: envVars("listen"), Usage: "multiaddrs to listen on (default: QUIC and TCP, any port)"}),
			altsrc.NewStringFlag(&cli.StringFlag{Name: "timing", Value: "wan", EnvVars: envVars("timing"), Usage: "membership timers: " + strings.Join(p2p.TimingNames(), ", ")}),
			&cli.PathFlag{Name: "out", Required: true, Usage: "the checkpoint to write"},
			&cli.DurationFlag{Name: "wait", Value: 2 * time.Minute, Usage: "how long to wait for a certified state the volunteers can serve"},
		},
		Action: func(c *cli.Context) error {
			log, err := logger(c)
			if err != nil {
				return err
			}
			cfg := node.PullConfig{Bootstrap: c.StringSlice("bootstrap"), Listen: c.StringSlice("listen"),
				Out: c.Path("out"), Wait: c.Duration("wait"), Progress: os.Stderr, Logger: log}
			if cfg.Timing, err = p2p.TimingByName(c.String("timing")); err != nil {
				return fmt.Errorf("--timing: %w", err)
			}
			res, err := node.Pull(c.Context, cfg)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "pulled round %d (state %016x) of the %s model, %d parameters, from %s, into %s\n",
				res.Round, res.Hash, res.Preset, res.Params, res.From, cfg.Out)
			return nil
		},
	}
}
