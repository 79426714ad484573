package compression

import (
	"fmt"
	"testing"
)

// BenchmarkSparseRound is one member's round of the sparse codec at GPT-2
// small's size (124M parameters) with a group of M = 8: error feedback,
// top-k selection and encoding of its pseudo-gradient, then decoding the
// M messages of a part's contributors and averaging them. Run it with
// GOMAXPROCS=1 (the goal is one core under 1 s). It reports the message's
// bits per parameter.
func BenchmarkSparseRound(b *testing.B) {
	const n, members = 124_439_808, 8
	delta := randTensor(n, 1)
	enc, _ := NewSparseEncoder(DefaultSparseConfig())
	dec, _ := NewSparseDecoder()
	f, _ := NewSparseFeedback(n, 1)
	mean := make([]float32, n)
	var msg []byte
	b.ResetTimer()
	for b.Loop() {
		var err error
		if msg, err = f.Encode(enc, msg[:0], delta); err != nil {
			b.Fatal(err)
		}
		// The aggregate: the sum of the members' messages (the division
		// by M is folded into the outer step's learning rate).
		clear(mean)
		for range members {
			if err := dec.DecodeAdd(msg, mean); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(8*len(msg))/n, "bits/param")
	b.ReportMetric(float64(len(msg)), "bytes/msg")
}

// BenchmarkSparseVsMinMax8 encodes the same 16M-element tensor with the
// sparse codec and with today's minmax8 (block 256, zstd 1): time and size
// side by side.
func BenchmarkSparseVsMinMax8(b *testing.B) {
	const n = 1 << 24
	x := randTensor(n, 2)
	b.Run("sparse", func(b *testing.B) {
		enc, _ := NewSparseEncoder(DefaultSparseConfig())
		var out []byte
		b.SetBytes(4 * n)
		for b.Loop() {
			out, _ = enc.Append(out[:0], x, nil)
		}
		b.ReportMetric(float64(8*len(out))/n, "bits/param")
	})
	b.Run("minmax8", func(b *testing.B) {
		cfg := DefaultConfig()
		cfg.Codec, cfg.Workers = MinMax8, 1
		enc, err := NewEncoder(cfg)
		if err != nil {
			b.Fatal(fmt.Sprint(err))
		}
		var out []byte
		b.SetBytes(4 * n)
		for b.Loop() {
			out, _ = enc.Append(out[:0], x, 1)
		}
		b.ReportMetric(float64(8*len(out))/n, "bits/param")
	})
}
