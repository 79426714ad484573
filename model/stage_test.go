package model

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/skein-ml/skein/kernels"
)

var micro = Config{Name: "micro", Vocab: 11, PaddedVocab: 16, MaxT: 8, C: 8, Layers: 2, Heads: 2}

func microBatch(B, T int, seed uint64) (in, tg []int32) {
	rng := rand.New(rand.NewPCG(seed, 0))
	in, tg = make([]int32, B*T), make([]int32, B*T)
	for i := range in {
		in[i], tg[i] = int32(rng.IntN(micro.Vocab)), int32(rng.IntN(micro.Vocab))
	}
	return in, tg
}

// randomize replaces the GPT-2 init (whose tiny weights give tiny gradients)
// by O(0.3) values everywhere so every parameter's gradient is exercised.
func randomize(s *Stage, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 1))
	p := make([]float32, s.NumParams())
	for i := range p {
		p[i] = float32(rng.NormFloat64() * 0.3)
	}
	s.Device().CopyIn(s.Params, p)
	return p
}

// TestWholeModelGradient checks every parameter's analytic gradient of the
// micro model against a central finite difference of the loss (float32
// forward, h = 1e-2, losses summed in float64). Tolerance: |fd - an| <=
// 2e-3 + 3e-2*|fd| per parameter, and ||fd - an|| / ||fd|| < 1e-2 overall.
func TestWholeModelGradient(t *testing.T) {
	const B, T, h = 2, 5, 1e-2
	dev := kernels.NewCPU(1)
	s, err := NewStage(dev, micro, FullSpec(micro), B, T, 1)
	if err != nil {
		t.Fatal(err)
	}
	p := randomize(s, 3)
	in, tg := microBatch(B, T, 5)
	if _, err := s.Forward(in, nil, tg); err != nil {
		t.Fatal(err)
	}
	s.ZeroGrad()
	if err := s.Backward(nil); err != nil {
		t.Fatal(err)
	}
	an := make([]float32, s.NumParams())
	dev.CopyOut(an, s.Grads)
	loss := func() float64 {
		l, err := s.Forward(in, nil, tg)
		if err != nil {
			t.Fatal(err)
		}
		return float64(l)
	}
	var diff2, fd2 float64
	bad := 0
	for _, ts := range s.Tensors() {
		for i := ts.Offset; i < ts.Offset+ts.Size(); i++ {
			if ts.Name == "wte" && i-ts.Offset >= micro.Vocab*micro.C {
				continue // padding rows: never used, gradient 0
			}
			orig := p[i]
			p[i] = orig + h
			dev.CopyIn(s.Params, p)
			lp := loss()
			p[i] = orig - h
			dev.CopyIn(s.Params, p)
			lm := loss()
			p[i] = orig
			fd := (lp - lm) / (2 * h)
			d := math.Abs(fd - float64(an[i]))
			diff2 += d * d
			fd2 += fd * fd
			if d > 2e-3+3e-2*math.Abs(fd) {
				bad++
				if bad < 10 {
					t.Errorf("%s[%d]: analytic %.6f, finite difference %.6f", ts.Name, i-ts.Offset, an[i], fd)
				}
			}
		}
	}
	dev.CopyIn(s.Params, p)
	if rel := math.Sqrt(diff2 / fd2); rel > 1e-2 {
		t.Errorf("relative gradient error %.2e, want < 1e-2", rel)
	} else {
		t.Logf("relative gradient error %.2e over %d parameters", rel, s.NumParams())
	}
}

