package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/skein-ml/skein/data"
)

func dataCommand() *cli.Command {
	return &cli.Command{
		Name:  "data",
		Usage: "prepare datasets for runs",
		Subcommands: []*cli.Command{
			dataPackCommand(),
			dataInfoCommand(),
		},
	}
}

func dataPackCommand() *cli.Command {
	return &cli.Command{
		Name:      "pack",
		Usage:     "tokenize documents once into content-addressed token shards that a run serves",
		ArgsUsage: "INPUT...",
		Description: "Reads every INPUT (files, and directories: their visible files in path order), runs each document\n" +
			"through the tokenizer and writes the tokens as shards of about --shard-tokens tokens into --out,\n" +
			"with an index, dataset.json, that `skein bootstrap --dataset DIR` serves and `skein train --dataset DIR`\n" +
			"reads. A shard is named by the SHA-256 of its header, which lists the SHA-256 of each chunk of\n" +
			"--chunk-tokens tokens, so a volunteer fetches and checks only the chunks it trains on.\n\n" +
			"Formats, by extension unless --format names one for every input: .jsonl (one JSON object per line,\n" +
			"the document in --field), .parquet (the string column --field), .bin (llm.c's tokenized GPT-2 files,\n" +
			"taken as they are; --tokenizer gpt2), anything else text (a file is one document). With gpt2,\n" +
			"<|endoftext|> precedes every document, as in llm.c. Documents go to the validation split by a hash of\n" +
			"their bytes (--val-fraction), so the split does not depend on file names and duplicates never\n" +
			"straddle it. A bad record (a JSONL line that is not an object with a string --field, a null Parquet\n" +
			"value, text that is not UTF-8 for gpt2) stops the pack with an error naming file and line or row;\n" +
			"--skip-bad counts and skips them instead. Packing is deterministic: the same inputs and flags give\n" +
			"the same shards on every machine.\n\n" +
			"  skein data pack --tokenizer gpt2 --out /data/owt owt/*.jsonl",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "tokenizer", Value: "gpt2", Usage: "tokenizer: " + strings.Join(data.TokenizerNames(), ", ")},
			&cli.StringFlag{Name: "out", Required: true, Usage: "directory to write the shards and dataset.json into (created if needed)"},
			&cli.StringFlag{Name: "format", Usage: "read every input as this format (" + strings.Join(data.PackFormats(), ", ") + "); default: by extension"},
			&cli.StringFlag{Name: "field", Value: data.JSONLField, Usage: "the JSONL key or Parquet column holding the text"},
			&cli.BoolFlag{Name: "skip-bad", Usage: "skip bad records (counted in the summary) instead of stopping"},
			&cli.Float64Flag{Name: "val-fraction", Value: 0.01, Usage: "share of documents held out for validation (0 for none)"},
			&cli.Int64Flag{Name: "shard-tokens", Value: data.DefaultShardTokens, Usage: "tokens per shard"},
			&cli.IntFlag{Name: "chunk-tokens", Value: data.DefaultChunkTokens, Usage: "tokens per chunk (the unit a volunteer fetches and checks)"},
			&cli.IntFlag{Name: "workers", Usage: "tokenizing goroutines (default: one per CPU)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return fmt.Errorf("nothing to pack: name at least one INPUT file or directory")
			}
			tok, err := data.NewTokenizer(c.String("tokenizer"))
			if err != nil {
				return fmt.Errorf("--tokenizer: %w", err)
			}
			cfg := data.PackConfig{Tokenizer: tok, Format: c.String("format"), Field: c.String("field"), SkipBad: c.Bool("skip-bad"),
				ValFraction: c.Float64("val-fraction"), NoValidation: c.Float64("val-fraction") == 0,
				ShardTokens: c.Int64("shard-tokens"), ChunkTokens: c.Int("chunk-tokens"), Workers: c.Int("workers")}
			errw := c.App.ErrWriter
			start := time.Now()
			cfg.Progress = func(done, total, tokens int64) {
				el := time.Since(start).Seconds()
				fmt.Fprintf(errw, "\rpacking: %.1f of %.1f MB (%3.0f%%), %d tokens, %.1f MB/s   ",
					float64(done)/1e6, float64(total)/1e6, 100*float64(done)/float64(max(total, 1)), tokens, float64(done)/1e6/max(el, 1e-3))
			}
			sum, err := data.PackDataset(c.Context, c.String("out"), c.Args().Slice(), cfg)
			fmt.Fprintln(errw)
			if err != nil {
				return err
			}
			d := sum.Dataset
			el := sum.Elapsed.Seconds()
			fmt.Fprintf(c.App.Writer, "packed %d inputs (%.1f MB) with %s in %.1f s (%.1f MB/s, %.2f M tokens/s)\n",
				sum.Inputs, float64(sum.Bytes)/1e6, d.Tokenizer, el, float64(sum.Bytes)/1e6/max(el, 1e-3),
				float64(d.Tokens)/1e6/max(el, 1e-3))
			fmt.Fprintf(c.App.Writer, "train:      %d documents, %d tokens, %d shards\n", sum.Documents[data.Train], sum.Tokens[data.Train], len(d.Train))
			fmt.Fprintf(c.App.Writer, "validation: %d documents, %d tokens, %d shards\n", sum.Documents[data.Validation], sum.Tokens[data.Validation], len(d.Validation))
			if sum.Skipped > 0 {
				fmt.Fprintf(c.App.Writer, "skipped:    %d bad records\n", sum.Skipped)
			}
			fmt.Fprintf(c.App.Writer, "wrote %s/%s\n", strings.TrimRight(c.String("out"), string(os.PathSeparator)), data.DatasetIndexName)
			return nil
		},
	}
}

func dataInfoCommand() *cli.Command {
	return &cli.Command{
		Name:      "info",
		Usage:     "check a packed dataset and print its summary",
		ArgsUsage: "DIR",
		Description: "Reads DIR/dataset.json, checks every shard's header against its name, and with --verify every\n" +
			"chunk against its header, then prints the tokenizer, the splits and their sizes.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "verify", Usage: "hash every chunk of every shard (reads the whole dataset)"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("want one argument, the dataset directory (got %d)", c.NArg())
			}
			src, err := data.OpenPackedDir(c.Args().First())
			if err != nil {
				return err
			}
			d := src.Dataset()
			fmt.Fprintf(c.App.Writer, "tokenizer  %s (vocabulary %d, hash %.16s)\n", d.Tokenizer, d.Vocab, d.TokenizerHash)
			for _, sp := range []data.Split{data.Train, data.Validation} {
				var docs int64
				for _, sh := range d.Shards(sp) {
					docs += sh.Documents
				}
				fmt.Fprintf(c.App.Writer, "%-10s %d documents, %d tokens, %d shards\n", sp, docs, d.SplitTokens(sp), len(d.Shards(sp)))
			}
			if c.Bool("verify") {
				if err := src.Verify(c.Context); err != nil {
					return err
				}
				fmt.Fprintln(c.App.Writer, "every chunk verified")
			}
			return nil
		},
	}
}
