package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
)

// skein export of a model trained with the gpt2 tokenizer writes the
// tokenizer's files beside the weights, and skein import reads the
// directory back to the same weights and tokenizer.
func TestExportGPT2TokenizerFiles(t *testing.T) {
	c := model.Config{Name: "g", Vocab: 50257, PaddedVocab: 50304, MaxT: 8, C: 8, Layers: 1, Heads: 2}
	s, err := model.NewStage(kernels.NewCPU(1), c, model.FullSpec(c), 1, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ckPath := filepath.Join(dir, "ck.safetensors")
	if err := model.SaveCheckpoint(ckPath, s.Snapshot(1, map[string]string{model.MetaTokenizer: "gpt2"})); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "hf")
	if err := newApp().Run([]string{"skein", "export", "--checkpoint", ckPath, "--out", out}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "model.safetensors", "vocab.json", "merges.txt"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	if m, _ := os.ReadFile(filepath.Join(out, "merges.txt")); !bytes.HasPrefix(m, []byte("#version: 0.2\n\u0120 t\n")) {
		t.Errorf("merges.txt starts %q", m[:min(len(m), 30)])
	}
	back := filepath.Join(dir, "back.safetensors")
	if err := newApp().Run([]string{"skein", "import", "--hf", out, "--out", back}); err != nil {
		t.Fatal(err)
	}
	ck, err := model.LoadCheckpoint(back)
	if err != nil {
		t.Fatal(err)
	}
	if ck.Tokenizer() != "gpt2" || ck.SeqLen() != 8 || len(ck.Params) != c.NumParams() {
		t.Fatalf("imported: tokenizer %q, seq len %d, %d parameters", ck.Tokenizer(), ck.SeqLen(), len(ck.Params))
	}
}
