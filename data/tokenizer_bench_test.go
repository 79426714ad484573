package data

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// benchTextBytes is the size of the tokenizer benchmarks' text.
const benchTextBytes = 4 << 20

// tokenizerBenchText returns the text the tokenizer benchmarks encode: the
// file $SKEIN_TOKENIZER_BENCH_TEXT if set, else 4 MiB of prose and code:
// $GOROOT/doc/go_spec.html, go_mem.html and godebug.md, then the .go files of
// $GOROOT/src outside testdata in byte order of their paths. bench/tokenize.sh
// builds the same text with find and sort.
func tokenizerBenchText(b *testing.B) []byte {
	b.Helper()
	if name := os.Getenv("SKEIN_TOKENIZER_BENCH_TEXT"); name != "" {
		p, err := os.ReadFile(name)
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	root, err := GoRoot()
	if err != nil {
		b.Skip(err)
	}
	var text []byte
	for _, name := range []string{"go_spec.html", "go_mem.html", "godebug.md"} {
		p, err := os.ReadFile(filepath.Join(root, "doc", name))
		if err != nil {
			b.Skip(err)
		}
		text = append(text, p...)
	}
	var paths []string
	err = filepath.WalkDir(filepath.Join(root, "src"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			paths = append(paths, path)
		}
		return nil
	})
	if err != nil {
		b.Skip(err)
	}
	slices.Sort(paths)
	for _, path := range paths {
		if len(text) >= benchTextBytes {
			break
		}
		p, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		text = append(text, p...)
	}
	return text[:min(len(text), benchTextBytes)]
}

// BenchmarkGPT2Encode encodes the text again and again: from the second
// time on, the merge cache holds most pieces that need merges.
func BenchmarkGPT2Encode(b *testing.B) {
	benchEncode(b, gpt2(b))
}

// BenchmarkGPT2EncodeCold encodes the text with an empty merge cache each
// time, as a single pass over new text would.
func BenchmarkGPT2EncodeCold(b *testing.B) {
	benchEncode(b, coldGPT2{gpt2(b)})
}

type coldGPT2 struct{ *GPT2Tokenizer }

func (g coldGPT2) Encode(p []byte) []int32 {
	return g.v.appendOrdinary(make([]int32, 0, len(p)/3+8), p, newMergeCache())
}

func BenchmarkByteEncode(b *testing.B) {
	benchEncode(b, ByteTokenizer{})
}

func benchEncode(b *testing.B, tok Tokenizer) {
	text := tokenizerBenchText(b)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	var n int
	for b.Loop() {
		n = len(tok.Encode(text))
	}
	b.ReportMetric(float64(len(text))/float64(n), "bytes/token")
	b.ReportMetric(float64(b.N)*float64(n)/b.Elapsed().Seconds(), "tokens/s")
}

func BenchmarkGPT2Decode(b *testing.B) {
	g := gpt2(b)
	text := tokenizerBenchText(b)
	ids := g.Encode(text)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		g.Decode(ids)
	}
}
