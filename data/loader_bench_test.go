package data

import (
	"fmt"
	"testing"
)

func BenchmarkBatch(b *testing.B) {
	dir := writeCorpus(b, randomFiles(256, 64<<10, 1)) // about 8 MiB
	c := openCorpus(b, CorpusConfig{Paths: []string{dir}})
	for _, shape := range []struct{ B, T int }{{8, 256}, {16, 1024}} {
		b.Run(fmt.Sprintf("B=%d/T=%d", shape.B, shape.T), func(b *testing.B) {
			benchLoader(b, c, shape.B, shape.T)
		})
	}
}

// BenchmarkBatchDefaultCorpus reads the Go standard library, whose thousands
// of files exceed the open-file cache.
func BenchmarkBatchDefaultCorpus(b *testing.B) {
	c, err := OpenDefault()
	if err != nil {
		b.Skip(err)
	}
	defer c.Close()
	benchLoader(b, c, 16, 1024)
}

func benchLoader(b *testing.B, c *Corpus, B, T int) {
	l, err := NewLoader(c, Train, LoaderConfig{Seed: 1, Workers: 1, B: B, T: T})
	if err != nil {
		b.Fatal(err)
	}
	in, tg := make([]int32, B*T), make([]int32, B*T)
	b.ReportAllocs()
	step := 0
	for b.Loop() {
		if err := l.Batch(step, in, tg); err != nil {
			b.Fatal(err)
		}
		step++
	}
	b.ReportMetric(float64(b.N)*float64(B*T)/b.Elapsed().Seconds(), "tokens/s")
}
