package model

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"

	"github.com/skein-ml/skein/kernels"
)

// Stage is a contiguous slice of the model (see StageSpec) with its
// parameters, gradients, AdamW moments and activations on one device, sized
// for batches of B sequences of T tokens. The whole model is a Stage with
// FullSpec.
//
// A Stage is not safe for concurrent use.
type Stage struct {
	Config Config
	Spec   StageSpec
	B, T   int

	dev     kernels.Device
	fused   bool // attention on the fused kernels (fusedAttention)
	tensors []Tensor
	index   map[string]int

	// Flat buffers with identical layouts.
	Params, Grads, M, V kernels.Buffer
	pviews, gviews      []kernels.Buffer

	wte, wpe, lnfw, lnfb     kernels.Buffer
	dwte, dwpe, dlnfw, dlnfb kernels.Buffer
	blocks                   []block

	// Activations kept for the backward pass.
	input                    kernels.Buffer // (N,C): encoder output, or the caller's input
	lnf, lnfMean, lnfRstd    kernels.Buffer
	logits, losses           kernels.Buffer // logits hold their gradient after Forward
	preatt, dpreatt, datt    kernels.Buffer // scratch shared by all layers (materialized attention)
	delta                    kernels.Buffer // scratch of the fused attention's backward
	dresA, dresB, dresFinal  kernels.Buffer
	dln, dqkv, datty, dres2  kernels.Buffer
	dattproj, dfch, dfchgelu kernels.Buffer
	dfcproj, dlnf            kernels.Buffer
	lossHost                 []float32
	inputGrad                kernels.Buffer
	tokens                   []int32
}

type block struct {
	p, g [numBlockTensors]kernels.Buffer
	// activations; att (B,NH,T,T) for the materialized attention, lse
	// (B,NH,T) for the fused one (the other is nil)
	ln1, ln1Mean, ln1Rstd, qkv, atty, att, lse, attproj, res2 kernels.Buffer
	ln2, ln2Mean, ln2Rstd, fch, fchGelu, fcproj, res3         kernels.Buffer
}

// fusedAttention says whether model c's attention runs on dev's fused
// kernels (FlashAttentionForward/Backward: (B,NH,T) per layer instead of
// (B,NH,T,T)): where dev prefers them (kernels.PrefersFusedAttention, the
// GPU) and c's head size is within their bound.
func fusedAttention(dev kernels.Device, c Config) bool {
	return kernels.PrefersFusedAttention(dev) && c.C/c.Heads <= kernels.FlashMaxHeadSize
}

// attentionFloats is what one layer keeps of its attention for the
// backward, and the backward's scratch shared by all layers.
func attentionFloats(c Config, B, T int, fused bool) (perLayer, scratch int64) {
	rows := int64(B) * int64(c.Heads) * int64(T)
	if fused {
		return rows, rows // lse; delta
	}
	return rows * int64(T), 3 * rows * int64(T) // att; preatt, dpreatt, datt
}

