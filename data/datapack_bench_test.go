package data

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// benchInputs is the Go sources of net and its subpackages: about 6 MB of
// text in ~700 files.
func benchInputs(b *testing.B) ([]string, [][]byte, int64) {
	root, err := GoRoot()
	if err != nil {
		b.Skip(err)
	}
	dir := filepath.Join(root, "src", "net")
	var docs [][]byte
	var size int64
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Ext(p) == ".go" {
			if t, err := os.ReadFile(p); err == nil && CheckUTF8(t) == nil {
				docs, size = append(docs, t), size+int64(len(t))
			}
		}
		return nil
	})
	return []string{dir}, docs, size
}

// BenchmarkPackDataset packs the inputs with gpt2 (MB/s of input); the
// Encode sub-benchmark is the tokenizer alone on the same documents on
// one goroutine, the reference the packer's overhead is measured against.
func BenchmarkPackDataset(b *testing.B) {
	in, docs, size := benchInputs(b)
	g := gpt2(b)
	b.Run("Encode", func(b *testing.B) {
		b.SetBytes(size)
		for b.Loop() {
			for _, d := range docs {
				g.Encode(d)
			}
		}
	})
	for _, workers := range []int{1, 2} {
		b.Run("pack/workers="+string(rune('0'+workers)), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				out := b.TempDir()
				if _, err := PackDataset(context.Background(), out, in, PackConfig{Tokenizer: g, Format: FormatText, SkipBad: true, Workers: workers}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
