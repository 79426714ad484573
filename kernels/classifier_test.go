package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// The fused classifier gives the bits of the forward, then the backward
// into zeroed dlogits (both builds of it: the CPU backend's vectorized
// rows and the CPU build of the GPU source), for every thread count, with
// padding columns and targets at the row's ends; the padding of the
// gradient is 0 whatever the logits held there.
func TestSoftmaxCrossEntropyFused(t *testing.T) {
	for _, tc := range []struct{ N, V, Vp int }{{1, 2, 2}, {3, 7, 8}, {17, 65, 80}, {64, 257, 320}, {5, 1000, 1024}} {
		rng := rand.New(rand.NewPCG(uint64(tc.N), uint64(tc.V)))
		logits := randomVec(rng, tc.N*tc.Vp, 4)
		targets := randomIDs(rng, tc.N, tc.V)
		targets[0] = 0
		targets[tc.N-1] = int32(tc.V - 1)
		dloss := 1 / float32(tc.N)
		for _, threads := range []int{1, 2, 3} {
			d := NewCPU(threads)
			host := func(b Buffer) []float32 { x := make([]float32, b.Len()); d.CopyOut(x, b); return x }
			lg, probs, losses := d.Alloc(tc.N*tc.Vp), d.Alloc(tc.N*tc.Vp), d.Alloc(tc.N)
			d.CopyIn(lg, logits)
			d.SoftmaxCrossEntropyForward(losses, probs, lg, targets, tc.N, tc.V, tc.Vp)
			d.Zero(lg)
			d.SoftmaxCrossEntropyBackward(lg, probs, targets, dloss, tc.N, tc.V, tc.Vp)
			wantL, wantG := host(losses), host(lg)

			fl, fused := d.Alloc(tc.N), d.Alloc(tc.N*tc.Vp)
			d.CopyIn(fused, logits)
			d.SoftmaxCrossEntropyFused(fl, fused, targets, dloss, tc.N, tc.V, tc.Vp)
			sameBits(t, "fused losses", host(fl), wantL)
			sameBits(t, "fused gradient", host(fused), wantG)
		}
		// The GPU source's CPU build against its own forward and backward.
		losses, probs := make([]float32, tc.N), make([]float32, tc.N*tc.Vp)
		ewiseSoftmaxXentForward(losses, probs, logits, targets, tc.N, tc.V, tc.Vp)
		grad := make([]float32, tc.N*tc.Vp)
		ewiseSoftmaxXentBackward(grad, probs, targets, dloss, tc.N, tc.V, tc.Vp)
		fl, fused := make([]float32, tc.N), append([]float32(nil), logits...)
		ewiseSoftmaxXentFused(fl, fused, targets, dloss, tc.N, tc.V, tc.Vp)
		sameBits(t, "ewise fused losses", fl, losses)
		sameBits(t, "ewise fused gradient", fused, grad)
		// And the loss is -log softmax[target], in float64.
		for n := range tc.N {
			row := logits[n*tc.Vp : n*tc.Vp+tc.V]
			mx := math.Inf(-1)
			for _, v := range row {
				mx = math.Max(mx, float64(v))
			}
			var s float64
			for _, v := range row {
				s += math.Exp(float64(v) - mx)
			}
			if want := math.Log(s) - (float64(row[targets[n]]) - mx); math.Abs(float64(fl[n])-want) > 1e-4*math.Max(1, want) {
				t.Fatalf("N %d V %d row %d: loss %v, float64 %v", tc.N, tc.V, n, fl[n], want)
			}
		}
	}
}

// sameBits fails unless got and want hold the same float32 bits.
func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s[%d] = %v, want %v (bits differ)", what, i, got[i], want[i])
		}
	}
}

// The fused classifier refuses what the forward refuses: a target outside
// the vocabulary, V past Vp, buffers of the wrong length.
func TestSoftmaxCrossEntropyFusedShapes(t *testing.T) {
	d := NewCPU(1)
	for _, tc := range []struct {
		name string
		f    func()
	}{
		{"target", func() { d.SoftmaxCrossEntropyFused(d.Alloc(1), d.Alloc(8), []int32{6}, 1, 1, 6, 8) }},
		{"V past Vp", func() { d.SoftmaxCrossEntropyFused(d.Alloc(1), d.Alloc(8), []int32{0}, 1, 1, 9, 8) }},
		{"logits", func() { d.SoftmaxCrossEntropyFused(d.Alloc(1), d.Alloc(7), []int32{0}, 1, 1, 6, 8) }},
		{"losses", func() { d.SoftmaxCrossEntropyFused(d.Alloc(2), d.Alloc(8), []int32{0}, 1, 1, 6, 8) }},
		{"targets", func() { d.SoftmaxCrossEntropyFused(d.Alloc(1), d.Alloc(8), []int32{0, 1}, 1, 1, 6, 8) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if err, ok := r.(error); !(ok && errors.Is(err, ErrShape) || strings.Contains(fmt.Sprint(r), "out of range")) {
					t.Fatalf("recovered %v, want an ErrShape or out of range panic", r)
				}
			}()
			tc.f()
		})
	}
}