// NewStage allocates a stage on dev and initializes its parameters
// deterministically from seed. A tensor's initial values depend only on
// (seed, tensor name), so every stage split of a model starts from the same
// weights as the whole model. The attention runs fused where dev prefers
// it (kernels.PrefersFusedAttention: the GPU) and the head size allows,
// keeping (B,NH,T) floats per layer rather than (B,NH,T,T); either way the
// results agree to float32 rounding.
func NewStage(dev kernels.Device, c Config, spec StageSpec, B, T int, seed uint64) (*Stage, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := spec.Validate(c); err != nil {
		return nil, err
	}
	if B <= 0 || T <= 0 || T > c.MaxT {
		return nil, fmt.Errorf("%w: batch %dx%d (T must be in [1, %d])", ErrConfig, B, T, c.MaxT)
	}
	s := &Stage{Config: c, Spec: spec, B: B, T: T, dev: dev, fused: fusedAttention(dev, c), tensors: Layout(c, spec), index: map[string]int{}}
	n := 0
	for i, t := range s.tensors {
		s.index[t.Name] = i
		n += t.Size()
	}
	s.Params, s.Grads, s.M, s.V = dev.Alloc(n), dev.Alloc(n), dev.Alloc(n), dev.Alloc(n)
	for _, t := range s.tensors {
		s.pviews = append(s.pviews, s.Params.Slice(t.Offset, t.Size()))
		s.gviews = append(s.gviews, s.Grads.Slice(t.Offset, t.Size()))
	}
	view := func(name string) (kernels.Buffer, kernels.Buffer) {
		i, ok := s.index[name]
		if !ok {
			return nil, nil
		}
		return s.pviews[i], s.gviews[i]
	}
	s.wte, s.dwte = view("wte")
	s.wpe, s.dwpe = view("wpe")
	s.lnfw, s.dlnfw = view("ln_f.weight")
	s.lnfb, s.dlnfb = view("ln_f.bias")

	C, N, NH := c.C, B*T, c.Heads
	att, rows := B*NH*T*T, B*NH*T
	for l := spec.FirstLayer; l < spec.LastLayer; l++ {
		var b block
		for i := 0; i < numBlockTensors; i++ {
			b.p[i], b.g[i] = view(fmt.Sprintf("h.%d.%s", l, blockNames[i]))
		}
		b.ln1, b.ln1Mean, b.ln1Rstd = dev.Alloc(N*C), dev.Alloc(N), dev.Alloc(N)
		b.qkv, b.atty = dev.Alloc(N*3*C), dev.Alloc(N*C)
		if s.fused {
			b.lse = dev.Alloc(rows)
		} else {
			b.att = dev.Alloc(att)
		}
		b.attproj, b.res2 = dev.Alloc(N*C), dev.Alloc(N*C)
		b.ln2, b.ln2Mean, b.ln2Rstd = dev.Alloc(N*C), dev.Alloc(N), dev.Alloc(N)
		b.fch, b.fchGelu, b.fcproj, b.res3 = dev.Alloc(N*4*C), dev.Alloc(N*4*C), dev.Alloc(N*C), dev.Alloc(N*C)
		s.blocks = append(s.blocks, b)
	}
	if spec.Embedding {
		s.input = dev.Alloc(N * C)
	} else {
		s.inputGrad = nil // set by Backward
	}
	if len(s.blocks) > 0 {
		if s.fused {
			s.delta = dev.Alloc(rows)
		} else {
			s.preatt, s.dpreatt, s.datt = dev.Alloc(att), dev.Alloc(att), dev.Alloc(att)
		}
		s.dln, s.dqkv, s.datty, s.dres2 = dev.Alloc(N*C), dev.Alloc(N*3*C), dev.Alloc(N*C), dev.Alloc(N*C)
		s.dattproj, s.dfch, s.dfchgelu, s.dfcproj = dev.Alloc(N*C), dev.Alloc(N*4*C), dev.Alloc(N*4*C), dev.Alloc(N*C)
	}
	s.dresA, s.dresB = dev.Alloc(N*C), dev.Alloc(N*C)
	if spec.Head {
		s.lnf, s.lnfMean, s.lnfRstd = dev.Alloc(N*C), dev.Alloc(N), dev.Alloc(N)
		s.logits, s.losses = dev.Alloc(N*c.PaddedVocab), dev.Alloc(N)
		s.dlnf, s.dresFinal = dev.Alloc(N*C), dev.Alloc(N*C)
		s.lossHost = make([]float32, N)
	}
	s.Init(seed)
	if err := kernels.Err(dev); err != nil {
		return nil, fmt.Errorf("model: allocating the stage: %w", err)
	}
	return s, nil
}

// ActivationFloats is how many float32s NewStage allocates for a stage's
// activations and scratch at batch B x T (parameters, gradients and AdamW
// moments, 4 x the stage's parameters, come on top), so that a caller can
// tell whether a model fits before allocating it, on a device that
// materializes the attention's (B,NH,T,T) matrices (the CPU): an upper
// bound for every device. ActivationFloatsOn is exact for a given device.
func ActivationFloats(c Config, spec StageSpec, B, T int) int64 {
	return activationFloats(c, spec, B, T, false)
}

