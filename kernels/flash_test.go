package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// flashShapes are the fused attention's test shapes {B, T, C, NH}: head
// sizes 8, 16 and 64, one to four heads, one or two sequences, and T from
// 1 (one key) through lengths that are not multiples of 32 (the GPU's
// lanes) or 16 (the CPU's small-head path) to 70.
var flashShapes = [][4]int{
	{1, 1, 8, 1}, {2, 5, 16, 2}, {1, 17, 32, 4}, {2, 33, 64, 1},
	{1, 70, 128, 2}, {2, 32, 64, 4}, {1, 45, 256, 4}, {2, 64, 16, 2},
	{1, 31, 32, 2}, {2, 20, 8, 1}, {1, 40, 64, 4}, {2, 50, 128, 2},
}

// refLSE is each (b, h, t) row's log-sum-exp of its scaled scores, in
// float64, from refAttention's preatt.
func refLSE(inp []float64, B, T, C, NH int) []float64 {
	_, pre, _ := refAttention(inp, B, T, C, NH)
	lse := make([]float64, B*NH*T)
	for r := range lse {
		t, row := r%T, pre[r*T:]
		mx := math.Inf(-1)
		for j := 0; j <= t; j++ {
			mx = math.Max(mx, row[j])
		}
		s := 0.0
		for j := 0; j <= t; j++ {
			s += math.Exp(row[j] - mx)
		}
		lse[r] = mx + math.Log(s)
	}
	return lse
}

func flashName(sh [4]int) string {
	return fmt.Sprintf("B%d_T%d_hs%d_NH%d", sh[0], sh[1], sh[2]/sh[3], sh[3])
}

// The fused forward against the float64 reference (out and lse) and the
// materialized AttentionForward; bit-identical for 1 and 2 threads, across
// runs, and to the single-threaded build of the same source that the GPU
// runs (ewise_kernels.h).
func TestFlashAttentionForward(t *testing.T) {
	for _, sh := range flashShapes {
		B, T, C, NH := sh[0], sh[1], sh[2], sh[3]
		t.Run(flashName(sh), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(T), uint64(C)))
			inp := randBuf(r, B*T*3*C, 1.5)
			ro, _, _ := refAttention(to64(inp), B, T, C, NH)
			rl := refLSE(to64(inp), B, T, C, NH)
			old := make(HostBuffer, B*T*C)
			NewCPU(1).AttentionForward(old, make(HostBuffer, B*NH*T*T), make(HostBuffer, B*NH*T*T), inp, B, T, C, NH)
			wantOut, wantLSE := make([]float32, B*T*C), make([]float32, B*NH*T)
			ewiseFlashAttentionForward(wantOut, wantLSE, inp, B, T, C, NH)
			for _, threads := range []int{1, 2, 1} {
				out, lse := make(HostBuffer, B*T*C), make(HostBuffer, B*NH*T)
				for i := range out {
					out[i] = 7 // stale values must be overwritten
				}
				for i := range lse {
					lse[i] = 7
				}
				NewCPU(threads).FlashAttentionForward(out, lse, inp, B, T, C, NH)
				checkClose(t, "out vs float64", out, ro, fwdTol)
				checkClose(t, "lse vs float64", lse, rl, fwdTol)
				checkClose(t, "out vs AttentionForward", out, to64(old), fwdTol)
				sameBits(t, fmt.Sprintf("out, %d threads", threads), out, wantOut)
				sameBits(t, fmt.Sprintf("lse, %d threads", threads), lse, wantLSE)
			}
		})
	}
}

// The fused backward against refAttentionBackward (float64) and the
// materialized AttentionBackward, accumulating into a dinp that starts at
// 1 with stale scratch; bit-identical for 1 and 2 threads, across runs,
// and to the single-threaded build of the GPU's source.
func TestFlashAttentionBackward(t *testing.T) {
	for _, sh := range flashShapes {
		B, T, C, NH := sh[0], sh[1], sh[2], sh[3]
		t.Run(flashName(sh), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(T), uint64(C)+1))
			inp, dout := randBuf(r, B*T*3*C, 1.5), randBuf(r, B*T*C, 1)
			want := refAttentionBackward(to64(inp), to64(dout), B, T, C, NH)
			for i := range want {
				want[i]++
			}
			d1 := NewCPU(1)
			nA := B * NH * T * T
			oldOut, pre, att := make(HostBuffer, B*T*C), make(HostBuffer, nA), make(HostBuffer, nA)
			d1.AttentionForward(oldOut, pre, att, inp, B, T, C, NH)
			old := make(HostBuffer, len(inp))
			for i := range old {
				old[i] = 1
			}
			d1.AttentionBackward(old, make(HostBuffer, nA), make(HostBuffer, nA), dout, inp, att, B, T, C, NH)

			out, lse := make(HostBuffer, B*T*C), make(HostBuffer, B*NH*T)
			d1.FlashAttentionForward(out, lse, inp, B, T, C, NH)
			ref, delta := make([]float32, len(inp)), make([]float32, B*NH*T)
			for i := range ref {
				ref[i] = 1
			}
			ewiseFlashAttentionBackward(ref, delta, dout, out, inp, lse, B, T, C, NH)
			for _, threads := range []int{1, 2, 1} {
				dinp, delta := make(HostBuffer, len(inp)), make(HostBuffer, B*NH*T)
				for i := range dinp {
					dinp[i] = 1 // accumulates
				}
				for i := range delta {
					delta[i] = 5 // scratch: stale values must not matter
				}
				NewCPU(threads).FlashAttentionBackward(dinp, delta, dout, out, inp, lse, B, T, C, NH)
				checkClose(t, "dinp vs float64", dinp, want, fwdTol)
				checkClose(t, "dinp vs AttentionBackward", dinp, to64(old), fwdTol)
				sameBits(t, fmt.Sprintf("dinp, %d threads", threads), dinp, ref)
			}
		})
	}
}

