package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/skein-ml/skein/bootstrap/status"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:      "status",
		Usage:     "print a run's status from its bootstrap's status page",
		ArgsUsage: "ADDR",
		Description: "Reads the JSON API behind a bootstrap's status page (GET ADDR/api/status; ADDR as given to\n" +
			"`skein bootstrap --http`, e.g. 127.0.0.1:8080 or https://run.example.org) and prints the run at a\n" +
			"glance: round, losses, throughput, traffic and the members table.",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("want one argument, the status page's address (got %d)", c.NArg())
			}
			addr := c.Args().First()
			if !strings.Contains(addr, "://") {
				addr = "http://" + addr
			}
			snap, err := status.Fetch(c.Context, addr)
			if err != nil {
				return err
			}
			status.FormatText(os.Stdout, snap)
			return nil
		},
	}
}
