package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/skein-ml/skein/data"
)

// runTokenize runs `skein tokenize args...` on stdin and returns its stdout.
func runTokenize(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	app := newApp()
	var out bytes.Buffer
	app.Reader, app.Writer, app.ErrWriter = strings.NewReader(stdin), &out, io.Discard
	err := app.Run(append([]string{"skein", "tokenize"}, args...))
	return out.String(), err
}

func TestTokenizeCommand(t *testing.T) {
	file := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(file, []byte("hello world\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, stdin string
		args        []string
		want        string
	}{
		{"default byte, trailing newline", "hi\n", nil, "[104,105,10]\n"},
		{"gpt2 stdin", "hello world", []string{"--tokenizer", "gpt2"}, "[31373,995]\n"},
		{"gpt2 stdin dash", "hello world", []string{"--tokenizer", "gpt2", "-"}, "[31373,995]\n"},
		{"gpt2 file", "ignored", []string{"--tokenizer", "gpt2", file}, "[31373,995,198]\n"},
		{"empty", "", []string{"--tokenizer", "gpt2"}, "[]\n"},
		{"special is text", "hello <|endoftext|>", []string{"--tokenizer", "gpt2"}, "[31373,1279,91,437,1659,5239,91,29]\n"},
		{"allow special", "hello <|endoftext|>", []string{"--tokenizer", "gpt2", "--allow-special"}, "[31373,220,50256]\n"},
	} {
		got, err := runTokenize(t, tt.stdin, tt.args...)
		if err != nil || got != tt.want {
			t.Errorf("%s: got %q, %v; want %q", tt.name, got, err, tt.want)
		}
	}
}

// The output is JSON whose ids decode to the input, every byte of it.
func TestTokenizeCommandRoundTrip(t *testing.T) {
	text := "package main\n\n// Don't panic.\nfunc main() {\n\tprintln(\"héllo, 世界 🙂\")  \n}\n\n"
	for _, name := range data.TokenizerNames() {
		out, err := runTokenize(t, text, "--tokenizer", name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "]\n") {
			t.Errorf("%s: output %q is not one line", name, out)
		}
		var ids []int32
		if err := json.Unmarshal([]byte(out), &ids); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		tok, _ := data.NewTokenizer(name)
		if got := tok.Decode(ids); string(got) != text {
			t.Errorf("%s: ids decode to %q", name, got)
		}
		if want := tok.Encode([]byte(text)); !slices.Equal(ids, want) {
			t.Errorf("%s: ids %v, Encode gives %v", name, ids, want)
		}
	}
}

func TestTokenizeCommandErrors(t *testing.T) {
	for _, tt := range []struct {
		name, stdin string
		args        []string
		want        string // in the error
		is          error
	}{
		{"invalid UTF-8", "h\xc3\xa9llo\x80 world", []string{"--tokenizer", "gpt2"}, "standard input: invalid UTF-8 at byte offset 6 (0x80)", data.ErrInvalidUTF8},
		{"invalid UTF-8, byte", "\xff", nil, "byte offset 0", data.ErrInvalidUTF8},
		{"unknown tokenizer", "x", []string{"--tokenizer", "gpt3"}, `"gpt3" (known: byte, gpt2)`, data.ErrUnknownTokenizer},
		{"special without specials", "x", []string{"--allow-special"}, "--allow-special: tokenizer byte has no special tokens", nil},
		{"two files", "x", []string{"a", "b"}, "at most one argument", nil},
		{"missing file", "x", []string{filepath.Join(t.TempDir(), "nope")}, "no such file", nil},
	} {
		out, err := runTokenize(t, tt.stdin, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) || tt.is != nil && !errors.Is(err, tt.is) {
			t.Errorf("%s: error %v, want one with %q", tt.name, err, tt.want)
		}
		if out != "" {
			t.Errorf("%s: printed %q", tt.name, out)
		}
	}
}