// FlashMaxHeadSize is the C kernels' bound; a larger head is refused with
// ErrShape naming the bound, as are buffers of the wrong length.
func TestFlashAttentionShapes(t *testing.T) {
	if FlashMaxHeadSize != flashMaxHeadSize {
		t.Fatalf("FlashMaxHeadSize %d, SK_FLASH_MAX_HS %d", FlashMaxHeadSize, flashMaxHeadSize)
	}
	d := NewCPU(1)
	buf := func(n int) Buffer { return d.Alloc(n) }
	B, T := 2, 3
	for _, tc := range []struct {
		name, op, msg string
		call          func()
	}{
		{"head too large", "FlashAttentionForward", "FlashMaxHeadSize", func() {
			C, NH := 2*(FlashMaxHeadSize+8), 2
			d.FlashAttentionForward(buf(B*T*C), buf(B*NH*T), buf(B*T*3*C), B, T, C, NH)
		}},
		{"head too large", "FlashAttentionBackward", "FlashMaxHeadSize", func() {
			C, NH := FlashMaxHeadSize+1, 1
			d.FlashAttentionBackward(buf(B*T*3*C), buf(B*NH*T), buf(B*T*C), buf(B*T*C), buf(B*T*3*C), buf(B*NH*T), B, T, C, NH)
		}},
		{"short lse", "FlashAttentionForward", "lse", func() {
			d.FlashAttentionForward(buf(B*T*8), buf(B*2*T-1), buf(B*T*3*8), B, T, 8, 2)
		}},
		{"NH does not divide C", "FlashAttentionForward", "not divisible", func() {
			d.FlashAttentionForward(buf(B*T*8), buf(B*3*T), buf(B*T*3*8), B, T, 8, 3)
		}},
		{"short delta", "FlashAttentionBackward", "delta", func() {
			d.FlashAttentionBackward(buf(B*T*3*8), buf(B*2*T+1), buf(B*T*8), buf(B*T*8), buf(B*T*3*8), buf(B*2*T), B, T, 8, 2)
		}},
		{"long out", "FlashAttentionBackward", "out", func() {
			d.FlashAttentionBackward(buf(B*T*3*8), buf(B*2*T), buf(B*T*8), buf(B*T*8+1), buf(B*T*3*8), buf(B*2*T), B, T, 8, 2)
		}},
		{"zero T", "FlashAttentionForward", "positive", func() {
			d.FlashAttentionForward(buf(0), buf(0), buf(0), B, 0, 8, 2)
		}},
	} {
		t.Run(tc.name+"/"+tc.op, func(t *testing.T) {
			defer func() {
				err, ok := recover().(error)
				if !ok || !errors.Is(err, ErrShape) {
					t.Fatalf("recovered %v, want an error wrapping ErrShape", err)
				}
				if !strings.Contains(err.Error(), tc.op) || !strings.Contains(err.Error(), tc.msg) {
					t.Errorf("message %q does not name %s and %q", err, tc.op, tc.msg)
				}
			}()
			tc.call()
		})
	}
}

// Without a GPU, what can be checked of the CUDA backend's launches: every
// kernel it looks up is an entry of the embedded PTX, and the fused
// attention's entries take the parameters cuda.go passes them (pointers
// and the row count as 64 bits, then T, C and NH as 32).
func TestPTXEntriesMatchLaunches(t *testing.T) {
	ptx := string(ewisePTX)
	for _, fn := range cudaKernels {
		if !strings.Contains(ptx, ".entry "+fn+"(") {
			t.Errorf("kernel %s is not in cuda/kernels.ptx", fn)
		}
	}
	for fn, want := range map[string]string{
		"sk_flash_attention_forward":     "u64 u64 u64 u64 u32 u32 u32",                                 // out, lse, inp, rows, T, C, NH
		"sk_flash_attention_backward_q":  "u64 u64 u64 u64 u64 u64 u64 u32 u32 u32",                     // dinp, delta, dout, out, inp, lse, rows, T, C, NH
		"sk_flash_attention_backward_kv": "u64 u64 u64 u64 u64 u64 u32 u32 u32",                         // dinp, delta, dout, inp, lse, rows, T, C, NH
		"sk_softmax_xent_fused":          "u64 u64 u64 f32 u32 u32 u32",                                 // losses, logits, targets, dloss, N, V, Vp
		"sk_adamw_segments":              "u64 u64 u64 u64 u64 u32 f32 f32 f32 f32 f32 f32 f32 f32 u64", // p, g, m, v, seg, nseg, gscale, lr, b1, b2, eps, wd, bc1, bc2, n
		"sk_residual_layernorm_forward":  "u64 u64 u64 u64 u64 u64 u64 u64 u32 u32",                     // res, out, mean, rstd, a, b, w, bias, N, C
	} {
		_, decl, ok := strings.Cut(ptx, ".entry "+fn+"(")
		decl, _, _ = strings.Cut(decl, ")")
		var got []string
		for _, line := range strings.Split(decl, "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == ".param" {
				got = append(got, strings.TrimPrefix(f[1], "."))
			}
		}
		if !ok || strings.Join(got, " ") != want {
			t.Errorf("%s takes %v, the launch passes %s", fn, got, want)
		}
	}
}
