package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/skein-ml/skein/kernels"
)

// fusedCPU is the CPU made to prefer the fused attention, as the GPU does:
// the model takes the path it takes on CUDA, on the kernels' CPU build of
// the same source.
type fusedCPU struct{ *kernels.CPU }

func (fusedCPU) PrefersFusedAttention() bool { return true }

// randomTokens is n ids below vocab.
func randomTokens(rng *rand.Rand, n, vocab int) []int32 {
	x := make([]int32, n)
	for i := range x {
		x[i] = int32(rng.IntN(vocab))
	}
	return x
}

// relL2 is ||got - want|| / ||want||.
func relL2(got, want []float32) float64 {
	var d, w float64
	for i := range want {
		e := float64(got[i]) - float64(want[i])
		d += e * e
		w += float64(want[i]) * float64(want[i])
	}
	if w == 0 {
		return math.Sqrt(d)
	}
	return math.Sqrt(d / w)
}

// Training the tiny preset a few steps (forward, backward, AdamW) with the
// fused attention forced on the CPU gives the materialized path's losses
// and gradients: the same model, to float32 rounding. Each step starts
// both from the materialized run's parameters (AdamW's first steps move a
// parameter by about lr whatever the size of its gradient, so a gradient
// near 0 that rounds differently would make the two runs drift apart
// without either being wrong); the fused run's own parameters, trained
// alongside, are checked to stay close.
func TestFusedAttentionTrainsLikeMaterialized(t *testing.T) {
	c, err := Preset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	const B, T, steps = 2, 45, 4 // T: no multiple of 16 or 32
	cpu := kernels.NewCPU(2)
	devs := map[bool]kernels.Device{false: cpu, true: fusedCPU{cpu}}
	stages := map[bool]*Stage{}
	for fused, dev := range devs {
		s, err := NewStage(dev, c, FullSpec(c), B, T, 11)
		if err != nil {
			t.Fatal(err)
		}
		if s.fused != fused {
			t.Fatalf("stage on %T: fused attention %v, want %v", dev, s.fused, fused)
		}
		stages[fused] = s
	}
	host := func(b kernels.Buffer) []float32 { h := make([]float32, b.Len()); cpu.CopyOut(h, b); return h }
	rng := rand.New(rand.NewPCG(12, 13))
	for step := 1; step <= steps; step++ {
		in, tg := randomTokens(rng, B*T, c.Vocab), randomTokens(rng, B*T, c.Vocab)
		var loss [2]float32
		for i, fused := range []bool{false, true} {
			s := stages[fused]
			l, err := s.Forward(in, nil, tg)
			if err != nil {
				t.Fatal(err)
			}
			s.ZeroGrad()
			if err := s.Backward(nil); err != nil {
				t.Fatal(err)
			}
			loss[i] = l
		}
		if d := math.Abs(float64(loss[1] - loss[0])); d > 1e-5 {
			t.Fatalf("step %d: loss %v fused, %v materialized", step, loss[1], loss[0])
		}
		worst, worstName := 0.0, ""
		for _, ts := range stages[false].Tensors() {
			e := relL2(host(stages[true].GradView(ts.Name)), host(stages[false].GradView(ts.Name)))
			if e > worst || math.IsNaN(e) {
				worst, worstName = e, ts.Name
			}
			if !(e <= 1e-5) {
				t.Errorf("step %d: %s's gradient differs by %.3g (relative, 2-norm)", step, ts.Name, e)
			}
		}
		t.Logf("step %d: loss %.6f (fused %.6f); largest gradient difference %.2g (%s)", step, loss[0], loss[1], worst, worstName)
		for _, s := range stages {
			cpu.AdamW(s.Params, s.Grads, s.M, s.V, 1e-3, 0.9, 0.95, 1e-8, 0.1, step)
		}
		own := host(stages[true].Params)
		p := host(stages[false].Params)
		if e := relL2(own, p); !(e <= 1e-4) {
			t.Errorf("step %d: the fused run's parameters differ by %.3g (relative, 2-norm)", step, e)
		}
		cpu.CopyIn(stages[true].Params, p)
	}
}

