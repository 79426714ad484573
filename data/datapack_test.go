package data

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/parquet-go/parquet-go"
)

// packTexts writes docs as text files in a new directory and returns it.
func packTexts(t *testing.T, docs []string) string {
	t.Helper()
	dir := t.TempDir()
	for i, d := range docs {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("doc%03d.txt", i)), []byte(d), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// readAll returns split sp of a packed dataset as one token slice.
func readAll(t *testing.T, s *PackedSource, sp Split) []int32 {
	t.Helper()
	out := make([]int32, s.Tokens(sp))
	if err := s.ReadTokens(sp, out, 0); err != nil {
		t.Fatal(err)
	}
	return out
}

// A packed dataset is its documents' tokens, each after <|endoftext|>, in
// input order, cut into shards and chunks that verify; the same inputs give
// the same shards whatever the worker count; the validation split is
// chosen by each document's bytes.
func TestPackDatasetText(t *testing.T) {
	var docs []string
	for i := range 300 {
		docs = append(docs, fmt.Sprintf("Document %d: the quick brown fox jumps over %d lazy dogs. ", i, i*7)+strings.Repeat("é", i%5))
	}
	in := packTexts(t, docs)
	g := gpt2(t)
	var names [][]string
	for _, workers := range []int{1, 3} {
		out := t.TempDir()
		var calls int
		sum, err := PackDataset(context.Background(), out, []string{in}, PackConfig{Tokenizer: g, ShardTokens: 1000, ChunkTokens: 64,
			ValFraction: 0.1, Workers: workers, Progress: func(done, total, tokens int64) { calls++ }})
		if err != nil {
			t.Fatal(err)
		}
		if calls == 0 {
			t.Error("no progress")
		}
		src, err := OpenPackedDir(out)
		if err != nil {
			t.Fatal(err)
		}
		// Expected streams.
		var want [2][]int32
		var docsIn [2]int64
		for _, d := range docs {
			sp := Train
			h := fnvSplit([]byte(d))
			if h < 0.1 {
				sp = Validation
			}
			docsIn[sp]++
			want[sp] = append(append(want[sp], GPT2EndOfText), g.Encode([]byte(d))...)
		}
		for _, sp := range []Split{Train, Validation} {
			if got := readAll(t, src, sp); !slices.Equal(got, want[sp]) {
				t.Fatalf("workers %d, %v split: %d tokens, want %d", workers, sp, len(got), len(want[sp]))
			}
			if sum.Documents[sp] != docsIn[sp] || sum.Tokens[sp] != int64(len(want[sp])) {
				t.Errorf("%v: summary %d documents %d tokens, want %d %d", sp, sum.Documents[sp], sum.Tokens[sp], docsIn[sp], len(want[sp]))
			}
		}
		if docsIn[Validation] == 0 || docsIn[Validation] > 60 {
			t.Errorf("%d of 300 documents held out at 10%%", docsIn[Validation])
		}
		var ns []string
		var docCount int64
		for _, sh := range append(sum.Dataset.Train, sum.Dataset.Validation...) {
			ns = append(ns, sh.Name)
			docCount += sh.Documents
			if sh.Tokens > 1000 {
				t.Errorf("shard of %d tokens, target 1000", sh.Tokens)
			}
		}
		if docCount != 300 || sum.Dataset.Documents != 300 {
			t.Errorf("shards count %d documents, dataset %d, want 300", docCount, sum.Dataset.Documents)
		}
		names = append(names, ns)
	}
	if !slices.Equal(names[0], names[1]) {
		t.Fatal("the shards depend on the worker count")
	}
}

// fnvSplit is the packer's split rule, written again.
func fnvSplit(b []byte) float64 {
	var h uint64 = 14695981039346656037
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return float64(h>>11) / float64(1<<53)
}

// JSONL and llm.c inputs; bad records stop the pack naming file and line,
// or are skipped and counted.
func TestPackDatasetFormats(t *testing.T) {
	g := gpt2(t)
	dir := t.TempDir()
	jl := filepath.Join(dir, "a.jsonl")
	os.WriteFile(jl, []byte(`{"text":"first doc"}`+"\n\n"+`{"content":"x","text":"second"}`+"\n"+`{"text":"third"}`), 0o644)
	// An llm.c file: two documents.
	toks := append(append([]int32{GPT2EndOfText}, g.Encode([]byte("llm one"))...), append([]int32{GPT2EndOfText}, g.Encode([]byte("llm two"))...)...)
	bin := filepath.Join(dir, "b.bin")
	hdr := make([]byte, llmcHeader)
	binary.LittleEndian.PutUint32(hdr[0:], llmcMagic)
	binary.LittleEndian.PutUint32(hdr[4:], llmcVersion)
	binary.LittleEndian.PutUint32(hdr[8:], uint32(len(toks)))
	for _, x := range toks {
		hdr = binary.LittleEndian.AppendUint16(hdr, uint16(x))
	}
	os.WriteFile(bin, hdr, 0o644)
	out := t.TempDir()
	sum, err := PackDataset(context.Background(), out, []string{jl, bin}, PackConfig{Tokenizer: g, NoValidation: true})
	if err != nil {
		t.Fatal(err)
	}
	src, err := OpenPackedDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var want []int32
	for _, d := range []string{"first doc", "second", "third"} {
		want = append(append(want, GPT2EndOfText), g.Encode([]byte(d))...)
	}
	want = append(want, toks...)
	if got := readAll(t, src, Train); !slices.Equal(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	if sum.Documents[Train] != 5 {
		t.Errorf("%d documents, want 5", sum.Documents[Train])
	}

	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte(`{"text":"ok"}`+"\n"+`{"text":7}`+"\n"+`not json`+"\n"+`{"text":"ok2"}`+"\n"), 0o644)
	_, err = PackDataset(context.Background(), t.TempDir(), []string{bad}, PackConfig{Tokenizer: g})
	if !errors.Is(err, ErrDataFormat) || !strings.Contains(err.Error(), "bad.jsonl line 2") {
		t.Fatalf("bad record: %v", err)
	}
	sum, err = PackDataset(context.Background(), t.TempDir(), []string{bad}, PackConfig{Tokenizer: g, SkipBad: true, NoValidation: true})
	if err != nil || sum.Skipped != 2 || sum.Documents[Train] != 2 {
		t.Fatalf("skip-bad: %+v, %v", sum, err)
	}
	// Invalid UTF-8 for a BPE tokenizer is a bad record naming the offset;
	// the byte tokenizer takes any bytes.
	inv := filepath.Join(dir, "inv.txt")
	os.WriteFile(inv, []byte("abc\xffdef"), 0o644)
	if _, err := PackDataset(context.Background(), t.TempDir(), []string{inv}, PackConfig{Tokenizer: g}); !errors.Is(err, ErrBadRecord) || !strings.Contains(err.Error(), "byte offset 3") {
		t.Fatalf("invalid UTF-8: %v", err)
	}
	if _, err := PackDataset(context.Background(), t.TempDir(), []string{inv}, PackConfig{Tokenizer: ByteTokenizer{}, NoValidation: true}); err != nil {
		t.Fatalf("byte tokenizer: %v", err)
	}
	// llm.c tokens need gpt2; a broken llm.c header is refused.
	if _, err := PackDataset(context.Background(), t.TempDir(), []string{bin}, PackConfig{Tokenizer: ByteTokenizer{}}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("llm.c with byte: %v", err)
	}
	os.WriteFile(bin, hdr[:len(hdr)-2], 0o644)
	if _, err := PackDataset(context.Background(), t.TempDir(), []string{bin}, PackConfig{Tokenizer: g}); !errors.Is(err, ErrDataFormat) {
		t.Fatalf("truncated llm.c: %v", err)
	}
	// Unknown formats and missing inputs.
	if _, err := PackDataset(context.Background(), t.TempDir(), []string{jl}, PackConfig{Tokenizer: g, Format: "csv"}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("csv: %v", err)
	}
	if _, err := PackDataset(context.Background(), t.TempDir(), []string{filepath.Join(dir, "nope")}, PackConfig{Tokenizer: g}); err == nil {
		t.Fatal("missing input packed")
	}
}

// A volunteer's cache fetches only the chunks it reads, checks each, and
// never uses bytes that do not match the shard's header.
func TestPackedCacheFetchesOnlyWhatItReads(t *testing.T) {
	var docs []string
	for i := range 200 {
		docs = append(docs, strings.Repeat(fmt.Sprintf("word%d ", i), 20))
	}
	out := t.TempDir()
	if _, err := PackDataset(context.Background(), out, []string{packTexts(t, docs)}, PackConfig{Tokenizer: ByteTokenizer{}, ShardTokens: 4096, ChunkTokens: 256, NoValidation: true}); err != nil {
		t.Fatal(err)
	}
	ds, err := ReadDataset(out)
	if err != nil {
		t.Fatal(err)
	}
	local, err := OpenPackedDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var served int64
	corrupt := false
	fetch := func(_ context.Context, name string, off, n int64, _ func([]byte) error) ([]byte, error) {
		r, size, err := local.ReaderAt(name)
		if err != nil {
			return nil, err
		}
		if off+n > size {
			return nil, fmt.Errorf("range past the end")
		}
		b := make([]byte, n)
		if _, err := r.ReadAt(b, off); err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		served += n
		if corrupt && off > 1000 {
			b[0] ^= 1
		}
		return b, nil
	}
	cache := t.TempDir()
	src, err := OpenPackedCache(context.Background(), ds, cache, fetch)
	if err != nil {
		t.Fatal(err)
	}
	all := readAll(t, local, Train)
	got := make([]int32, 100)
	if err := src.ReadTokens(Train, got, 5000); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, all[5000:5100]) {
		t.Fatal("cached read differs")
	}
	if served > 2*256+2*(72+32*16)+200 {
		t.Errorf("fetched %d bytes for 100 tokens", served)
	}
	// A fresh source over the same cache reads from disk.
	src2, _ := OpenPackedCache(context.Background(), ds, cache, fetch)
	before := served
	if err := src2.ReadTokens(Train, got, 5000); err != nil || served != before {
		t.Fatalf("re-read fetched %d bytes (%v)", served-before, err)
	}
	// The cache serves what it has and refuses what it has not.
	r, _, err := src2.ReaderAt(ds.Train[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadAt(make([]byte, 10), 100); err != nil && !errors.Is(err, ErrShardMissing) {
		t.Fatal(err)
	}
	// Corrupt bytes are never used.
	corrupt = true
	src3, _ := OpenPackedCache(context.Background(), ds, t.TempDir(), fetch)
	if err := src3.ReadTokens(Train, got, 9000); !errors.Is(err, ErrShardCorrupt) {
		t.Fatalf("corrupt chunk: %v", err)
	}
}

// The token shard header's decoder is bounded and never panics; a header
// that decodes re-encodes to the same bytes.
func FuzzTokenShardHeader(f *testing.F) {
	h := TokenShardHeader{Width: 2, Vocab: 50257, Tokens: 1000, Documents: 3, ChunkTokens: 256, Chunks: make([][32]byte, 4)}
	f.Add(h.Marshal())
	f.Add(h.Marshal()[:80])
	f.Add([]byte(TokenShardMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseTokenShardHeader(b)
		if err != nil {
			if !errors.Is(err, ErrShardFormat) {
				t.Fatalf("error not wrapping ErrShardFormat: %v", err)
			}
			return
		}
		if got := p.Marshal(); !bytes.Equal(got, b[:len(got)]) {
			t.Fatal("re-encoding differs")
		}
		_, _ = ReadTokenShardHeader(bytes.NewReader(b), int64(len(b)), "")
	})
}

// dataset.json's decoder is bounded and never panics.
func FuzzDatasetIndex(f *testing.F) {
	f.Add([]byte(`{"format":"skein-dataset-1","tokenizer":"byte","tokenizer_hash":"x","vocab":256,"train":[]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if _, err := ParseDataset(b); err != nil && !errors.Is(err, ErrDataFormat) && !errors.Is(err, ErrShardFormat) && !errors.Is(err, ErrUnknownTokenizer) {
			t.Fatalf("unexpected error kind: %v", err)
		}
	})
}

func TestTokenShardChecks(t *testing.T) {
	body := []byte{1, 0, 2, 0, 255, 0}
	h := TokenShardHeader{Width: 2, Vocab: 256, Tokens: 3, ChunkTokens: 2}
	h.Chunks = [][32]byte{sha256.Sum256(body[:4]), sha256.Sum256(body[4:])}
	if err := h.CheckChunk(1, body[4:]); err != nil {
		t.Fatal(err)
	}
	h.Vocab = 255
	h.Chunks[1] = sha256.Sum256(body[4:])
	if err := h.CheckChunk(1, body[4:]); !errors.Is(err, ErrShardFormat) {
		t.Fatalf("out-of-vocabulary token: %v", err)
	}
	if err := h.CheckChunk(0, body[:3]); !errors.Is(err, ErrShardCorrupt) {
		t.Fatalf("short chunk: %v", err)
	}
	b := h.Marshal()
	b[9] = 1
	if _, err := ParseTokenShardHeader(b); !errors.Is(err, ErrShardFormat) {
		t.Fatalf("reserved byte: %v", err)
	}
	sum := sha256.Sum256(h.Marshal())
	if h.Name() != hex.EncodeToString(sum[:]) {
		t.Fatal("name is not the header's hash")
	}
	if n, ok := ParseTokenKey(TokenKey(h.Name())); !ok || n != h.Name() {
		t.Fatal("token key round trip")
	}
	if _, ok := ParseTokenKey("tokens/../x"); ok {
		t.Fatal("bad key parsed")
	}
}

// A Parquet input packs its rows in order; a null row stops the pack naming
// file and row, or is skipped and counted.
func TestPackDatasetParquet(t *testing.T) {
	g := gpt2(t)
	texts := []string{"row one", "row two", "", "row four"}
	ptrs := pqPointers(texts)
	ptrs[2] = nil // a null
	dir := t.TempDir()
	path := filepath.Join(dir, "docs.parquet")
	if err := os.WriteFile(path, pqWrite(t, pqCase{enc: &parquet.Plain, codec: &parquet.Snappy, version: 2, optional: true}, ptrs), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := PackDataset(context.Background(), t.TempDir(), []string{path}, PackConfig{Tokenizer: g}); !errors.Is(err, ErrDataFormat) || !strings.Contains(err.Error(), "docs.parquet row 3") {
		t.Fatalf("null row: %v", err)
	}
	out := t.TempDir()
	sum, err := PackDataset(context.Background(), out, []string{path}, PackConfig{Tokenizer: g, SkipBad: true, NoValidation: true})
	if err != nil || sum.Skipped != 1 || sum.Documents[Train] != 3 {
		t.Fatalf("skip-bad: %+v %v", sum, err)
	}
	src, err := OpenPackedDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var want []int32
	for _, d := range []string{"row one", "row two", "row four"} {
		want = append(append(want, GPT2EndOfText), g.Encode([]byte(d))...)
	}
	if got := readAll(t, src, Train); !slices.Equal(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
}
