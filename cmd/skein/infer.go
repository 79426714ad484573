package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/trainer"
)

// inferFlags are the flags eval and sample share.
func inferFlags() []cli.Flag {
	return []cli.Flag{
		&cli.PathFlag{Name: "checkpoint", Required: true, Usage: "a whole model's checkpoint (skein train's <out>/checkpoint.safetensors, a data-parallel volunteer's)"},
		&cli.StringFlag{Name: "device", Value: "auto", Usage: "where to run: auto (GPU 0 if one answers, else the CPU, saying why), cpu, or cuda:N[,fp32][,flash] (flash: the fused attention)"},
		&cli.IntFlag{Name: "threads", Usage: "CPU threads (0: all cores)"},
	}
}

// loadForInference opens the device and the checkpoint.
func loadForInference(c *cli.Context) (*trainer.Loaded, error) {
	dev, note, err := kernels.SelectDevice(c.String("device"), c.Int("threads"))
	if err != nil {
		return nil, err
	}
	if note != "" {
		fmt.Fprintln(os.Stderr, note)
	}
	return trainer.LoadModel(c.Path("checkpoint"), dev, 0)
}

func evalCommand() *cli.Command {
	return &cli.Command{
		Name:      "eval",
		Usage:     "the mean next-token loss of a checkpoint on a text file",
		ArgsUsage: " ",
		Description: "Tokenizes --data with the checkpoint's tokenizer and scores the first --tokens\n" +
			"predictions (so --tokens + 1 tokens are read; without --tokens, every token after the\n" +
			"first) in consecutive windows of the sequence length the checkpoint was trained at, T:\n" +
			"window k reads tokens [kT, kT+T) and predicts [kT+1, kT+T+1), the last window shorter.\n" +
			"Prints exactly two lines on stdout, \"loss L\" and \"perplexity P\"; progress goes to\n" +
			"stderr. Asking for more tokens than the file holds is an error.",
		Flags: append(inferFlags(),
			&cli.PathFlag{Name: "data", Required: true, Usage: "the text file to score"},
			&cli.IntFlag{Name: "tokens", Usage: "predictions to score from the start of the file (0: the whole file)"},
		),
		Action: func(c *cli.Context) error {
			if c.Int("tokens") < 0 {
				return fmt.Errorf("--tokens %d must be >= 0", c.Int("tokens"))
			}
			l, err := loadForInference(c)
			if err != nil {
				return err
			}
			text, err := os.ReadFile(c.Path("data"))
			if err != nil {
				return err
			}
			ids := l.Tokenizer.Encode(text)
			last := time.Now()
			res, err := l.Eval(c.Context, ids, c.Int("tokens"), func(done, total int) {
				if time.Since(last) >= time.Second || done == total {
					last = time.Now()
					fmt.Fprintf(os.Stderr, "\reval: %d of %d predictions", done, total)
				}
			})
			fmt.Fprintln(os.Stderr)
			if err != nil {
				return fmt.Errorf("%s: %w", c.Path("data"), err)
			}
			fmt.Printf("loss %.4f\nperplexity %.4f\n", res.Loss, res.Perplexity())
			return nil
		},
	}
}