// ActivationFloatsOn is ActivationFloats on dev: with the fused attention
// where dev prefers it (the GPU), each layer keeps (B,NH,T) floats of its
// attention rather than (B,NH,T,T), and the backward's scratch shrinks
// alike. It mirrors NewStage's allocations exactly (tested).
func ActivationFloatsOn(dev kernels.Device, c Config, spec StageSpec, B, T int) int64 {
	return activationFloats(c, spec, B, T, fusedAttention(dev, c))
}

func activationFloats(c Config, spec StageSpec, B, T int, fused bool) int64 {
	C, N := int64(c.C), int64(B)*int64(T)
	att, scratch := attentionFloats(c, B, T, fused)
	var n int64
	if layers := int64(spec.LastLayer - spec.FirstLayer); layers > 0 {
		n += layers * (18*N*C + 4*N + att) // each block's activations
		n += scratch + 16*N*C              // backward scratch shared by all blocks
	}
	if spec.Embedding {
		n += N * C
	}
	n += 2 * N * C // dresA, dresB
	if spec.Head {
		n += 3*N*C + 4*N + N*int64(c.PaddedVocab) // ln_f, logits (their gradient after Forward), losses (and their host copy)
	}
	return n
}

// Init sets every parameter from seed (normal std 0.02, residual projections
// scaled by 1/sqrt(2*layers), layernorm weights 1, biases 0) and clears the
// gradients and AdamW moments.
func (s *Stage) Init(seed uint64) {
	for i, t := range s.tensors {
		host := make([]float32, t.Size())
		std, constant := initStd(s.Config, t.Name, t.Shape)
		if std < 0 {
			for j := range host {
				host[j] = constant
			}
		} else {
			h := fnv.New64a()
			h.Write([]byte(t.Name))
			rng := rand.New(rand.NewPCG(seed, h.Sum64()))
			for j := range host {
				host[j] = float32(rng.NormFloat64() * std)
			}
		}
		s.dev.CopyIn(s.pviews[i], host)
	}
	s.dev.Zero(s.Grads)
	s.dev.Zero(s.M)
	s.dev.Zero(s.V)
}

// Device is the stage's compute device.
func (s *Stage) Device() kernels.Device { return s.dev }

// Tensors lists the stage's parameter tensors in buffer order.
func (s *Stage) Tensors() []Tensor { return s.tensors }

// NumParams is the length of the flat buffers.
func (s *Stage) NumParams() int { return s.Params.Len() }

// ParamView and GradView return the named tensor's views, or nil.
func (s *Stage) ParamView(name string) kernels.Buffer {
	if i, ok := s.index[name]; ok {
		return s.pviews[i]
	}
	return nil
}

// GradView returns the named tensor's gradient view, or nil.
func (s *Stage) GradView(name string) kernels.Buffer {
	if i, ok := s.index[name]; ok {
		return s.gviews[i]
	}
	return nil
}

// ZeroGrad clears the gradients; call it before each Backward.
func (s *Stage) ZeroGrad() { s.dev.Zero(s.Grads) }

