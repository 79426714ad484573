package model

import (
	"math"
	"testing"

	"github.com/skein-ml/skein/kernels"
)

// The forward-only model computes the training stage's losses, position by
// position, from the same parameters; a shorter window (t < T) gives the
// losses of those positions (attention is causal), so evaluation and
// sampling need no padding.
func TestInferenceMatchesStage(t *testing.T) {
	const B, T = 2, 6
	dev := kernels.NewCPU(1)
	s, err := NewStage(dev, micro, FullSpec(micro), B, T, 1)
	if err != nil {
		t.Fatal(err)
	}
	randomize(s, 7)
	in, tg := microBatch(B, T, 9)
	if _, err := s.Forward(in, nil, tg); err != nil {
		t.Fatal(err)
	}
	want := append([]float32(nil), s.lossHost...)

	m, err := NewInference(dev, micro, B, T)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Load(s.Snapshot(0, nil)); err != nil {
		t.Fatal(err)
	}
	if err := m.Forward(in, tg, B, T); err != nil {
		t.Fatal(err)
	}
	for i, l := range m.Losses() {
		if math.Abs(float64(l-want[i])) > 1e-6 {
			t.Fatalf("position %d: loss %v, the training stage's %v", i, l, want[i])
		}
	}
	// Sequence 1's first 4 positions alone.
	if err := m.Forward(in[T:T+4], tg[T:T+4], 1, 4); err != nil {
		t.Fatal(err)
	}
	for i, l := range m.Losses() {
		if math.Abs(float64(l-want[T+i])) > 1e-6 {
			t.Fatalf("short window, position %d: loss %v, want %v", i, l, want[T+i])
		}
	}
	// The logits give the loss: -log softmax(logits)[target].
	logits := make([]float32, micro.Vocab)
	if err := m.Logits(logits, 2); err != nil {
		t.Fatal(err)
	}
	var mx, sum float64 = math.Inf(-1), 0
	for _, v := range logits {
		mx = math.Max(mx, float64(v))
	}
	for _, v := range logits {
		sum += math.Exp(float64(v) - mx)
	}
	if got := mx + math.Log(sum) - float64(logits[tg[T+2]]); math.Abs(got-float64(want[T+2])) > 1e-5 {
		t.Fatalf("loss from the logits %v, want %v", got, want[T+2])
	}
	for _, bad := range []struct {
		tok, tg []int32
		b, t    int
	}{
		{in[:3], tg[:3], 1, 4},
		{in, tg, B + 1, 4},
		{[]int32{11}, []int32{0}, 1, 1},
		{[]int32{0}, []int32{-1}, 1, 1},
	} {
		if err := m.Forward(bad.tok, bad.tg, bad.b, bad.t); err == nil {
			t.Errorf("%v/%v as %dx%d accepted", bad.tok, bad.tg, bad.b, bad.t)
		}
	}
	if err := m.Logits(logits, 9); err == nil {
		t.Error("a row past the last forward accepted")
	}
}

// InferenceFloats is what NewInference allocates.
func TestInferenceFloatsMatchesNewInference(t *testing.T) {
	dev := &countingDevice{Device: kernels.NewCPU(1)}
	m, err := NewInference(dev, micro, 3, 7)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := InferenceFloats(micro, 3, 7), dev.n+int64(len(m.lossHost)); got != want {
		t.Fatalf("InferenceFloats %d, NewInference allocated %d", got, want)
	}
	// gpt2-xl evaluates at 1 x 1024 in under 7 GiB.
	xl, _ := Preset("gpt2-xl")
	if gib := float64(4*InferenceFloats(xl, 1, 1024)) / (1 << 30); gib > 7 {
		t.Fatalf("gpt2-xl at 1 x 1024: %.2f GiB", gib)
	}
}
