package kernels

import (
	"bytes"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

func randomVec(rng *rand.Rand, n int, scale float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = scale * float32(rng.NormFloat64())
	}
	return x
}

// randomIDs is n token ids (or targets) below below.
func randomIDs(rng *rand.Rand, n, below int) []int32 {
	x := make([]int32, n)
	for i := range x {
		x[i] = int32(rng.IntN(below))
	}
	return x
}

// closeTo reports the first element where got and want differ by more
// than tol relative to max(1, |want|).
func closeTo(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	worst := 0.0
	for i := range want {
		d := math.Abs(float64(got[i]-want[i])) / math.Max(1, math.Abs(float64(want[i])))
		if d > tol || math.IsNaN(float64(got[i])) {
			t.Fatalf("%s: element %d is %v, want %v", what, i, got[i], want[i])
		}
		worst = max(worst, d)
	}
	t.Logf("%s: largest difference %.2g (relative to max(1, |x|)), %d elements", what, worst, len(want))
}

// The element-wise kernels written once for CPU and GPU (ewise_kernels.h),
// in their CPU build, agree with the CPU backend on every kernel (its
// exp is a polynomial, libm's is exact: a few ulps apart), and GELU's
// backward is the derivative of its forward (central differences).
func TestEwiseMatchesCPU(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	dev := NewCPU(1)
	const n = 4099
	host := func(b Buffer) []float32 { x := make([]float32, b.Len()); dev.CopyOut(x, b); return x }
	buf := func(x []float32) Buffer { b := dev.Alloc(len(x)); dev.CopyIn(b, x); return b }

	inp, dout := randomVec(rng, n, 2), randomVec(rng, n, 1)
	out := make([]float32, n)
	ewiseGeluForward(out, inp)
	ob := dev.Alloc(n)
	dev.GeluForward(ob, buf(inp), n)
	closeTo(t, "gelu forward", out, host(ob), 1e-5)

	dinp := randomVec(rng, n, 1)
	db := buf(dinp)
	ewiseGeluBackward(dinp, inp, dout)
	dev.GeluBackward(db, buf(inp), buf(dout), n)
	closeTo(t, "gelu backward", dinp, host(db), 1e-5)

	// The backward is the forward's derivative.
	for _, i := range []int{0, 17, 1000, 4098} {
		x := float64(inp[i])
		const h = 1e-3
		f := func(v float64) float64 {
			o := []float32{0}
			ewiseGeluForward(o, []float32{float32(v)})
			return float64(o[0])
		}
		want := (f(x+h) - f(x-h)) / (2 * h)
		g := []float32{0}
		ewiseGeluBackward(g, []float32{float32(x)}, []float32{1})
		if math.Abs(float64(g[0])-want) > 2e-3 {
			t.Fatalf("gelu'(%v) = %v, central difference %v", x, g[0], want)
		}
	}

	a, b := randomVec(rng, n, 1), randomVec(rng, n, 1)
	ewiseResidualForward(out, a, b)
	rb := dev.Alloc(n)
	dev.ResidualForward(rb, buf(a), buf(b), n)
	closeTo(t, "residual forward", out, host(rb), 0)

	da, dbb := randomVec(rng, n, 1), randomVec(rng, n, 1)
	dab, dbbb := buf(da), buf(dbb)
	ewiseResidualBackward(da, dbb, dout)
	dev.ResidualBackward(dab, dbbb, buf(dout), n)
	closeTo(t, "residual backward da", da, host(dab), 0)
	closeTo(t, "residual backward db", dbb, host(dbbb), 0)

	x := randomVec(rng, n, 1)
	xb := buf(x)
	ewiseScale(x, 0.37)
	dev.Scale(xb, 0.37)
	closeTo(t, "scale", x, host(xb), 0)

	p, g, m, v := randomVec(rng, n, 1), randomVec(rng, n, 0.1), randomVec(rng, n, 0.01), randomVec(rng, n, 0)
	for i := range v {
		v[i] = v[i]*v[i] + 1e-4
	}
	pb, gb, mb, vb := buf(p), buf(g), buf(m), buf(v)
	const lr, b1, b2, eps, wd, step = 1e-3, 0.9, 0.95, 1e-8, 0.1, 3
	bc1, bc2 := float32(1-math.Pow(b1, step)), float32(1-math.Pow(b2, step))
	ewiseAdamW(p, g, m, v, lr, b1, b2, eps, wd, bc1, bc2)
	dev.AdamW(pb, gb, mb, vb, lr, b1, b2, eps, wd, step)
	closeTo(t, "adamw params", p, host(pb), 1e-6)
	closeTo(t, "adamw m", m, host(mb), 1e-7)
	closeTo(t, "adamw v", v, host(vb), 1e-7)
}

// The embedded PTX is what clang makes of cuda/kernels.cu now (`go generate
// ./kernels` after changing ewise_kernels.h). Skipped without clang (the
// test command installs it).
func TestPTXUpToDate(t *testing.T) {
	clang, err := exec.LookPath("clang")
	if err != nil {
		t.Skip("clang is not installed (apt-get install clang): the PTX cannot be regenerated here")
	}
	out := filepath.Join(t.TempDir(), "kernels.ptx")
	cmd := exec.Command(clang, append(ptxFlags, "-o", out, "cuda/kernels.cu")...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("clang: %v\n%s", err, b)
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, ewisePTX) {
		t.Fatal("kernels/cuda/kernels.ptx is stale: run go generate ./kernels")
	}
}