// Forward runs the stage on one batch. A stage with the embedding takes
// tokens (B*T); otherwise it takes in, the (B,T,C) activations of the
// previous stage, which must stay unchanged until Backward returns. A stage
// with the head needs targets (B*T) and returns the mean cross-entropy loss;
// other stages return 0 and their output is Output().
func (s *Stage) Forward(tokens []int32, in kernels.Buffer, targets []int32) (float32, error) {
	c, B, T := s.Config, s.B, s.T
	C, N := c.C, B*T
	if s.Spec.Embedding {
		if err := s.checkTokens("tokens", tokens); err != nil {
			return 0, err
		}
		s.tokens = tokens
		s.dev.EncoderForward(s.input, tokens, s.wte, s.wpe, B, T, C)
	} else {
		if in == nil || in.Len() != N*C {
			return 0, fmt.Errorf("model: stage input must have %d elements", N*C)
		}
		s.input = in
	}
	if s.Spec.Head {
		if err := s.checkTokens("targets", targets); err != nil {
			return 0, err
		}
	}
	d := s.dev
	// Each residual is added in one pass with the LayerNorm that reads it
	// (ResidualLayerNormForward): the next block's ln1, or ln_f; only
	// the first block's ln1 and a stage without blocks' ln_f stand alone.
	res := s.input
	for i := range s.blocks {
		b := &s.blocks[i]
		if i == 0 {
			d.LayerNormForward(b.ln1, b.ln1Mean, b.ln1Rstd, res, b.p[tLn1W], b.p[tLn1B], N, C)
		}
		d.MatmulForward(b.qkv, b.ln1, b.p[tQkvW], b.p[tQkvB], N, C, 3*C)
		if s.fused {
			d.FlashAttentionForward(b.atty, b.lse, b.qkv, B, T, C, c.Heads)
		} else {
			d.AttentionForward(b.atty, s.preatt, b.att, b.qkv, B, T, C, c.Heads)
		}
		d.MatmulForward(b.attproj, b.atty, b.p[tAttProjW], b.p[tAttProjB], N, C, C)
		d.ResidualLayerNormForward(b.res2, b.ln2, b.ln2Mean, b.ln2Rstd, res, b.attproj, b.p[tLn2W], b.p[tLn2B], N, C)
		d.MatmulForward(b.fch, b.ln2, b.p[tFcW], b.p[tFcB], N, C, 4*C)
		d.GeluForward(b.fchGelu, b.fch, N*4*C)
		d.MatmulForward(b.fcproj, b.fchGelu, b.p[tFcProjW], b.p[tFcProjB], N, 4*C, C)
		switch {
		case i+1 < len(s.blocks):
			nb := &s.blocks[i+1]
			d.ResidualLayerNormForward(b.res3, nb.ln1, nb.ln1Mean, nb.ln1Rstd, b.res2, b.fcproj, nb.p[tLn1W], nb.p[tLn1B], N, C)
		case s.Spec.Head:
			d.ResidualLayerNormForward(b.res3, s.lnf, s.lnfMean, s.lnfRstd, b.res2, b.fcproj, s.lnfw, s.lnfb, N, C)
		default:
			d.ResidualForward(b.res3, b.res2, b.fcproj, N*C)
		}
		res = b.res3
	}
	if !s.Spec.Head {
		return 0, kernels.Err(d)
	}
	if len(s.blocks) == 0 {
		d.LayerNormForward(s.lnf, s.lnfMean, s.lnfRstd, res, s.lnfw, s.lnfb, N, C)
	}
	d.MatmulForward(s.logits, s.lnf, s.wte, nil, N, C, c.PaddedVocab)
	// The loss and, in place of the logits, their gradient for Backward:
	// one pass, no (N, Vp) probabilities.
	d.SoftmaxCrossEntropyFused(s.losses, s.logits, targets, 1/float32(N), N, c.Vocab, c.PaddedVocab)
	d.CopyOut(s.lossHost, s.losses)
	if err := kernels.Err(d); err != nil {
		return 0, err
	}
	var sum float64
	for _, l := range s.lossHost {
		sum += float64(l)
	}
	loss := float32(sum / float64(N))
	if math.IsNaN(float64(loss)) || math.IsInf(float64(loss), 0) {
		return loss, fmt.Errorf("model: loss is %v", loss)
	}
	return loss, nil
}

// checkTokens rejects a batch of the wrong size or with ids outside the
// vocabulary before any kernel indexes with them.
func (s *Stage) checkTokens(what string, toks []int32) error {
	if len(toks) != s.B*s.T {
		return fmt.Errorf("model: %d %s for a %dx%d batch", len(toks), what, s.B, s.T)
	}
	for i, tok := range toks {
		if tok < 0 || int(tok) >= s.Config.Vocab {
			return fmt.Errorf("model: %s[%d] = %d outside vocabulary [0, %d)", what, i, tok, s.Config.Vocab)
		}
	}
	return nil
}

// Output is the (B,T,C) output of the last layer after Forward (for stages
// without the head).
func (s *Stage) Output() kernels.Buffer {
	if len(s.blocks) == 0 {
		return s.input
	}
	return s.blocks[len(s.blocks)-1].res3
}

