package kernels

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
)

// cpuSeconds is the process's user+system CPU time, for benchmarks on a
// shared machine where wall time is noisy.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// attShapes are shapes of the small-head attention path (T and hs multiples
// of 16; the AVX-512 variant, the others take the GEMM path) checked against
// the float64 reference: the tiny and small presets' head sizes at short T,
// and hs = 16 and 48.
var attShapes = [][4]int{{2, 32, 64, 2}, {1, 48, 128, 2}, {1, 64, 96, 2}, {2, 16, 32, 2}}

func TestAttentionSmallHeadForward(t *testing.T) {
	forEachLayerISA(t, func(t *testing.T) {
		for _, sh := range attShapes {
			B, T, C, NH := sh[0], sh[1], sh[2], sh[3]
			for _, threads := range []int{1, 2} {
				t.Run(fmt.Sprintf("T%d_hs%d/threads=%d", T, C/NH, threads), func(t *testing.T) {
					d := NewCPU(threads)
					r := rand.New(rand.NewPCG(uint64(T), uint64(C)))
					inp := randBuf(r, B*T*3*C, 1.5)
					out := make(HostBuffer, B*T*C)
					pre, att := make(HostBuffer, B*NH*T*T), make(HostBuffer, B*NH*T*T)
					for i := range pre {
						pre[i], att[i] = 7, 7
					}
					d.AttentionForward(out, pre, att, inp, B, T, C, NH)
					ro, rp, ra := refAttention(to64(inp), B, T, C, NH)
					checkClose(t, "out", out, ro, fwdTol)
					checkClose(t, "preatt", pre, rp, fwdTol)
					checkClose(t, "att", att, ra, fwdTol)
				})
			}
		}
	})
}

// refAttentionBackward is the float64 backward of refAttention: dinp for
// dout, by the chain rule written out directly.
func refAttentionBackward(inp, dout []float64, B, T, C, NH int) []float64 {
	hs := C / NH
	C3 := 3 * C
	_, _, att := refAttention(inp, B, T, C, NH)
	scale := 1 / sqrt64(float64(hs))
	dinp := make([]float64, len(inp))
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			a := att[(b*NH+h)*T*T:]
			for t := 0; t < T; t++ {
				qo := b*T*C3 + t*C3 + h*hs
				do := dout[b*T*C+t*C+h*hs:]
				datt := make([]float64, t+1)
				for j := 0; j <= t; j++ {
					vo := b*T*C3 + j*C3 + 2*C + h*hs
					for i := 0; i < hs; i++ {
						datt[j] += do[i] * inp[vo+i]
						dinp[vo+i] += a[t*T+j] * do[i]
					}
				}
				dot := 0.0
				for j := 0; j <= t; j++ {
					dot += a[t*T+j] * datt[j]
				}
				for j := 0; j <= t; j++ {
					dp := a[t*T+j] * (datt[j] - dot) * scale
					ko := b*T*C3 + j*C3 + C + h*hs
					for i := 0; i < hs; i++ {
						dinp[qo+i] += dp * inp[ko+i]
						dinp[ko+i] += dp * inp[qo+i]
					}
				}
			}
		}
	}
	return dinp
}

func sqrt64(x float64) float64 {
	z := x
	for i := 0; i < 60; i++ {
		z = (z + x/z) / 2
	}
	return z
}

func TestAttentionSmallHeadBackward(t *testing.T) {
	forEachLayerISA(t, func(t *testing.T) {
		for _, sh := range attShapes {
			B, T, C, NH := sh[0], sh[1], sh[2], sh[3]
			r := rand.New(rand.NewPCG(uint64(T), uint64(C)+1))
			inp, dout := randBuf(r, B*T*3*C, 1.5), randBuf(r, B*T*C, 1)
			want := refAttentionBackward(to64(inp), to64(dout), B, T, C, NH)
			var first HostBuffer
			for _, threads := range []int{1, 2} {
				t.Run(fmt.Sprintf("T%d_hs%d/threads=%d", T, C/NH, threads), func(t *testing.T) {
					d := NewCPU(threads)
					n := B * NH * T * T
					out, pre, att := make(HostBuffer, B*T*C), make(HostBuffer, n), make(HostBuffer, n)
					d.AttentionForward(out, pre, att, inp, B, T, C, NH)
					dpre, datt := make(HostBuffer, n), make(HostBuffer, n)
					for i := range dpre {
						dpre[i], datt[i] = 5, 5
					}
					dinp := make(HostBuffer, len(inp))
					for i := range dinp {
						dinp[i] = 1 // accumulates
					}
					d.AttentionBackward(dinp, dpre, datt, dout, inp, att, B, T, C, NH)
					w := make([]float64, len(want))
					for i := range w {
						w[i] = want[i] + 1
					}
					checkClose(t, "dinp", dinp, w, fwdTol)
					if first == nil {
						first = dinp
					} else {
						for i := range dinp {
							if dinp[i] != first[i] {
								t.Fatalf("dinp[%d] = %g with %d threads, %g with 1", i, dinp[i], threads, first[i])
							}
						}
					}
				})
			}
		}
	})
}

