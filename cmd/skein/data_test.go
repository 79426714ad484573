package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runSkein runs the CLI in this process and returns its stdout and stderr.
func runSkein(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	app := newApp()
	var out, errw bytes.Buffer
	app.Writer, app.ErrWriter = &out, &errw
	err := app.Run(append([]string{"skein"}, args...))
	return out.String(), errw.String(), err
}

func TestDataPackCommand(t *testing.T) {
	in := t.TempDir()
	os.WriteFile(filepath.Join(in, "a.txt"), []byte("hello world\n"), 0o644)
	os.WriteFile(filepath.Join(in, "b.jsonl"), []byte(`{"text":"one"}`+"\n"+`{"text":"two"}`+"\n"), 0o644)
	out := filepath.Join(t.TempDir(), "ds")
	stdout, stderr, err := runSkein(t, "data", "pack", "--tokenizer", "gpt2", "--val-fraction", "0", "--out", out, in)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{"packed 2 inputs", "train:      3 documents", "validation: 0 documents", "dataset.json"} {
		if !strings.Contains(stdout, want) {
			t.Fatalf("summary lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "packing:") {
		t.Errorf("no progress on stderr: %q", stderr)
	}
	stdout, _, err = runSkein(t, "data", "info", "--verify", out)
	if err != nil || !strings.Contains(stdout, "tokenizer  gpt2") || !strings.Contains(stdout, "every chunk verified") {
		t.Fatalf("info: %v\n%s", err, stdout)
	}
	// A bad record names its file and line; --skip-bad counts it.
	os.WriteFile(filepath.Join(in, "c.jsonl"), []byte(`{"text":"ok"}`+"\n"+`{"txt":"no"}`+"\n"), 0o644)
	if _, _, err := runSkein(t, "data", "pack", "--out", out, in); err == nil || !strings.Contains(err.Error(), "c.jsonl line 2") {
		t.Fatalf("bad record: %v", err)
	}
	stdout, _, err = runSkein(t, "data", "pack", "--skip-bad", "--out", out, in)
	if err != nil || !strings.Contains(stdout, "skipped:    1 bad records") {
		t.Fatalf("--skip-bad: %v\n%s", err, stdout)
	}
	if _, _, err := runSkein(t, "data", "pack", "--out", out); err == nil {
		t.Fatal("packed nothing without an error")
	}
	// skein train takes the dataset.
	if _, _, err := runSkein(t, "train", "--dataset", out, "--corpus", in, "--steps", "1"); err == nil || !strings.Contains(err.Error(), "one or the other") {
		t.Fatalf("--dataset with --corpus: %v", err)
	}
}
