package kernels

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// Every element-wise kernel on the GPU agrees with its CPU build (the same
// source). Skipped, with the driver's reason, where there is no GPU: the
// CUDA path has not run on one yet.
func TestCUDAParity(t *testing.T) {
	c, err := OpenCUDA(0)
	if errors.Is(err, ErrNoCUDA) {
		t.Skipf("no GPU to run the CUDA kernels on: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("running on %s", c.Name())
	rng := rand.New(rand.NewPCG(5, 6))
	const n = 100003
	up := func(x []float32) *GPUBuffer {
		b, err := c.Upload(x)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	down := func(b *GPUBuffer) []float32 {
		x := make([]float32, b.Len())
		if err := c.Download(x, b); err != nil {
			t.Fatal(err)
		}
		return x
	}
	inp, dout, acc := randomVec(rng, n, 2), randomVec(rng, n, 1), randomVec(rng, n, 1)
	want := make([]float32, n)
	ewiseGeluForward(want, inp)
	out := up(make([]float32, n))
	if err := c.GeluForward(out, up(inp)); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "gelu forward", down(out), want, 1e-5) // ex2.approx against libm's exp

	want = append([]float32(nil), acc...)
	ewiseGeluBackward(want, inp, dout)
	dinp := up(acc)
	if err := c.GeluBackward(dinp, up(inp), up(dout)); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "gelu backward", down(dinp), want, 1e-5)

	p, g, m, v := randomVec(rng, n, 1), randomVec(rng, n, 0.1), randomVec(rng, n, 0.01), randomVec(rng, n, 0)
	for i := range v {
		v[i] = v[i]*v[i] + 1e-4
	}
	pw, mw, vw := append([]float32(nil), p...), append([]float32(nil), m...), append([]float32(nil), v...)
	bc1, bc2 := float32(1-math.Pow(0.9, 2)), float32(1-math.Pow(0.95, 2))
	ewiseAdamW(pw, g, mw, vw, 1e-3, 0.9, 0.95, 1e-8, 0.1, bc1, bc2)
	pb, mb, vb := up(p), up(m), up(v)
	if err := c.AdamW(pb, up(g), mb, vb, 1e-3, 0.9, 0.95, 1e-8, 0.1, 2); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "adamw", down(pb), pw, 1e-6)
	closeTo(t, "adamw m", down(mb), mw, 1e-7)

	const N, C, V, Vp = 67, 128, 250, 256
	x, w, bias := randomVec(rng, N*C, 1.5), randomVec(rng, C, 1), randomVec(rng, C, 0.2)
	lo, lm, lr := make([]float32, N*C), make([]float32, N), make([]float32, N)
	ewiseLayerNormForward(lo, lm, lr, x, w, bias, N, C)
	go1, gm, gr := up(make([]float32, N*C)), up(make([]float32, N)), up(make([]float32, N))
	if err := c.LayerNormForward(go1, gm, gr, up(x), up(w), up(bias), N, C); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "layernorm forward", down(go1), lo, 1e-5)
	dy := randomVec(rng, N*C, 1)
	dx, dw, db := make([]float32, N*C), make([]float32, C), make([]float32, C)
	ewiseLayerNormBackward(dx, dw, db, dy, x, w, lm, lr, N, C)
	gdx, gdw, gdb := up(make([]float32, N*C)), up(make([]float32, C)), up(make([]float32, C))
	if err := c.LayerNormBackward(gdx, gdw, gdb, up(dy), up(x), up(w), up(lm), up(lr), N, C); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "layernorm dinp", down(gdx), dx, 1e-5)
	closeTo(t, "layernorm dweight", down(gdw), dw, 1e-4)

	logits := randomVec(rng, N*Vp, 3)
	targets := randomIDs(rng, N, V)
	losses, probs := make([]float32, N), make([]float32, N*Vp)
	ewiseSoftmaxXentForward(losses, probs, logits, targets, N, V, Vp)
	tg, err := c.UploadInt32(targets)
	if err != nil {
		t.Fatal(err)
	}
	gl, gp := up(make([]float32, N)), up(make([]float32, N*Vp))
	if err := c.SoftmaxCrossEntropyForward(gl, gp, up(logits), tg, N, V, Vp); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "softmax cross-entropy losses", down(gl), losses, 1e-5)
	closeTo(t, "softmax cross-entropy probs", down(gp), probs, 1e-5)

	const B, T = 2, 33
	wte, wpe := randomVec(rng, V*C, 1), randomVec(rng, T*C, 1)
	tokens := randomIDs(rng, B*T, 8)
	eo := make([]float32, B*T*C)
	ewiseEncoderForward(eo, tokens, wte, wpe, B, T, C)
	tk, err := c.UploadInt32(tokens)
	if err != nil {
		t.Fatal(err)
	}
	geo := up(make([]float32, B*T*C))
	if err := c.EncoderForward(geo, tk, up(wte), up(wpe), B, T, C); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "encoder forward", down(geo), eo, 0)
	edo := randomVec(rng, B*T*C, 1)
	dwte, dwpe := make([]float32, V*C), make([]float32, T*C)
	ewiseEncoderBackward(dwte, dwpe, edo, tokens, B, T, C)
	gdwte, gdwpe := up(make([]float32, V*C)), up(make([]float32, T*C))
	if err := c.EncoderBackward(gdwte, gdwpe, up(edo), tk, B, T, C); err != nil {
		t.Fatal(err)
	}
	closeTo(t, "encoder backward dwte", down(gdwte), dwte, 0)
}

// --device: cpu and auto give the CPU (auto says why, here: no driver or
// no GPU); cuda:N refuses, naming what is not built; nonsense is an error.
func TestSelectDevice(t *testing.T) {
	dev, note, err := SelectDevice("cpu", 1)
	if err != nil || note != "" || !strings.HasPrefix(dev.Name(), "cpu") {
		t.Fatalf("cpu: %v %q %v", dev, note, err)
	}
	dev, note, err = SelectDevice("auto", 1)
	if err != nil || !strings.HasPrefix(dev.Name(), "cpu") || !strings.Contains(note, "CPU") {
		t.Fatalf("auto: %v %q %v", dev, note, err)
	}
	t.Logf("auto: %s", note)
	if _, _, err := SelectDevice("cuda:0", 1); err == nil || !strings.Contains(err.Error(), "not built yet") {
		t.Fatalf("cuda:0: %v", err)
	}
	if _, _, err := SelectDevice("tpu", 1); err == nil {
		t.Fatal("tpu accepted")
	}
}