// BenchmarkAttentionShapes times attention forward + backward at the tiny
// and small presets' shapes (GFLOPS count the causal half, as
// BenchmarkLayerAttention).
//
//	go test ./kernels -run '^$' -bench 'AttentionShapes' -benchtime 1s
func BenchmarkAttentionShapes(b *testing.B) {
	for _, s := range []struct {
		name        string
		B, T, C, NH int
	}{{"tiny", 16, 128, 128, 4}, {"small", 8, 256, 384, 6}} {
		b.Run(s.name, func(b *testing.B) {
			benchThreads(b, func(b *testing.B, d *CPU) {
				r := rand.New(rand.NewPCG(1, 4))
				N, nA := s.B*s.T, s.B*s.NH*s.T*s.T
				inp, out := randBuf(r, N*3*s.C, 1), d.Alloc(N*s.C)
				pre, att, dpre, datt := d.Alloc(nA), d.Alloc(nA), d.Alloc(nA), d.Alloc(nA)
				dinp := d.Alloc(N * 3 * s.C)
				c0 := cpuSeconds()
				for b.Loop() {
					d.AttentionForward(out, pre, att, inp, s.B, s.T, s.C, s.NH)
					d.AttentionBackward(dinp, dpre, datt, out, inp, att, s.B, s.T, s.C, s.NH)
				}
				cpu := cpuSeconds() - c0
				pairs := float64(s.B*s.NH*s.T*(s.T+1)) / 2
				reportGFLOPS(b, pairs*2*float64(s.C/s.NH)*6)
				b.ReportMetric(cpu/float64(b.N)*1e3, "cpu-ms/op")
				b.ReportMetric(pairs*2*float64(s.C/s.NH)*6*float64(b.N)/cpu/1e9, "cpu-GFLOPS")
			})
		})
	}
}

// BenchmarkFlashAttention times forward + backward of the materialized
// attention ("old": AttentionForward/Backward) and the fused one ("flash")
// at BenchmarkAttentionShapes' shapes and at GPT-2 small's full context for
// one sequence; att-MB is what the old path keeps in preatt and att
// ((B,NH,T,T) each; its backward's dpreatt and datt scratch are as much
// again), lse-MB what the fused one keeps instead.
//
//	go test ./kernels -run '^$' -bench 'FlashAttention' -benchtime 2x
func BenchmarkFlashAttention(b *testing.B) {
	for _, s := range []struct {
		name        string
		B, T, C, NH int
	}{{"tiny", 16, 128, 128, 4}, {"small", 8, 256, 384, 6}, {"gpt2-T1024", 1, 1024, 768, 12}} {
		for _, path := range []string{"old", "flash"} {
			b.Run(s.name+"/"+path, func(b *testing.B) {
				benchThreads(b, func(b *testing.B, d *CPU) {
					r := rand.New(rand.NewPCG(1, 4))
					N, nA, nL := s.B*s.T, s.B*s.NH*s.T*s.T, s.B*s.NH*s.T
					inp, out, dinp := randBuf(r, N*3*s.C, 1), d.Alloc(N*s.C), d.Alloc(N*3*s.C)
					dout := randBuf(r, N*s.C, 1)
					var step func()
					kept, unit := float64(4*nL)/1e6, "lse-MB"
					if path == "old" {
						kept, unit = float64(2*4*nA)/1e6, "att-MB"
						pre, att, dpre, datt := d.Alloc(nA), d.Alloc(nA), d.Alloc(nA), d.Alloc(nA)
						step = func() {
							d.AttentionForward(out, pre, att, inp, s.B, s.T, s.C, s.NH)
							d.AttentionBackward(dinp, dpre, datt, dout, inp, att, s.B, s.T, s.C, s.NH)
						}
					} else {
						lse, delta := d.Alloc(nL), d.Alloc(nL)
						step = func() {
							d.FlashAttentionForward(out, lse, inp, s.B, s.T, s.C, s.NH)
							d.FlashAttentionBackward(dinp, delta, dout, out, inp, lse, s.B, s.T, s.C, s.NH)
						}
					}
					c0 := cpuSeconds()
					for b.Loop() {
						step()
					}
					b.ReportMetric((cpuSeconds()-c0)/float64(b.N)*1e3, "cpu-ms/op")
					b.ReportMetric(kept, unit) // after the loop, which clears metrics
				})
			})
		}
	}
}
