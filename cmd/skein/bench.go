package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/skein-ml/skein/node"
)

func benchCommand() *cli.Command {
	return &cli.Command{
		Name:  "bench",
		Usage: "measure performance (see BENCHMARKS.md)",
		Subcommands: []*cli.Command{{
			Name:  "train",
			Usage: "training tokens/s of a preset on random tokens (the counterpart of bench/torch_gpt.py)",
			Description: "Times full training steps (forward, backward, gradient clipping, AdamW) at the\n" +
				"preset's context length and prints one JSON line. bench/train_throughput.sh runs it\n" +
				"side by side with the PyTorch reference and reports the ratio.",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "preset", Value: "tiny", Usage: "model preset"},
				&cli.IntFlag{Name: "batch", Value: 16, Usage: "sequences per step"},
				&cli.IntFlag{Name: "threads", Value: 1, Usage: "CPU threads (0: all cores)"},
				&cli.IntFlag{Name: "steps", Value: 20, Usage: "timed steps"},
				&cli.IntFlag{Name: "warmup", Value: 3, Usage: "untimed steps first"},
			},
			Action: func(c *cli.Context) error {
				res, err := node.BenchTrain(c.Context, c.String("preset"), c.Int("batch"), c.Int("threads"), c.Int("steps"), c.Int("warmup"))
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