// TestStagesComposeToWholeModel splits the micro model into three stages
// (embedding+layer 0, layer 1 alone... as a pipeline would) and checks that
// chaining their forward and backward reproduces the whole model's loss and
// gradients.
func TestStagesComposeToWholeModel(t *testing.T) {
	const B, T = 2, 6
	c := micro
	c.Layers = 3
	dev := kernels.NewCPU(2)
	whole, err := NewStage(dev, c, FullSpec(c), B, T, 9)
	if err != nil {
		t.Fatal(err)
	}
	specs := []StageSpec{{0, 1, true, false}, {1, 2, false, false}, {2, 3, false, true}}
	var stages []*Stage
	for _, sp := range specs {
		st, err := NewStage(dev, c, sp, B, T, 9) // same seed: same initial tensors
		if err != nil {
			t.Fatal(err)
		}
		stages = append(stages, st)
	}
	in, tg := microBatch(B, T, 4)
	want, err := whole.Forward(in, nil, tg)
	if err != nil {
		t.Fatal(err)
	}
	whole.ZeroGrad()
	whole.Backward(nil)

	if _, err := stages[0].Forward(in, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := stages[1].Forward(nil, stages[0].Output(), nil); err != nil {
		t.Fatal(err)
	}
	got, err := stages[2].Forward(nil, stages[1].Output(), tg)
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(float64(got-want)) > 1e-6 {
		t.Fatalf("pipelined loss %v, whole model %v", got, want)
	}
	for _, st := range stages {
		st.ZeroGrad()
	}
	if err := stages[2].Backward(nil); err != nil {
		t.Fatal(err)
	}
	if err := stages[1].Backward(stages[2].InputGrad()); err != nil {
		t.Fatal(err)
	}
	if err := stages[0].Backward(stages[1].InputGrad()); err != nil {
		t.Fatal(err)
	}
	host := func(b kernels.Buffer) []float32 { h := make([]float32, b.Len()); dev.CopyOut(h, b); return h }
	for _, ts := range whole.Tensors() {
		w := host(whole.GradView(ts.Name))
		sum := make([]float32, len(w))
		for _, st := range stages {
			if g := st.GradView(ts.Name); g != nil { // the tied wte gradient is split over two stages
				for i, v := range host(g) {
					sum[i] += v
				}
			}
		}
		for i := range w {
			if math.Abs(float64(w[i]-sum[i])) > 1e-5+1e-4*math.Abs(float64(w[i])) {
				t.Fatalf("%s[%d]: stages %v, whole %v", ts.Name, i, sum[i], w[i])
			}
		}
	}
}

func TestForwardRejectsBadTokens(t *testing.T) {
	s, err := NewStage(kernels.NewCPU(1), micro, FullSpec(micro), 1, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Forward([]int32{1, 2, 3, 11}, nil, []int32{0, 0, 0, 0}); err == nil {
		t.Error("token 11 >= vocab 11 accepted")
	}
	if _, err := s.Forward([]int32{1, 2, 3}, nil, []int32{0, 0, 0, 0}); err == nil {
		t.Error("short batch accepted")
	}
	if _, err := s.Forward([]int32{1, 2, 3, 4}, nil, []int32{0, -1, 0, 0}); err == nil {
		t.Error("negative target accepted")
	}
}

// countingDevice counts the float32s allocated through it.
type countingDevice struct {
	kernels.Device
	n int64
}

func (d *countingDevice) Alloc(n int) kernels.Buffer {
	d.n += int64(n)
	return d.Device.Alloc(n)
}

// PrefersFusedAttention passes on the wrapped device's preference, which
// embedding the interface would hide.
func (d *countingDevice) PrefersFusedAttention() bool { return kernels.PrefersFusedAttention(d.Device) }

// ActivationFloats is what NewStage allocates beyond the four parameter
// buffers, for any stage split.
func TestActivationFloatsMatchesNewStage(t *testing.T) {
	c := micro
	c.Layers = 3
	for _, spec := range []StageSpec{
		FullSpec(c),
		{FirstLayer: 0, LastLayer: 1, Embedding: true},
		{FirstLayer: 1, LastLayer: 2},
		{FirstLayer: 2, LastLayer: 3, Head: true},
	} {
		dev := &countingDevice{Device: kernels.NewCPU(1)}
		s, err := NewStage(dev, c, spec, 3, 7, 1)
		if err != nil {
			t.Fatal(err)
		}
		host := int64(len(s.lossHost)) // the one activation kept in Go memory
		if got, want := ActivationFloats(c, spec, 3, 7), dev.n-4*int64(s.NumParams())+host; got != want {
			t.Errorf("%+v: ActivationFloats %d, NewStage allocated %d", spec, got, want)
		}
	}
}
