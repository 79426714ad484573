package model

import (
	"fmt"

	"github.com/skein-ml/skein/kernels"
)

// Inference is a whole model for forward passes only (evaluation,
// sampling): its parameters and one layer's activations, which every layer
// reuses, for up to B sequences of up to T tokens. Without gradients, AdamW
// moments or per-layer activations it takes about a quarter of a training
// Stage's memory plus the logits: gpt2-xl (1.56B parameters) evaluates at
// 1 x 1024 in about 6.6 GiB (less where the attention runs fused, as on
// the GPU: see NewStage). Not safe for concurrent use.
type Inference struct {
	Config Config
	B, T   int

	dev                  kernels.Device
	fused                bool // attention on the fused kernels (fusedAttention)
	params               kernels.Buffer
	wte, wpe, lnfw, lnfb kernels.Buffer
	blocks               [][numBlockTensors]kernels.Buffer

	// Activations, shared by every layer: preatt and att (B,NH,T,T) for
	// the materialized attention, lse (B,NH,T) for the fused one.
	x, res2, ln, lnMean, lnRstd     kernels.Buffer
	qkv, atty, preatt, att, attproj kernels.Buffer
	lse                             kernels.Buffer
	fch, fchGelu, fcproj            kernels.Buffer
	logits, probs, losses           kernels.Buffer
	lossHost                        []float32
	n                               int // rows (b*t) of the last Forward
}

// InferenceFloats is how many float32s NewInference allocates for model c
// at B x T (parameters and the host copy of the losses included), so a
// caller can tell whether it fits, on a device that materializes the
// attention's matrices (the CPU): an upper bound for every device.
// InferenceFloatsOn is exact for a given device.
func InferenceFloats(c Config, B, T int) int64 { return inferenceFloats(c, B, T, false) }

// InferenceFloatsOn is InferenceFloats on dev: with the fused attention
// where dev prefers it (the GPU), (B,NH,T) floats of attention rather than
// two (B,NH,T,T) matrices.
func InferenceFloatsOn(dev kernels.Device, c Config, B, T int) int64 {
	return inferenceFloats(c, B, T, fusedAttention(dev, c))
}

func inferenceFloats(c Config, B, T int, fused bool) int64 {
	C, N := int64(c.C), int64(B)*int64(T)
	att := 2 * int64(B) * int64(c.Heads) * int64(T) * int64(T) // preatt, att
	if fused {
		att = int64(B) * int64(c.Heads) * int64(T) // lse
	}
	// x, res2, ln, qkv, atty, attproj, fch, fchGelu, fcproj; ln's mean and
	// rstd; the attention's; logits, probs; losses and their host copy.
	return int64(c.NumParams()) + 17*N*C + 2*N + att + 2*N*int64(c.PaddedVocab) + 2*N
}

// NewInference allocates the whole model c on dev for forward passes of up
// to B x T tokens; its parameters are zero until Load.
func NewInference(dev kernels.Device, c Config, B, T int) (*Inference, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if B <= 0 || T <= 0 || T > c.MaxT {
		return nil, fmt.Errorf("%w: batch %dx%d (T must be in [1, %d])", ErrConfig, B, T, c.MaxT)
	}
	m := &Inference{Config: c, B: B, T: T, dev: dev, fused: fusedAttention(dev, c)}
	spec := FullSpec(c)
	tensors := Layout(c, spec)
	n := 0
	index := map[string]Tensor{}
	for _, t := range tensors {
		index[t.Name] = t
		n += t.Size()
	}
	m.params = dev.Alloc(n)
	view := func(name string) kernels.Buffer {
		t := index[name]
		return m.params.Slice(t.Offset, t.Size())
	}
	m.wte, m.wpe, m.lnfw, m.lnfb = view("wte"), view("wpe"), view("ln_f.weight"), view("ln_f.bias")
	for l := range c.Layers {
		var b [numBlockTensors]kernels.Buffer
		for i := range numBlockTensors {
			b[i] = view(fmt.Sprintf("h.%d.%s", l, blockNames[i]))
		}
		m.blocks = append(m.blocks, b)
	}
	C, N := c.C, B*T
	att := B * c.Heads * T * T
	m.x, m.res2 = dev.Alloc(N*C), dev.Alloc(N*C)
	m.ln, m.lnMean, m.lnRstd = dev.Alloc(N*C), dev.Alloc(N), dev.Alloc(N)
	m.qkv, m.atty, m.attproj = dev.Alloc(N*3*C), dev.Alloc(N*C), dev.Alloc(N*C)
	if m.fused {
		m.lse = dev.Alloc(B * c.Heads * T)
	} else {
		m.preatt, m.att = dev.Alloc(att), dev.Alloc(att)
	}
	m.fch, m.fchGelu, m.fcproj = dev.Alloc(N*4*C), dev.Alloc(N*4*C), dev.Alloc(N*C)
	m.logits, m.probs, m.losses = dev.Alloc(N*c.PaddedVocab), dev.Alloc(N*c.PaddedVocab), dev.Alloc(N)
	m.lossHost = make([]float32, N)
	if err := kernels.Err(dev); err != nil {
		return nil, fmt.Errorf("model: allocating the model for inference: %w", err)
	}
	return m, nil
}

