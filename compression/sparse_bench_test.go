package compression

import (
	"fmt"
	"testing"
)

// BenchmarkSparseRound is one member's share of a butterfly round of the
// sparse codec at GPT-2 small's size (124M parameters) with a group of M =
// 8: error feedback, top-k selection and encoding of its whole
// pseudo-gradient (cut into M part messages), then, as the owner of one
// part, decoding the M contributions to it and summing them. Run it with
// GOMAXPROCS=1 (the goal is one core under 1 s). It reports the messages'
// bits per parameter.
func BenchmarkSparseRound(b *testing.B) {
	const n, members = 124_439_808, 8
	part := n / members
	delta := randTensor(n, 1)
	enc, _ := NewSparseEncoder(DefaultSparseConfig())
	dec, _ := NewSparseDecoder()
	fb := make([]*SparseFeedback, members)
	for p := range fb {
		fb[p], _ = NewSparseFeedback(part, 1)
	}
	sum := make([]float32, part)
	msgs := make([][]byte, members)
	b.ResetTimer()
	for b.Loop() {
		bytes := 0
		for p := range members { // this member's M part messages
			var err error
			if msgs[p], err = fb[p].Encode(enc, msgs[p][:0], delta[p*part:(p+1)*part]); err != nil {
				b.Fatal(err)
			}
			bytes += len(msgs[p])
		}
		clear(sum) // the owned part: M contributions (here the same message M times)
		for range members {
			if err := dec.DecodeAdd(msgs[0], sum); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(8*bytes)/n, "bits/param")
	}
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
	b.Run("sparse-decode", func(b *testing.B) {
		enc, _ := NewSparseEncoder(DefaultSparseConfig())
		msg, _ := enc.Append(nil, x, nil)
		dec, _ := NewSparseDecoder()
		sum := make([]float32, n)
		b.SetBytes(4 * n) // of fp32 output, as the projection counts it
		for b.Loop() {
			if err := dec.DecodeAdd(msg, sum); err != nil {
				b.Fatal(err)
			}
		}
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
