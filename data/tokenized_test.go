package data

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// JSONL records and llm.c token files are documents too; a bad record or
// header is an error naming the file (and line).
func TestTokenizedFormats(t *testing.T) {
	g, err := NewGPT2Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) { os.WriteFile(filepath.Join(dir, name), b, 0o644) }
	write("a.jsonl", []byte(`{"text": "hello world", "id": 1}`+"\n\n"+`{"text": "second doc"}`+"\n"))
	llmc := make([]byte, llmcHeader+6)
	binary.LittleEndian.PutUint32(llmc[0:], llmcMagic)
	binary.LittleEndian.PutUint32(llmc[4:], llmcVersion)
	binary.LittleEndian.PutUint32(llmc[8:], 3)
	for i, id := range []uint16{50256, 31373, 995} {
		binary.LittleEndian.PutUint16(llmc[llmcHeader+2*i:], id)
	}
	write("b.bin", llmc)
	c, err := Open(CorpusConfig{Paths: []string{dir}, ValFraction: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc, err := Tokenize(context.Background(), c, g, nil)
	if err != nil {
		t.Fatal(err)
	}
	var all []int32
	for _, s := range []Split{Train, Validation} {
		got := make([]int32, tc.Tokens(s))
		tc.ReadTokens(s, got, 0)
		all = append(all, got...)
	}
	want := []int32{50256, 31373, 995, 50256, 12227, 2205, 50256, 31373, 995} // a.jsonl's two records, then b.bin as is
	if !slices.Equal(slices.Sorted(slices.Values(all)), slices.Sorted(slices.Values(want))) || tc.Documents(Train)+tc.Documents(Validation) != 3 {
		t.Fatalf("tokens %v (%d+%d documents), want %v", all, tc.Documents(Train), tc.Documents(Validation), want)
	}

	for name, b := range map[string][]byte{
		"bad.jsonl": []byte(`{"text": "ok"}` + "\n" + `{"body": "no text"}` + "\n"),
		"bad.bin":   llmc[:llmcHeader+4],
	} {
		d := t.TempDir()
		os.WriteFile(filepath.Join(d, name), b, 0o644)
		os.WriteFile(filepath.Join(d, "ok.txt"), []byte("fine"), 0o644)
		c, err := Open(CorpusConfig{Paths: []string{d}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = Tokenize(context.Background(), c, g, nil)
		c.Close()
		if !errors.Is(err, ErrDataFormat) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := jsonlDocuments("x.jsonl", []byte("{\"text\": 1}\n"), func([]byte) {}); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("a number as text: %v", err)
	}
}

func FuzzDatasetFormats(f *testing.F) {
	f.Add([]byte(`{"text": "a"}` + "\n"))
	f.Add(make([]byte, llmcHeader+2))
	f.Fuzz(func(t *testing.T, b []byte) {
		jsonlDocuments("f.jsonl", b, func([]byte) {})
		if raw, n, err := llmcTokens("f.bin", b); err == nil && len(raw) != 2*n {
			t.Fatalf("%d bytes for %d tokens", len(raw), n)
		}
	})
}
