package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// output is one result of exercise: a buffer read back after a kernel.
type output struct {
	name string
	gemm bool // computed through GEMMs (TF32 on the GPU by default)
	vals []float32
}

// exercise runs every Device method on dev from the same seeded inputs and
// returns what each wrote. Accumulating kernels start from random values,
// so an element a kernel forgot stays visibly wrong; shapes are odd where
// they can be, to catch tile edges.
func exercise(dev Device) []output {
	rng := rand.New(rand.NewPCG(5, 6))
	var outs []output
	in := func(x []float32) Buffer { b := dev.Alloc(len(x)); dev.CopyIn(b, x); return b }
	read := func(name string, gemm bool, b Buffer) {
		h := make([]float32, b.Len())
		dev.CopyOut(h, b)
		outs = append(outs, output{name, gemm, h})
	}
	rv := func(n int, s float32) []float32 { return randomVec(rng, n, s) }

	const n = 100003
	x, dy := rv(n, 2), rv(n, 1)
	o := in(rv(n, 1))
	dev.GeluForward(o, in(x), n)
	read("gelu forward", false, o)
	dx := in(rv(n, 1))
	dev.GeluBackward(dx, in(x), in(dy), n)
	read("gelu backward", false, dx)
	dev.ResidualForward(o, in(x), in(dy), n)
	read("residual forward", false, o)
	da, db := in(rv(n, 1)), in(rv(n, 1))
	dev.ResidualBackward(da, db, in(dy), n)
	read("residual backward a", false, da)
	read("residual backward b", false, db)
	s := in(x)
	dev.Scale(s, 0.37)
	read("scale", false, s)
	big := rv(1000003, 1)
	outs = append(outs, output{"sum of squares", false, []float32{float32(dev.SumSquares(in(big)))}})
	vv := rv(n, 0.01)
	for i := range vv {
		vv[i] = vv[i]*vv[i] + 1e-6
	}
	p, m, v := in(rv(n, 1)), in(rv(n, 0.01)), in(vv)
	dev.AdamW(p, in(rv(n, 0.1)), m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3)
	read("adamw params", false, p)
	read("adamw m", false, m)
	read("adamw v", false, v)
	sp, sm, sv := in(rv(n, 1)), in(rv(n, 0.01)), in(vv)
	dev.AdamWSegments(sp, in(rv(n, 0.1)), sm, sv, []int{10, 5000, 5001, n}, []bool{true, false, true, true}, 0.37, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3)
	read("adamw segments params", false, sp)
	read("adamw segments m", false, sm)
	read("adamw segments v", false, sv)
	z := in(rv(1000, 1))
	dev.Zero(z.Slice(100, 800))
	read("zero of a slice", false, z)

	const N, Ch, V, Vp, B, T = 67, 96, 250, 256, 2, 33
	tokens := randomIDs(rng, B*T, V)
	wte, wpe := in(rv(V*Ch, 1)), in(rv(T*Ch, 1))
	eo := in(rv(B*T*Ch, 1))
	dev.EncoderForward(eo, tokens, wte, wpe, B, T, Ch)
	read("encoder forward", false, eo)
	dwte, dwpe := in(rv(V*Ch, 1)), in(rv(T*Ch, 1))
	dev.EncoderBackward(dwte, dwpe, in(rv(B*T*Ch, 1)), tokens, B, T, Ch)
	read("encoder backward dwte", false, dwte)
	read("encoder backward dwpe", false, dwpe)

	lx, lw, lb := in(rv(N*Ch, 1.5)), in(rv(Ch, 1)), in(rv(Ch, 0.2))
	lo, lm, lr := in(rv(N*Ch, 1)), in(rv(N, 1)), in(rv(N, 1))
	dev.LayerNormForward(lo, lm, lr, lx, lw, lb, N, Ch)
	read("layernorm forward", false, lo)
	read("layernorm mean", false, lm)
	read("layernorm rstd", false, lr)
	rr, ro, rm, rs := in(rv(N*Ch, 1)), in(rv(N*Ch, 1)), in(rv(N, 1)), in(rv(N, 1))
	dev.ResidualLayerNormForward(rr, ro, rm, rs, lx, in(rv(N*Ch, 1)), lw, lb, N, Ch)
	read("residual+layernorm res", false, rr)
	read("residual+layernorm out", false, ro)
	read("residual+layernorm mean", false, rm)
	read("residual+layernorm rstd", false, rs)
	ldx, ldw, ldb := in(rv(N*Ch, 1)), in(rv(Ch, 1)), in(rv(Ch, 1))
	dev.LayerNormBackward(ldx, ldw, ldb, in(rv(N*Ch, 1)), lx, lw, lm, lr, N, Ch)
	read("layernorm dinp", false, ldx)
	read("layernorm dweight", false, ldw)
	read("layernorm dbias", false, ldb)

	targets := randomIDs(rng, N, V)
	lh := rv(N*Vp, 3)
	logits := in(lh)
	sl, sp := in(rv(N, 1)), in(rv(N*Vp, 1))
	dev.SoftmaxCrossEntropyForward(sl, sp, logits, targets, N, V, Vp)
	read("cross-entropy losses", false, sl)
	read("cross-entropy probs", false, sp)
	dl := in(rv(N*Vp, 1))
	dev.SoftmaxCrossEntropyBackward(dl, sp, targets, 1.0/N, N, V, Vp)
	read("cross-entropy dlogits", false, dl)
	fl, fg := in(rv(N, 1)), in(lh)
	dev.SoftmaxCrossEntropyFused(fl, fg, targets, 1.0/N, N, V, Vp)
	read("fused cross-entropy losses", false, fl)
	read("fused cross-entropy dlogits", false, fg)

	for _, sh := range [][3]int{{67, 96, 130}, {256, 384, 1152}, {64, 1, 16}, {64, 16, 1}} {
		mN, mC, mOC := sh[0], sh[1], sh[2]
		tag := fmt.Sprintf(" %dx%dx%d", mN, mC, mOC)
		inp, w, bias := in(rv(mN*mC, 1)), in(rv(mOC*mC, 0.1)), in(rv(mOC, 1))
		mo := in(rv(mN*mOC, 1))
		dev.MatmulForward(mo, inp, w, bias, mN, mC, mOC)
		read("matmul forward"+tag, true, mo)
		dev.MatmulForward(mo, inp, w, nil, mN, mC, mOC)
		read("matmul forward, no bias"+tag, true, mo)
		mdx, mdw, mdb := in(rv(mN*mC, 1)), in(rv(mOC*mC, 1)), in(rv(mOC, 1))
		dev.MatmulBackward(mdx, mdw, mdb, in(rv(mN*mOC, 1)), inp, w, mN, mC, mOC)
		read("matmul dinp"+tag, true, mdx)
		read("matmul dweight"+tag, true, mdw)
		read("matmul dbias"+tag, false, mdb)
	}

	for _, sh := range [][4]int{{2, 33, 96, 4}, {2, 64, 128, 4}} {
		aB, aT, aC, aNH := sh[0], sh[1], sh[2], sh[3]
		tag := fmt.Sprintf(" B%d T%d C%d NH%d", aB, aT, aC, aNH)
		qkv := in(rv(aB*aT*3*aC, 1))
		ao, pre, att := in(rv(aB*aT*aC, 1)), in(rv(aB*aNH*aT*aT, 1)), in(rv(aB*aNH*aT*aT, 1))
		dev.AttentionForward(ao, pre, att, qkv, aB, aT, aC, aNH)
		read("attention out"+tag, true, ao)
		read("attention preatt"+tag, true, pre)
		read("attention att"+tag, true, att)
		adx := in(rv(aB*aT*3*aC, 1))
		dev.AttentionBackward(adx, in(rv(aB*aNH*aT*aT, 1)), in(rv(aB*aNH*aT*aT, 1)), in(rv(aB*aT*aC, 1)), qkv, att, aB, aT, aC, aNH)
		read("attention dinp"+tag, true, adx)
	}
	// The fused attention: no GEMMs, so fp32 tolerances on every executor.
	for _, sh := range [][4]int{{2, 33, 96, 4}, {1, 70, 128, 2}, {2, 17, 32, 4}} {
		aB, aT, aC, aNH := sh[0], sh[1], sh[2], sh[3]
		tag := fmt.Sprintf(" B%d T%d C%d NH%d", aB, aT, aC, aNH)
		qkv := in(rv(aB*aT*3*aC, 1))
		fo, lse := in(rv(aB*aT*aC, 1)), in(rv(aB*aNH*aT, 1))
		dev.FlashAttentionForward(fo, lse, qkv, aB, aT, aC, aNH)
		read("flash attention out"+tag, false, fo)
		read("flash attention lse"+tag, false, lse)
		fdx := in(rv(aB*aT*3*aC, 1))
		dev.FlashAttentionBackward(fdx, in(rv(aB*aNH*aT, 1)), in(rv(aB*aT*aC, 1)), fo, qkv, lse, aB, aT, aC, aNH)
		read("flash attention dinp"+tag, false, fdx)
	}
	return outs
}

