package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/skein-ml/skein/data"
)

func tokenizeCommand() *cli.Command {
	return &cli.Command{
		Name:      "tokenize",
		Usage:     "print the token ids of a text file",
		ArgsUsage: "[FILE]",
		Description: "Encodes FILE (standard input when FILE is absent or -) with a tokenizer and prints the ids as one\n" +
			"JSON array on one line. Every byte is encoded, a final newline too. The input must be valid UTF-8;\n" +
			"otherwise nothing is printed and the error names the offset of the first invalid byte.\n\n" +
			"Tokenizers: byte (one id per byte, vocabulary 256; what training reads today) and gpt2 (OpenAI's\n" +
			"GPT-2 BPE, vocabulary 50257, the ids of tiktoken's \"gpt2\" encoding). <|endoftext|> in the text is\n" +
			"ordinary text unless --allow-special makes it the special token (50256 for gpt2).\n\n" +
			"  echo 'hello world' | skein tokenize --tokenizer gpt2      # [31373,995,198]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "tokenizer", Value: "byte", Usage: "tokenizer: " + strings.Join(data.TokenizerNames(), ", ")},
			&cli.BoolFlag{Name: "allow-special", Usage: "encode <|endoftext|> in the text as the special token, not as text"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 1 {
				return fmt.Errorf("want at most one argument, the file (got %d)", c.NArg())
			}
			tok, err := data.NewTokenizer(c.String("tokenizer"))
			if err != nil {
				return fmt.Errorf("--tokenizer: %w", err)
			}
			encode := tok.Encode
			if c.Bool("allow-special") {
				se, ok := tok.(data.SpecialEncoder)
				if !ok {
					return fmt.Errorf("--allow-special: tokenizer %s has no special tokens", c.String("tokenizer"))
				}
				encode = se.EncodeSpecial
			}
			name, in := "standard input", c.App.Reader
			if arg := c.Args().First(); arg != "" && arg != "-" {
				f, err := os.Open(arg)
				if err != nil {
					return err
				}
				defer f.Close()
				name, in = arg, f
			}
			text, err := io.ReadAll(in)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if err := data.CheckUTF8(text); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return writeIDs(c.App.Writer, encode(text))
		},
	}
}

// writeIDs writes ids as a JSON array on one line.
func writeIDs(w io.Writer, ids []int32) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	buf := make([]byte, 0, 16)
	bw.WriteByte('[')
	for i, id := range ids {
		buf = buf[:0]
		if i > 0 {
			buf = append(buf, ',')
		}
		bw.Write(strconv.AppendInt(buf, int64(id), 10))
	}
	bw.WriteString("]\n")
	return bw.Flush()
}
