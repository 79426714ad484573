// Command skein is the one binary of Skein: train one neural network on many
// volunteer machines. This package only parses flags, environment and config
// files, builds objects and calls node and bootstrap; it holds no logic.
//
// Settings are taken, highest first, from flags, SKEIN_* environment
// variables, the --config TOML file, then defaults.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/p2p/wan"
	"github.com/urfave/cli/v2"
	"github.com/urfave/cli/v2/altsrc"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newApp().RunContext(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "skein:", err)
		var ec cli.ExitCoder
		if errors.As(err, &ec) {
			os.Exit(ec.ExitCode())
		}
		os.Exit(1)
	}
}

func newApp() *cli.App {
	return &cli.App{
		Name:    "skein",
		Usage:   "train one neural network together on volunteer machines",
		Version: version,
		Description: "Skein trains a GPT-style model with low-communication optimizers (DiLoCo, NoLoCo)\n" +
			"across machines that join and leave over the internet.\n\n" +
			"Settings come, highest first, from flags, SKEIN_* environment variables,\n" +
			"the --config TOML file (keys are flag names), then defaults.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "log-level", Value: "info", EnvVars: []string{"SKEIN_LOG_LEVEL"},
				Usage: "log verbosity: debug, info, warn or error"},
		},
		Commands: []*cli.Command{
			trainCommand(),
			benchCommand(),
			bootstrapCommand(),
			nodeCommand(),
			demoCommand(),
			statusCommand(),
			tokenCommand(),
			tokenizeCommand(),
			dataCommand(),
			evalCommand(),
			sampleCommand(),
			exportCommand(),
			importCommand(),
		},
	}
}

// envVars names the environment variable of a flag: SKEIN_ and the flag's
// name in upper case with dashes as underscores (--seq-len: SKEIN_SEQ_LEN).
func envVars(flag string) []string {
	return []string{"SKEIN_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))}
}

func logger(c *cli.Context) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.String("log-level"))); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.String("log-level"))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})), nil
}

// openDevice is --device for a command: the device, and a release to
// defer (a GPU's context is closed); auto's note goes to stderr unless
// quiet (the caller shows it elsewhere).
func openDevice(c *cli.Context, threads int, quiet bool) (dev kernels.Device, note string, release func(), err error) {
	dev, note, err = kernels.SelectDevice(c.String("device"), threads)
	if err != nil {
		return nil, "", nil, err
	}
	if note != "" && !quiet {
		fmt.Fprintln(os.Stderr, note)
	}
	release = func() {}
	if gpu, ok := dev.(*kernels.CUDA); ok {
		release = gpu.Close
	}
	return dev, note, release, nil
}

// emulationFlags slow this process's QUIC packets down like a WAN link.
func emulationFlags() []cli.Flag {
	return []cli.Flag{
		altsrc.NewFloat64Flag(&cli.Float64Flag{Name: "emulate-rate", EnvVars: envVars("emulate-rate"),
			Usage: "emulate a link of this many Mbit/s on every QUIC packet sent (demos and tests; 0: off)"}),
		altsrc.NewDurationFlag(&cli.DurationFlag{Name: "emulate-latency", EnvVars: envVars("emulate-latency"),
			Usage: "emulate this one-way latency on every QUIC packet sent (demos and tests)"}),
	}
}

// emulatedLink is the link the emulation flags ask for, or nil.
func emulatedLink(c *cli.Context) *wan.Link {
	rate, lat := c.Float64("emulate-rate"), c.Duration("emulate-latency")
	if rate <= 0 && lat <= 0 {
		return nil
	}
	return &wan.Link{Rate: rate * 1e6, Latency: lat}
}
