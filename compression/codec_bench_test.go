package compression

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// Benchmarks report GB/s of float32 input per core (Workers = 1), the size
// ratio fp32/encoded ("x_smaller") and the throughput ratio to plain zstd
// level 1 on the raw float32 bytes measured in the same run ("x_zstd").
//
//	go test -run='^$' -bench='Encode|Decode' -benchtime=20x ./compression

const benchElems = 1 << 22 // 16 MiB of float32, beyond L2

var benchData = sync.OnceValue(func() []float32 { return gaussian(benchElems, 42) })

// zstdRef measures plain zstd level 1 on the raw fp32 bytes: encode and decode GB/s.
var zstdRef = sync.OnceValues(func() (float64, float64) {
	x := benchData()
	raw := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	zenc, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1), zstd.WithEncoderCRC(false))
	zdec, _ := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	comp := zenc.EncodeAll(raw, nil)
	out := make([]byte, 0, len(raw))
	var c []byte
	enc := timeRate(len(raw), func() { c = zenc.EncodeAll(raw, c[:0]) })
	dec := timeRate(len(raw), func() { out, _ = zdec.DecodeAll(comp, out[:0]) })
	return enc, dec
})

// timeRate returns f's throughput in GB/s over at least 300 ms (testing.Benchmark
// cannot run inside a benchmark).
func timeRate(bytes int, f func()) float64 {
	f()
	n := 0
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond || n < 3 {
		f()
		n++
	}
	return float64(bytes) * float64(n) / float64(time.Since(start).Nanoseconds())
}

func benchConfigs() []Config {
	var cfgs []Config
	for _, c := range Codecs() {
		for _, level := range []int{0, 1} {
			cfg := testConfig(c, false, level)
			cfg.Workers = 1
			cfgs = append(cfgs, cfg)
		}
	}
	sr := testConfig(Int8, true, 0)
	sr.Workers = 1
	return append(cfgs, sr)
}

func benchName(cfg Config) string {
	s := fmt.Sprintf("%v/zstd%d", cfg.Codec, cfg.ZstdLevel)
	if cfg.Stochastic {
		s += "/sr"
	}
	return s
}

func reportRates(b *testing.B, bytesIn, encoded int, ref float64) {
	gbps := float64(bytesIn) * float64(b.N) / float64(b.Elapsed().Nanoseconds())
	b.ReportMetric(gbps, "GB/s")
	b.ReportMetric(float64(bytesIn)/float64(encoded), "x_smaller")
	b.ReportMetric(gbps/ref, "x_zstd")
}