// Load copies the parameters of ck, a checkpoint of the whole model of the
// same shape, into m.
func (m *Inference) Load(ck *Checkpoint) error {
	if !ck.Config.SameShape(m.Config) {
		return fmt.Errorf("%w: checkpoint is for model %+v, not %+v", ErrCheckpoint, ck.Config, m.Config)
	}
	if ck.Spec != FullSpec(m.Config) {
		return fmt.Errorf("%w: the checkpoint holds %s, not the whole model", ErrCheckpoint, ck.Spec.Holds())
	}
	if len(ck.Params) != m.params.Len() {
		return fmt.Errorf("%w: %d parameters, the model has %d", ErrCheckpoint, len(ck.Params), m.params.Len())
	}
	m.dev.CopyIn(m.params, ck.Params)
	return kernels.Err(m.dev)
}

// Forward runs b sequences of t tokens each (tokens, b*t ids; b <= B, t <= T)
// and scores targets (b*t ids, the next token of each position): Losses
// and Logits read the result.
func (m *Inference) Forward(tokens, targets []int32, b, t int) error {
	c := m.Config
	if b <= 0 || t <= 0 || b > m.B || t > m.T || len(tokens) != b*t || len(targets) != b*t {
		return fmt.Errorf("model: %d tokens and %d targets for a %dx%d batch (at most %dx%d)", len(tokens), len(targets), b, t, m.B, m.T)
	}
	for i := range tokens {
		if tokens[i] < 0 || int(tokens[i]) >= c.Vocab || targets[i] < 0 || int(targets[i]) >= c.Vocab {
			return fmt.Errorf("model: token or target %d outside vocabulary [0, %d)", i, c.Vocab)
		}
	}
	d, C, N := m.dev, c.C, b*t
	// The kernels check lengths against the shape: views of b*t rows.
	rows := func(buf kernels.Buffer, width int) kernels.Buffer { return buf.Slice(0, N*width) }
	x, res2, ln, attproj, atty := rows(m.x, C), rows(m.res2, C), rows(m.ln, C), rows(m.attproj, C), rows(m.atty, C)
	mean, rstd, qkv := rows(m.lnMean, 1), rows(m.lnRstd, 1), rows(m.qkv, 3*C)
	fch, fchGelu, fcproj := rows(m.fch, 4*C), rows(m.fchGelu, 4*C), rows(m.fcproj, C)
	var preatt, att, lse kernels.Buffer
	if m.fused {
		lse = m.lse.Slice(0, b*c.Heads*t)
	} else {
		natt := b * c.Heads * t * t
		preatt, att = m.preatt.Slice(0, natt), m.att.Slice(0, natt)
	}
	logits, probs, losses := rows(m.logits, c.PaddedVocab), rows(m.probs, c.PaddedVocab), rows(m.losses, 1)
	d.EncoderForward(x, tokens, m.wte, m.wpe.Slice(0, t*C), b, t, C)
	for i := range m.blocks {
		p := &m.blocks[i]
		d.LayerNormForward(ln, mean, rstd, x, p[tLn1W], p[tLn1B], N, C)
		d.MatmulForward(qkv, ln, p[tQkvW], p[tQkvB], N, C, 3*C)
		if m.fused {
			d.FlashAttentionForward(atty, lse, qkv, b, t, C, c.Heads)
		} else {
			d.AttentionForward(atty, preatt, att, qkv, b, t, C, c.Heads)
		}
		d.MatmulForward(attproj, atty, p[tAttProjW], p[tAttProjB], N, C, C)
		d.ResidualForward(res2, x, attproj, N*C)
		d.LayerNormForward(ln, mean, rstd, res2, p[tLn2W], p[tLn2B], N, C)
		d.MatmulForward(fch, ln, p[tFcW], p[tFcB], N, C, 4*C)
		d.GeluForward(fchGelu, fch, N*4*C)
		d.MatmulForward(fcproj, fchGelu, p[tFcProjW], p[tFcProjB], N, 4*C, C)
		d.ResidualForward(x, res2, fcproj, N*C)
	}
	d.LayerNormForward(ln, mean, rstd, x, m.lnfw, m.lnfb, N, C)
	d.MatmulForward(logits, ln, m.wte, nil, N, C, c.PaddedVocab)
	d.SoftmaxCrossEntropyForward(losses, probs, logits, targets, N, c.Vocab, c.PaddedVocab)
	d.CopyOut(m.lossHost[:N], losses)
	m.n = N
	return kernels.Err(d)
}

// Losses are the cross-entropy losses of the last Forward's positions (row
// by row; valid until the next Forward).
func (m *Inference) Losses() []float32 { return m.lossHost[:m.n] }

// Logits copies the logits of row i of the last Forward over the real
// vocabulary into dst (len Config.Vocab).
func (m *Inference) Logits(dst []float32, i int) error {
	if i < 0 || i >= m.n || len(dst) != m.Config.Vocab {
		return fmt.Errorf("model: logits of row %d of %d into %d values (vocabulary %d)", i, m.n, len(dst), m.Config.Vocab)
	}
	m.dev.CopyOut(dst, m.logits.Slice(i*m.Config.PaddedVocab, m.Config.Vocab))
	return kernels.Err(m.dev)
}