func sampleCommand() *cli.Command {
	d := trainer.SampleConfig{MaxTokens: 200, Temperature: 1}
	return &cli.Command{
		Name:      "sample",
		Usage:     "continue a prompt with a checkpoint's model",
		ArgsUsage: " ",
		Description: "Encodes --prompt with the checkpoint's tokenizer and writes only the continuation to\n" +
			"stdout, token by token as it is drawn. --temperature 0 takes the most likely token each\n" +
			"time; otherwise tokens are drawn from the softmax at that temperature, among the --top-k\n" +
			"most likely (0: all). The same --seed gives the same text. The model sees the last T\n" +
			"tokens, T being the sequence length it was trained at.",
		Flags: append(inferFlags(),
			&cli.StringFlag{Name: "prompt", Required: true, Usage: "the text to continue"},
			&cli.Float64Flag{Name: "temperature", Value: d.Temperature, Usage: "softmax temperature (0: greedy)"},
			&cli.IntFlag{Name: "top-k", Usage: "draw among the K most likely tokens (0: all)"},
			&cli.Uint64Flag{Name: "seed", Usage: "seed of the draws (0: a new one each run)"},
			&cli.IntFlag{Name: "max-tokens", Value: d.MaxTokens, Usage: "tokens to generate"},
		),
		Action: func(c *cli.Context) error {
			cfg := trainer.SampleConfig{MaxTokens: c.Int("max-tokens"), Temperature: c.Float64("temperature"),
				TopK: c.Int("top-k"), Seed: c.Uint64("seed")}
			if cfg.Seed == 0 {
				cfg.Seed = uint64(time.Now().UnixNano())
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			l, err := loadForInference(c)
			if err != nil {
				return err
			}
			out := bufio.NewWriter(os.Stdout)
			defer out.Flush()
			err = l.Sample(c.Context, l.Tokenizer.Encode([]byte(c.String("prompt"))), cfg, func(id int32) error {
				if _, err := out.Write(l.Tokenizer.Decode([]int32{id})); err != nil {
					return err
				}
				return out.Flush()
			})
			if err == context.Canceled {
				return nil
			}
			fmt.Fprintln(out)
			return err
		},
	}
}

func exportCommand() *cli.Command {
	return &cli.Command{
		Name:      "export",
		Usage:     "write a checkpoint as a Hugging Face GPT-2 model directory",
		ArgsUsage: " ",
		Description: "Writes --out/config.json and --out/model.safetensors, which transformers loads as\n" +
			"GPT2LMHeadModel: Hugging Face's tensor names, Conv1D (in, out) matrices, the real\n" +
			"vocabulary (the padding rows Skein's kernels use are dropped), lm_head tied to wte, and\n" +
			"for the gpt2 tokenizer its vocab.json and merges.txt.\n" +
			"skein import reads such a directory back.",
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "checkpoint", Required: true, Usage: "a whole model's checkpoint"},
			&cli.PathFlag{Name: "out", Required: true, Usage: "the directory to write (created if needed)"},
		},
		Action: func(c *cli.Context) error {
			ck, err := model.LoadCheckpoint(c.Path("checkpoint"))
			if err != nil {
				return err
			}
			// The tokenizer's files, where transformers has a tokenizer of
			// that name (gpt2: vocab.json and merges.txt).
			var extra map[string][]byte
			if ck.Tokenizer() == "gpt2" {
				g, err := data.NewGPT2Tokenizer()
				if err != nil {
					return err
				}
				if extra, err = g.HuggingFaceFiles(); err != nil {
					return err
				}
			}
			if err := model.ExportHF(c.Path("out"), ck, extra); err != nil {
				return err
			}
			fmt.Printf("exported the %s model (%d parameters, %s tokenizer) to %s\n", ck.Config.Name, ck.Config.NumParams(), ck.Tokenizer(), c.Path("out"))
			return nil
		},
	}
}

func importCommand() *cli.Command {
	return &cli.Command{
		Name:      "import",
		Usage:     "read a Hugging Face GPT-2 model directory into a checkpoint",
		ArgsUsage: " ",
		Description: "Reads --hf/config.json and --hf/model.safetensors (F32) of a GPT-2 whose layers Skein\n" +
			"computes the same way (gelu_new, layer norm epsilon 1e-5) and writes a checkpoint of the\n" +
			"whole model, without optimizer state, that eval, sample and export take.",
		Flags: []cli.Flag{
			&cli.PathFlag{Name: "hf", Required: true, Usage: "the Hugging Face model directory"},
			&cli.PathFlag{Name: "out", Required: true, Usage: "the checkpoint to write"},
		},
		Action: func(c *cli.Context) error {
			ck, err := model.ImportHF(c.Path("hf"))
			if err != nil {
				return err
			}
			if err := model.SaveCheckpoint(c.Path("out"), ck); err != nil {
				return err
			}
			fmt.Printf("imported the %s model (%d parameters) to %s\n", ck.Config.Name, ck.Config.NumParams(), c.Path("out"))
			return nil
		},
	}
}