// InputGrad is the gradient with respect to the stage's input after Backward
// (for stages without the embedding).
func (s *Stage) InputGrad() kernels.Buffer { return s.inputGrad }

// Backward accumulates the gradients of the last Forward into Grads. A stage
// with the head starts from the mean loss; other stages take dout, the
// gradient of the loss with respect to Output().
func (s *Stage) Backward(dout kernels.Buffer) error {
	c, B, T := s.Config, s.B, s.T
	C, N := c.C, B*T
	d := s.dev
	var dres kernels.Buffer // gradient w.r.t. the current top of the residual stream
	top := s.input
	if len(s.blocks) > 0 {
		top = s.blocks[len(s.blocks)-1].res3
	}
	if s.Spec.Head {
		// Forward left the logits' gradient in their buffer.
		d.Zero(s.dlnf)
		d.MatmulBackward(s.dlnf, s.dwte, nil, s.logits, s.lnf, s.wte, N, C, c.PaddedVocab)
		d.Zero(s.dresFinal)
		d.LayerNormBackward(s.dresFinal, s.dlnfw, s.dlnfb, s.dlnf, top, s.lnfw, s.lnfMean, s.lnfRstd, N, C)
		dres = s.dresFinal
	} else {
		if dout == nil || dout.Len() != N*C {
			return fmt.Errorf("model: stage output gradient must have %d elements", N*C)
		}
		dres = dout
	}
	bufs := [2]kernels.Buffer{s.dresA, s.dresB}
	for i := len(s.blocks) - 1; i >= 0; i-- {
		b := &s.blocks[i]
		in := s.input
		if i > 0 {
			in = s.blocks[i-1].res3
		}
		dprev := bufs[i%2] // gradient w.r.t. this block's input; never aliases dres
		d.Zero(dprev)
		d.Zero(s.dres2)
		d.Zero(s.dfcproj)
		d.ResidualBackward(s.dres2, s.dfcproj, dres, N*C)
		d.Zero(s.dfchgelu)
		d.MatmulBackward(s.dfchgelu, b.g[tFcProjW], b.g[tFcProjB], s.dfcproj, b.fchGelu, b.p[tFcProjW], N, 4*C, C)
		d.Zero(s.dfch)
		d.GeluBackward(s.dfch, b.fch, s.dfchgelu, N*4*C)
		d.Zero(s.dln)
		d.MatmulBackward(s.dln, b.g[tFcW], b.g[tFcB], s.dfch, b.ln2, b.p[tFcW], N, C, 4*C)
		d.LayerNormBackward(s.dres2, b.g[tLn2W], b.g[tLn2B], s.dln, b.res2, b.p[tLn2W], b.ln2Mean, b.ln2Rstd, N, C)
		d.Zero(s.dattproj)
		d.ResidualBackward(dprev, s.dattproj, s.dres2, N*C)
		d.Zero(s.datty)
		d.MatmulBackward(s.datty, b.g[tAttProjW], b.g[tAttProjB], s.dattproj, b.atty, b.p[tAttProjW], N, C, C)
		d.Zero(s.dqkv)
		if s.fused {
			d.FlashAttentionBackward(s.dqkv, s.delta, s.datty, b.atty, b.qkv, b.lse, B, T, C, c.Heads)
		} else {
			d.AttentionBackward(s.dqkv, s.dpreatt, s.datt, s.datty, b.qkv, b.att, B, T, C, c.Heads)
		}
		d.Zero(s.dln)
		d.MatmulBackward(s.dln, b.g[tQkvW], b.g[tQkvB], s.dqkv, b.ln1, b.p[tQkvW], N, C, 3*C)
		d.LayerNormBackward(dprev, b.g[tLn1W], b.g[tLn1B], s.dln, in, b.p[tLn1W], b.ln1Mean, b.ln1Rstd, N, C)
		dres = dprev
	}
	if s.Spec.Embedding {
		d.EncoderBackward(s.dwte, s.dwpe, dres, s.tokens, B, T, C)
		s.inputGrad = nil
	} else {
		s.inputGrad = dres
	}
	return kernels.Err(d)
}
