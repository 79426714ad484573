package data

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A tokenized corpus is its files' tokens in stream order, each document
// after <|endoftext|> with gpt2, and a Loader draws its windows like the
// byte corpus's: with the byte tokenizer, exactly the same batches.
func TestTokenizedCorpus(t *testing.T) {
	dir := t.TempDir()
	for i, text := range []string{"hello world\n", "package main\n\nfunc main() {}\n", "the quick brown fox"} {
		os.WriteFile(filepath.Join(dir, "f"+string(rune('a'+i))+".txt"), []byte(text), 0o644)
	}
	c, err := Open(CorpusConfig{Paths: []string{dir}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g, err := NewGPT2Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	tc, err := Tokenize(context.Background(), c, g, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want []int32
	for _, f := range c.Files(Train) {
		b, _ := os.ReadFile(f.Path)
		want = append(append(want, GPT2EndOfText), g.Encode(b)...)
	}
	got := make([]int32, tc.Tokens(Train))
	if err := tc.ReadTokens(Train, got, 0); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) || tc.Documents(Train) != len(c.Files(Train)) || tc.Name() != "gpt2" {
		t.Fatalf("%v\nwant %v (%d documents, %q)", got, want, tc.Documents(Train), tc.Name())
	}
	if err := tc.ReadTokens(Train, make([]int32, 2), tc.Tokens(Train)-1); err == nil {
		t.Fatal("read past the end")
	}

	// Byte tokenizer: the same batches as the byte corpus.
	bc, err := Tokenize(context.Background(), c, ByteTokenizer{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := LoaderConfig{Seed: 3, Workers: 2, Worker: 1, B: 2, T: 5}
	l1, err := NewLoader(c, Train, cfg)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := NewTokenLoader(bc, Train, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for step := range 6 {
		a, at := make([]int32, 10), make([]int32, 10)
		b, bt := make([]int32, 10), make([]int32, 10)
		if err := l1.Batch(step, a, at); err != nil {
			t.Fatal(err)
		}
		if err := l2.Batch(step, b, bt); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) || !slices.Equal(at, bt) {
			t.Fatalf("step %d: %v/%v vs %v/%v", step, a, at, b, bt)
		}
	}
}