// The fused path's forward-only model scores like the fused training
// stage, and both like the materialized stage.
func TestFusedInferenceMatchesStage(t *testing.T) {
	const B, T = 2, 6
	cpu := kernels.NewCPU(1)
	want := map[bool][]float32{}
	var ck *Checkpoint
	in, tg := microBatch(B, T, 9)
	for _, dev := range []kernels.Device{cpu, fusedCPU{cpu}} {
		s, err := NewStage(dev, micro, FullSpec(micro), B, T, 1)
		if err != nil {
			t.Fatal(err)
		}
		randomize(s, 7)
		if _, err := s.Forward(in, nil, tg); err != nil {
			t.Fatal(err)
		}
		want[s.fused] = append([]float32(nil), s.lossHost...)
		ck = s.Snapshot(0, nil)
	}
	m, err := NewInference(fusedCPU{cpu}, micro, B, T)
	if err != nil {
		t.Fatal(err)
	}
	if !m.fused {
		t.Fatal("inference on a device that prefers the fused attention does not use it")
	}
	if err := m.Load(ck); err != nil {
		t.Fatal(err)
	}
	if err := m.Forward(in, tg, B, T); err != nil {
		t.Fatal(err)
	}
	for i, l := range m.Losses() {
		if l != want[true][i] || math.Abs(float64(l-want[false][i])) > 1e-6 {
			t.Fatalf("position %d: loss %v; fused stage %v, materialized stage %v", i, l, want[true][i], want[false][i])
		}
	}
	if err := m.Forward(in[T:T+4], tg[T:T+4], 1, 4); err != nil { // a shorter window
		t.Fatal(err)
	}
	for i, l := range m.Losses() {
		if math.Abs(float64(l-want[false][T+i])) > 1e-6 {
			t.Fatalf("short window, position %d: loss %v, want %v", i, l, want[false][T+i])
		}
	}
}

// The fused path's memory estimates are exact too, and smaller: a layer
// keeps (B,NH,T) floats of attention, not (B,NH,T,T).
func TestFusedActivationFloats(t *testing.T) {
	c := micro
	c.Layers = 3
	const B, T = 3, 7
	for _, spec := range []StageSpec{FullSpec(c), {FirstLayer: 1, LastLayer: 2}, {FirstLayer: 2, LastLayer: 3, Head: true}} {
		dev := &countingDevice{Device: fusedCPU{kernels.NewCPU(1)}}
		s, err := NewStage(dev, c, spec, B, T, 1)
		if err != nil {
			t.Fatal(err)
		}
		got, want := ActivationFloatsOn(dev, c, spec, B, T), dev.n-4*int64(s.NumParams())+int64(len(s.lossHost))
		if !s.fused || got != want {
			t.Errorf("%+v: fused %v, ActivationFloatsOn %d, NewStage allocated %d", spec, s.fused, got, want)
		}
		layers := int64(spec.LastLayer - spec.FirstLayer)
		rows := int64(B * c.Heads * T)
		if saved := ActivationFloats(c, spec, B, T) - got; saved != (layers+3)*rows*T-layers*rows-rows {
			t.Errorf("%+v: the fused attention saves %d floats", spec, saved)
		}
	}
	dev := &countingDevice{Device: fusedCPU{kernels.NewCPU(1)}}
	m, err := NewInference(dev, micro, B, T)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := InferenceFloatsOn(dev, micro, B, T), dev.n+int64(len(m.lossHost)); !m.fused || got != want {
		t.Fatalf("fused %v: InferenceFloatsOn %d, NewInference allocated %d", m.fused, got, want)
	}
	// A head larger than the fused kernels take keeps the materialized path.
	big := Config{Name: "big-head", Vocab: 11, PaddedVocab: 64, MaxT: 4, C: 2 * (kernels.FlashMaxHeadSize + 64), Layers: 1, Heads: 2}
	if ActivationFloatsOn(dev, big, FullSpec(big), 1, 4) != ActivationFloats(big, FullSpec(big), 1, 4) {
		t.Error("a head over FlashMaxHeadSize is estimated on the fused path")
	}
}