// The row-wise kernels' CPU build against the CPU backend: layernorm
// forward and backward, softmax cross-entropy forward and backward; and
// layernorm's input gradient against central differences of its forward.
func TestRowwiseMatchesCPU(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	dev := NewCPU(1)
	const N, C, V, Vp = 37, 96, 250, 256
	host := func(b Buffer) []float32 { x := make([]float32, b.Len()); dev.CopyOut(x, b); return x }
	buf := func(x []float32) Buffer { b := dev.Alloc(len(x)); dev.CopyIn(b, x); return b }

	inp, w, b := randomVec(rng, N*C, 1.5), randomVec(rng, C, 1), randomVec(rng, C, 0.2)
	out, mean, rstd := make([]float32, N*C), make([]float32, N), make([]float32, N)
	ewiseLayerNormForward(out, mean, rstd, inp, w, b, N, C)
	ob, mb, rb := dev.Alloc(N*C), dev.Alloc(N), dev.Alloc(N)
	dev.LayerNormForward(ob, mb, rb, buf(inp), buf(w), buf(b), N, C)
	closeTo(t, "layernorm forward", out, host(ob), 1e-5)
	closeTo(t, "layernorm mean", mean, host(mb), 1e-6)
	closeTo(t, "layernorm rstd", rstd, host(rb), 1e-5)

	dout := randomVec(rng, N*C, 1)
	dinp, dw, db := randomVec(rng, N*C, 0.1), randomVec(rng, C, 0.1), randomVec(rng, C, 0.1)
	dinpB, dwB, dbB := buf(dinp), buf(dw), buf(db)
	ewiseLayerNormBackward(dinp, dw, db, dout, inp, w, mean, rstd, N, C)
	dev.LayerNormBackward(dinpB, dwB, dbB, buf(dout), buf(inp), buf(w), buf(mean), buf(rstd), N, C)
	closeTo(t, "layernorm backward dinp", dinp, host(dinpB), 1e-5)
	closeTo(t, "layernorm backward dweight", dw, host(dwB), 1e-4)
	closeTo(t, "layernorm backward dbias", db, host(dbB), 1e-4)

	// d(sum(out * dout))/d inp[k], by central differences, for a few k.
	loss := func(x []float32) float64 {
		o, m, r := make([]float32, N*C), make([]float32, N), make([]float32, N)
		ewiseLayerNormForward(o, m, r, x, w, b, N, C)
		var s float64
		for i := range o {
			s += float64(o[i]) * float64(dout[i])
		}
		return s
	}
	grad := make([]float32, N*C)
	ewiseLayerNormBackward(grad, make([]float32, C), make([]float32, C), dout, inp, w, mean, rstd, N, C)
	for _, k := range []int{0, 95, 1000, N*C - 1} {
		x := append([]float32(nil), inp...)
		const h = 1e-2
		x[k] += h
		up := loss(x)
		x[k] -= 2 * h
		want := (up - loss(x)) / (2 * h)
		if math.Abs(float64(grad[k])-want) > 2e-2*math.Max(1, math.Abs(want)) {
			t.Fatalf("layernorm dinp[%d] = %v, central difference %v", k, grad[k], want)
		}
	}

	logits := randomVec(rng, N*Vp, 3)
	targets := randomIDs(rng, N, V)
	losses, probs := make([]float32, N), make([]float32, N*Vp)
	ewiseSoftmaxXentForward(losses, probs, logits, targets, N, V, Vp)
	lb, pb := dev.Alloc(N), dev.Alloc(N*Vp)
	dev.SoftmaxCrossEntropyForward(lb, pb, buf(logits), targets, N, V, Vp)
	closeTo(t, "softmax cross-entropy losses", losses, host(lb), 1e-5)
	closeTo(t, "softmax cross-entropy probs", probs, host(pb), 1e-6)

	dlogits := randomVec(rng, N*Vp, 0.1)
	dlB := buf(dlogits)
	ewiseSoftmaxXentBackward(dlogits, probs, targets, 1.0/N, N, V, Vp)
	dev.SoftmaxCrossEntropyBackward(dlB, buf(probs), targets, 1.0/N, N, V, Vp)
	closeTo(t, "softmax cross-entropy backward", dlogits, host(dlB), 1e-6)
}

// The encoder's CPU build against the CPU backend: forward bit for bit,
// backward summed in the same row order, with repeated tokens.
func TestEncoderMatchesCPU(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	dev := NewCPU(1)
	const B, T, C, V, maxT = 3, 17, 64, 40, 32
	host := func(b Buffer) []float32 { x := make([]float32, b.Len()); dev.CopyOut(x, b); return x }
	buf := func(x []float32) Buffer { b := dev.Alloc(len(x)); dev.CopyIn(b, x); return b }
	wte, wpe := randomVec(rng, V*C, 1), randomVec(rng, maxT*C, 1)
	tokens := randomIDs(rng, B*T, 8) // few tokens: rows share them
	out := make([]float32, B*T*C)
	ewiseEncoderForward(out, tokens, wte, wpe, B, T, C)
	ob := dev.Alloc(B * T * C)
	dev.EncoderForward(ob, tokens, buf(wte), buf(wpe), B, T, C)
	closeTo(t, "encoder forward", out, host(ob), 0)
	dout := randomVec(rng, B*T*C, 1)
	dwte, dwpe := randomVec(rng, V*C, 0.1), randomVec(rng, maxT*C, 0.1)
	dwteB, dwpeB := buf(dwte), buf(dwpe)
	ewiseEncoderBackward(dwte, dwpe, dout, tokens, B, T, C)
	dev.EncoderBackward(dwteB, dwpeB, buf(dout), tokens, B, T, C)
	closeTo(t, "encoder backward dwte", dwte, host(dwteB), 0)
	closeTo(t, "encoder backward dwpe", dwpe, host(dwpeB), 0)
}