// relErr is |got - want| / |want| in the 2-norm, NaN if got has a NaN.
func relErr(got, want []float32) float64 {
	var d, w float64
	for i := range want {
		g := float64(got[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return math.NaN()
		}
		d += (g - float64(want[i])) * (g - float64(want[i]))
		w += float64(want[i]) * float64(want[i])
	}
	if w == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / w)
}

// Every Device method on the GPU agrees with the CPU backend on the same
// inputs, for each way the GEMMs can run: cuBLAS in fp32, cuBLAS in TF32
// (the default) and the tiled fallback. Skipped, with the driver's reason,
// where there is no GPU.
func TestCUDAParity(t *testing.T) {
	c0, err := OpenCUDA(0)
	if errors.Is(err, ErrNoCUDA) {
		t.Skipf("no GPU to run the CUDA backend on: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	c0.Close()
	want := exercise(NewCPU(0))
	for _, tc := range []struct {
		name    string
		cfg     CUDAConfig
		gemmTol float64
	}{
		{"cublas fp32", CUDAConfig{FP32: true}, 1e-5},
		{"cublas tf32", CUDAConfig{}, 3e-3},
		{"tiled", CUDAConfig{NoCUBLAS: true}, 1e-5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewCUDA(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if !tc.cfg.NoCUBLAS && !strings.Contains(c.Name(), "cublas") {
				t.Skipf("%s: no cuBLAS here", c.Name())
			}
			t.Logf("on %s", c.Name())
			got := exercise(c)
			if err := c.Err(); err != nil {
				t.Fatal(err)
			}
			for i, w := range want {
				tol := 1e-5
				if w.gemm {
					tol = tc.gemmTol
				}
				e := relErr(got[i].vals, w.vals)
				t.Logf("%-40s relative error %.2g", w.name, e)
				if !(e <= tol) {
					t.Errorf("%s: relative error %.3g, want <= %g", w.name, e, tol)
				}
			}
		})
	}
}

// A failure on the GPU is sticky: Err says what, and later calls do
// nothing (a read leaves its destination alone) rather than crash.
func TestCUDAStickyError(t *testing.T) {
	c, err := OpenCUDA(0)
	if errors.Is(err, ErrNoCUDA) {
		t.Skipf("no GPU: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ok := c.Alloc(4)
	c.CopyIn(ok, []float32{1, 2, 3, 4})
	_, total, err := c.MemInfo()
	if err != nil {
		t.Fatal(err)
	}
	c.Alloc(int(total)) // 4x the GPU's memory
	if err := c.Err(); !errors.Is(err, ErrDevice) {
		t.Fatalf("Err after an impossible allocation: %v", err)
	}
	t.Logf("sticky: %v", c.Err())
	dst := []float32{9, 9, 9, 9}
	c.CopyOut(dst, ok)
	if dst[0] != 9 {
		t.Fatalf("a failed device still copied out %v", dst)
	}
}

// --device: cpu; auto (a GPU if one answers, else the CPU and why); cuda:N
// (an error naming the cause where there is no GPU); nonsense is an error.
func TestSelectDevice(t *testing.T) {
	dev, note, err := SelectDevice("cpu", 1)
	if err != nil || note != "" || !strings.HasPrefix(dev.Name(), "cpu") {
		t.Fatalf("cpu: %v %q %v", dev, note, err)
	}
	gpu, gpuErr := OpenCUDA(0)
	if gpuErr == nil {
		gpu.Close()
	}
	dev, note, err = SelectDevice("auto", 1)
	if err != nil || !strings.Contains(note, "--device auto") {
		t.Fatalf("auto: %v %q %v", dev, note, err)
	}
	t.Logf("auto: %s", note)
	if gpuErr != nil {
		if !strings.HasPrefix(dev.Name(), "cpu") || !strings.Contains(note, "CPU") {
			t.Fatalf("auto without a GPU: %s, %q", dev.Name(), note)
		}
		if _, _, err := SelectDevice("cuda:0", 1); !errors.Is(err, ErrNoCUDA) {
			t.Fatalf("cuda:0 without a GPU: %v", err)
		}
	} else {
		if !strings.HasPrefix(dev.Name(), "cuda:0") {
			t.Fatalf("auto with a GPU: %s", dev.Name())
		}
		d, _, err := SelectDevice("cuda:0,fp32", 1)
		if err != nil || !strings.Contains(d.Name(), "fp32") && !strings.Contains(d.Name(), "tiled") {
			t.Fatalf("cuda:0,fp32: %v %v", d, err)
		}
	}
	for _, bad := range []string{"tpu", "cuda:", "cuda:x", "cuda:0,bf16", "cuda:0x", "cuda:0,", "cuda:0,flash,flash", "cuda:0,fp32,"} {
		if _, _, err := SelectDevice(bad, 1); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The options of cuda:N, parsed without a GPU.
func TestParseCUDASpec(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want CUDAConfig
	}{
		{"cuda:0", CUDAConfig{}},
		{"cuda:3", CUDAConfig{Ordinal: 3}},
		{"cuda:1,fp32", CUDAConfig{Ordinal: 1, FP32: true}},
		{"cuda:0,flash", CUDAConfig{FusedAttention: true}},
		{"cuda:2,flash,fp32", CUDAConfig{Ordinal: 2, FP32: true, FusedAttention: true}},
	} {
		if got, err := ParseCUDASpec(tc.spec); err != nil || got != tc.want {
			t.Errorf("%q: %+v %v, want %+v", tc.spec, got, err, tc.want)
		}
	}
}

// The GEMMs of a GPT-2-small MLP layer (N = 8 x 1024 tokens, C = 768, OC =
// 3072), forward and backward, on each GEMM executor: cuBLAS in TF32 and
// fp32, and our tiled kernel; TFLOP/s in the report. Skipped without a GPU.
func BenchmarkCUDAMatmul(b *testing.B) {
	const N, Ch, OC = 8192, 768, 3072
	for _, tc := range []struct {
		name string
		cfg  CUDAConfig
	}{{"cublas-tf32", CUDAConfig{}}, {"cublas-fp32", CUDAConfig{FP32: true}}, {"tiled", CUDAConfig{NoCUBLAS: true}}} {
		b.Run(tc.name, func(b *testing.B) {
			c, err := NewCUDA(tc.cfg)
			if err != nil {
				b.Skipf("no GPU: %v", err)
			}
			defer c.Close()
			rng := rand.New(rand.NewPCG(1, 2))
			in := func(x []float32) Buffer { buf := c.Alloc(len(x)); c.CopyIn(buf, x); return buf }
			inp, w, bias, dout := in(randomVec(rng, N*Ch, 1)), in(randomVec(rng, OC*Ch, 0.02)), in(randomVec(rng, OC, 1)), in(randomVec(rng, N*OC, 1))
			out, dinp, dw, db := c.Alloc(N*OC), c.Alloc(N*Ch), c.Alloc(OC*Ch), c.Alloc(OC)
			sync := func() { c.CopyOut(make([]float32, 1), out.Slice(0, 1)) }
			step := func() {
				c.MatmulForward(out, inp, w, bias, N, Ch, OC)
				c.MatmulBackward(dinp, dw, db, dout, inp, w, N, Ch, OC)
			}
			step()
			sync()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				step()
			}
			sync()
			b.StopTimer()
			if err := c.Err(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(3*2*float64(N)*Ch*OC*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
		})
	}
}

// Each Device method at the shapes of a GPT-2-small step (B = 8, T = 1024,
// C = 768, 12 heads, vocabulary 50304): where a step's time goes on the
// GPU. Skipped without a GPU.
func BenchmarkCUDAOps(b *testing.B) {
	c, err := OpenCUDA(0)
	if err != nil {
		b.Skipf("no GPU: %v", err)
	}
	defer c.Close()
	const B, T, Ch, NH, V, Vp = 8, 1024, 768, 12, 50257, 50304
	const N = B * T
	rng := rand.New(rand.NewPCG(1, 2))
	in := func(n int, s float32) Buffer { buf := c.Alloc(n); c.CopyIn(buf, randomVec(rng, n, s)); return buf }
	tokens, targets := randomIDs(rng, N, V), randomIDs(rng, N, V)
	x, y, w, bias := in(N*Ch, 1), in(N*Ch, 1), in(Ch, 1), in(Ch, 0.1)
	mean, rstd := in(N, 1), in(N, 1)
	x4, y4 := in(4*N*Ch, 1), in(4*N*Ch, 1)
	qkv, dqkv := in(N*3*Ch, 1), in(N*3*Ch, 1)
	sq1, sq2, sq3 := in(B*NH*T*T, 1), in(B*NH*T*T, 1), in(B*NH*T*T, 1)
	lse, delta := in(B*NH*T, 1), in(B*NH*T, 1)
	logits, probs, losses := in(N*Vp, 3), in(N*Vp, 1), in(N, 1)
	wte, wpe := in(Vp*Ch, 0.02), in(T*Ch, 0.02)
	wfc, bfc := in(4*Ch*Ch, 0.02), in(4*Ch, 0.02)
	params := in(124_000_000, 0.02)
	grads, m, v := in(124_000_000, 0.01), in(124_000_000, 0.01), c.Alloc(124_000_000)
	c.AttentionForward(y, sq1, sq2, qkv, B, T, Ch, NH)
	c.FlashAttentionForward(x, lse, qkv, B, T, Ch, NH)
	for _, op := range []struct {
		name string
		run  func()
	}{
		{"encoder-forward", func() { c.EncoderForward(x, tokens, wte, wpe, B, T, Ch) }},
		{"encoder-backward", func() { c.EncoderBackward(wte, wpe, y, tokens, B, T, Ch) }},
		{"layernorm-forward", func() { c.LayerNormForward(y, mean, rstd, x, w, bias, N, Ch) }},
		{"layernorm-backward", func() { c.LayerNormBackward(y, w, bias, x, x, w, mean, rstd, N, Ch) }},
		{"matmul-fc-forward", func() { c.MatmulForward(x4, x, wfc, bfc, N, Ch, 4*Ch) }},
		{"matmul-fc-backward", func() { c.MatmulBackward(y, wfc, bfc, x4, x, wfc, N, Ch, 4*Ch) }},
		{"attention-forward", func() { c.AttentionForward(y, sq1, sq2, qkv, B, T, Ch, NH) }},
		{"attention-backward", func() { c.AttentionBackward(dqkv, sq3, sq1, y, qkv, sq2, B, T, Ch, NH) }},
		{"flash-attention-forward", func() { c.FlashAttentionForward(x, lse, qkv, B, T, Ch, NH) }},
		{"flash-attention-backward", func() { c.FlashAttentionBackward(dqkv, delta, y, x, qkv, lse, B, T, Ch, NH) }},
		{"gelu-forward", func() { c.GeluForward(y4, x4, 4*N*Ch) }},
		{"gelu-backward", func() { c.GeluBackward(y4, x4, x4, 4*N*Ch) }},
		{"residual-forward", func() { c.ResidualForward(y, x, x, N*Ch) }},
		{"lm-head-matmul-forward", func() { c.MatmulForward(logits, x, wte, nil, N, Ch, Vp) }},
		{"lm-head-matmul-backward", func() { c.MatmulBackward(y, wte, nil, logits, x, wte, N, Ch, Vp) }},
		{"softmax-xent-forward", func() { c.SoftmaxCrossEntropyForward(losses, probs, logits, targets, N, V, Vp) }},
		{"softmax-xent-backward", func() { c.SoftmaxCrossEntropyBackward(logits, probs, targets, 1.0/N, N, V, Vp) }},
		{"softmax-xent-fused", func() { c.SoftmaxCrossEntropyFused(losses, logits, targets, 1.0/N, N, V, Vp) }},
		{"sum-squares-124M", func() { c.SumSquares(grads) }},
		{"adamw-124M", func() { c.AdamW(params, grads, m, v, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1) }},
	} {
		b.Run(op.name, func(b *testing.B) {
			op.run()
			c.CopyOut(make([]float32, 1), losses.Slice(0, 1))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				op.run()
			}
			c.CopyOut(make([]float32, 1), losses.Slice(0, 1))
			b.StopTimer()
			if err := c.Err(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/op")
		})
	}
}