func BenchmarkEncode(b *testing.B) {
	x := benchData()
	refEnc, _ := zstdRef()
	for _, cfg := range benchConfigs() {
		b.Run(benchName(cfg), func(b *testing.B) {
			enc, err := NewEncoder(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer enc.Close()
			frame, _ := enc.Append(nil, x, 1)
			b.SetBytes(int64(4 * len(x)))
			b.ResetTimer()
			for b.Loop() {
				frame, _ = enc.Append(frame[:0], x, 1)
			}
			reportRates(b, 4*len(x), len(frame), refEnc)
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	x := benchData()
	_, refDec := zstdRef()
	for _, cfg := range benchConfigs() {
		b.Run(benchName(cfg), func(b *testing.B) {
			enc, _ := NewEncoder(cfg)
			frame, _ := enc.Append(nil, x, 1)
			enc.Close()
			dec, _ := NewDecoder(cfg)
			defer dec.Close()
			y := make([]float32, len(x))
			b.SetBytes(int64(4 * len(x)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := dec.DecodeBytes(frame, y); err != nil {
					b.Fatal(err)
				}
			}
			reportRates(b, 4*len(x), len(frame), refDec)
		})
	}
}

// BenchmarkInt8Kernels measures the quantize and dequantize loops alone.
func BenchmarkInt8Kernels(b *testing.B) {
	x := benchData()
	body := make([]byte, bodyLen(Int8, len(x), DefaultBlockSize))
	y := make([]float32, len(x))
	b.Run("quantize", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			_ = encodeInt8(body, x, DefaultBlockSize, 0, 0, false)
		}
		b.ReportMetric(float64(4*len(x))*float64(b.N)/float64(b.Elapsed().Nanoseconds()), "GB/s")
	})
	b.Run("dequantize", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			_ = decodeInt8(y, body, DefaultBlockSize, 0)
		}
		b.ReportMetric(float64(4*len(x))*float64(b.N)/float64(b.Elapsed().Nanoseconds()), "GB/s")
	})
}

// BenchmarkFastKernels compares the MinMax8 and FP16 loops with the original
// scalar ones (reference_test.go), which write the same bytes, in one run:
//
//	go test -run='^$' -bench=FastKernels -benchtime=20x -count=6 ./compression
//
// "tiny" data is N(0, 1e-4): about half its values are binary16 subnormals.
func BenchmarkFastKernels(b *testing.B) {
	type kernel struct {
		name      string
		enc, orig func(body []byte, x []float32) error
		dec, odec func(dst []float32, body []byte) error
	}
	const bs = DefaultBlockSize
	kernels := []kernel{
		{"minmax8",
			func(body []byte, x []float32) error { return encodeMinMax8(body, x, bs, 0, 1, false) },
			func(body []byte, x []float32) error { return encodeMinMax8Ref(body, x, bs, 0, 1, false) },
			func(dst []float32, body []byte) error { return decodeMinMax8(dst, body, bs, 0) },
			func(dst []float32, body []byte) error { return decodeMinMax8Ref(dst, body, bs, 0) }},
		{"minmax8/sr",
			func(body []byte, x []float32) error { return encodeMinMax8(body, x, bs, 0, 1, true) },
			func(body []byte, x []float32) error { return encodeMinMax8Ref(body, x, bs, 0, 1, true) },
			nil, nil},
		{"fp16",
			func(body []byte, x []float32) error { return encodeFP16(body, x, 0, 1, false) },
			func(body []byte, x []float32) error { return encodeFP16Ref(body, x, 0, 1, false) },
			func(dst []float32, body []byte) error { return decodeFP16(dst, body, 0) },
			func(dst []float32, body []byte) error { return decodeFP16Ref(dst, body, 0) }},
		{"fp16/sr",
			func(body []byte, x []float32) error { return encodeFP16(body, x, 0, 1, true) },
			func(body []byte, x []float32) error { return encodeFP16Ref(body, x, 0, 1, true) },
			nil, nil},
	}
	tiny := slices.Clone(benchData())
	for i := range tiny {
		tiny[i] *= 1e-4
	}
	data := map[string][]float32{"gauss": benchData(), "tiny": tiny}
	rate := func(b *testing.B) {
		b.ReportMetric(float64(4*benchElems)*float64(b.N)/float64(b.Elapsed().Nanoseconds()), "GB/s")
	}
	for _, k := range kernels {
		for _, dn := range []string{"gauss", "tiny"} {
			if dn == "tiny" && !strings.HasPrefix(k.name, "fp16") {
				continue
			}
			x := data[dn]
			body := make([]byte, max(bodyLen(MinMax8, len(x), bs), bodyLen(FP16, len(x), bs)))
			y := make([]float32, len(x))
			for _, impl := range []string{"new", "orig"} {
				enc, dec := k.enc, k.dec
				if impl == "orig" {
					enc, dec = k.orig, k.odec
				}
				b.Run(k.name+"/encode/"+dn+"/"+impl, func(b *testing.B) {
					b.SetBytes(int64(4 * len(x)))
					for b.Loop() {
						if err := enc(body, x); err != nil {
							b.Fatal(err)
						}
					}
					rate(b)
				})
				if dec == nil {
					continue
				}
				b.Run(k.name+"/decode/"+dn+"/"+impl, func(b *testing.B) {
					if err := enc(body, x); err != nil {
						b.Fatal(err)
					}
					b.SetBytes(int64(4 * len(x)))
					for b.Loop() {
						if err := dec(y, body); err != nil {
							b.Fatal(err)
						}
					}
					rate(b)
				})
			}
		}
	}
}

// BenchmarkDecodeAlloc decodes into a nil destination, so Decode allocates
// the output: DecodeBytes at once for the chunks the frame holds, Decode from a
// stream growing it as chunks arrive (chunk64k: 64 chunks, several steps).
func BenchmarkDecodeAlloc(b *testing.B) {
	x := benchData()
	_, refDec := zstdRef()
	for _, c := range []Codec{FP32, Int8} {
		for _, chunk := range []int{DefaultChunkElems, 1 << 16} {
			for _, workers := range []int{1, 2} {
				cfg := testConfig(c, false, 1)
				cfg.Workers = workers
				cfg.ChunkElems = chunk
				enc, _ := NewEncoder(cfg)
				frame, _ := enc.Append(nil, x, 1)
				enc.Close()
				name := fmt.Sprintf("%v/zstd1/chunk%dk/workers%d", c, chunk>>10, workers)
				for _, api := range []string{"bytes", "stream"} {
					b.Run(name+"/"+api, func(b *testing.B) {
						dec, _ := NewDecoder(cfg)
						defer dec.Close()
						var r bytes.Reader
						b.SetBytes(int64(4 * len(x)))
						b.ResetTimer()
						for b.Loop() {
							var err error
							if api == "bytes" {
								_, err = dec.DecodeBytes(frame, nil)
							} else {
								r.Reset(frame)
								_, err = dec.Decode(&r, nil)
							}
							if err != nil {
								b.Fatal(err)
							}
						}
						reportRates(b, 4*len(x), len(frame), refDec)
					})
				}
			}
		}
	}
}