// BenchmarkClassifier is the classifier's forward and backward as the model
// ran them (forward into probs, zeroed dlogits, backward) against the fused
// pass, at the tiny model's shape and GPT-2's vocabulary (1024 rows of
// 50257, padded to 50304), on one thread:
//
//	go test ./kernels -run '^$' -bench Classifier -benchtime 20x
func BenchmarkClassifier(b *testing.B) {
	for _, sh := range []struct {
		name     string
		N, V, Vp int
	}{{"tiny", bN, bV, bV}, {"gpt2-vocab", 1024, 50257, 50304}} {
		r := rand.New(rand.NewPCG(1, 9))
		d := NewCPU(1)
		logits, tg := randBuf(r, sh.N*sh.Vp, 2), randIDs(r, sh.N, sh.V)
		losses := d.Alloc(sh.N)
		b.Run(sh.name+"/separate", func(b *testing.B) {
			probs, dlogits := d.Alloc(sh.N*sh.Vp), d.Alloc(sh.N*sh.Vp)
			for b.Loop() {
				d.SoftmaxCrossEntropyForward(losses, probs, logits, tg, sh.N, sh.V, sh.Vp)
				d.Zero(dlogits)
				d.SoftmaxCrossEntropyBackward(dlogits, probs, tg, 1/float32(sh.N), sh.N, sh.V, sh.Vp)
			}
			b.ReportMetric(float64(2*sh.N*sh.Vp*4)/1e6, "MB-held")
		})
		b.Run(sh.name+"/fused", func(b *testing.B) {
			for b.Loop() { // on its own output after the first: the same work
				d.SoftmaxCrossEntropyFused(losses, logits, tg, 1/float32(sh.N), sh.N, sh.V, sh.Vp)
			}
			b.ReportMetric(float64(sh.N*sh.Vp*4)/1e6, "MB-held")
		})
	}
}

// The residual with its LayerNorm in one pass gives the bits of
// ResidualForward then LayerNormForward (the CPU backend at several thread
// counts, and the CPU build of the GPU source against its own two kernels).
func TestResidualLayerNormForward(t *testing.T) {
	for _, sh := range [][2]int{{1, 1}, {3, 7}, {17, 64}, {64, 768}, {5, 1000}} {
		N, C := sh[0], sh[1]
		rng := rand.New(rand.NewPCG(uint64(N), uint64(C)))
		a, b, w, bias := randomVec(rng, N*C, 2), randomVec(rng, N*C, 1), randomVec(rng, C, 1), randomVec(rng, C, 0.2)
		for _, threads := range []int{1, 2, 3} {
			d := NewCPU(threads)
			in := func(x []float32) Buffer { buf := d.Alloc(len(x)); d.CopyIn(buf, x); return buf }
			out := func(buf Buffer) []float32 { x := make([]float32, buf.Len()); d.CopyOut(x, buf); return x }
			ab, bb, wb, biasb := in(a), in(b), in(w), in(bias)
			res, ln, mean, rstd := d.Alloc(N*C), d.Alloc(N*C), d.Alloc(N), d.Alloc(N)
			d.ResidualForward(res, ab, bb, N*C)
			d.LayerNormForward(ln, mean, rstd, res, wb, biasb, N, C)
			fres, fln, fmean, frstd := d.Alloc(N*C), d.Alloc(N*C), d.Alloc(N), d.Alloc(N)
			d.ResidualLayerNormForward(fres, fln, fmean, frstd, ab, bb, wb, biasb, N, C)
			tag := fmt.Sprintf("N %d C %d threads %d", N, C, threads)
			sameBits(t, tag+" res", out(fres), out(res))
			sameBits(t, tag+" out", out(fln), out(ln))
			sameBits(t, tag+" mean", out(fmean), out(mean))
			sameBits(t, tag+" rstd", out(frstd), out(rstd))
		}
		res, ln, mean, rstd := make([]float32, N*C), make([]float32, N*C), make([]float32, N), make([]float32, N)
		ewiseResidualForward(res, a, b)
		ewiseLayerNormForward(ln, mean, rstd, res, w, bias, N, C)
		fres, fln, fmean, frstd := make([]float32, N*C), make([]float32, N*C), make([]float32, N), make([]float32, N)
		ewiseResidualLayerNormForward(fres, fln, fmean, frstd, a, b, w, bias, N, C)
		sameBits(t, "ewise res", fres, res)
		sameBits(t, "ewise out", fln, ln)
		sameBits(t, "ewise mean", fmean, mean)
		sameBits(t, "ewise rstd", frstd, rstd)
	}
}
