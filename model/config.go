// Package model owns the network: GPT-2-style decoder configurations, the flat
// parameter layout with named views, forward and backward passes built from
// kernels, stage slices for pipelines, initialization and checkpoints in the
// safetensors format.
//
// Parameters, gradients and the two AdamW moments each live in one flat
// buffer with identical offsets, so optimizers and codecs see one []float32.
// The layout is layer-major (embedding, then each block's tensors, then the
// final layernorm) so that a contiguous range of layers is a contiguous range
// of the buffer.
//
// model must not touch the network, the outer optimizers or the data
// pipeline; it computes only through a kernels.Device.
package model

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Config describes a GPT-2-style decoder.
type Config struct {
	Name        string `json:"name"`
	Vocab       int    `json:"vocab"`        // V: real vocabulary size
	PaddedVocab int    `json:"padded_vocab"` // Vp: rows of wte, a multiple of 64 (>= Vocab)
	MaxT        int    `json:"max_t"`        // context length
	C           int    `json:"channels"`
	Layers      int    `json:"layers"`
	Heads       int    `json:"heads"`
}

// ErrConfig is returned (wrapped) for an invalid configuration.
var ErrConfig = errors.New("model: invalid config")

// The presets: two toy byte-level models, and OpenAI's GPT-2 family with
// Hugging Face's configurations (n_positions 1024, the vocabulary of the
// gpt2 tokenizer padded to a multiple of 64 rows for the kernels; export
// strips the padding).
var presets = map[string]Config{
	"tiny":        {Name: "tiny", Vocab: 256, PaddedVocab: 256, MaxT: 128, C: 128, Layers: 4, Heads: 4},
	"small":       {Name: "small", Vocab: 256, PaddedVocab: 256, MaxT: 256, C: 384, Layers: 6, Heads: 6},
	"gpt2":        {Name: "gpt2", Vocab: 50257, PaddedVocab: 50304, MaxT: 1024, C: 768, Layers: 12, Heads: 12},
	"gpt2-medium": {Name: "gpt2-medium", Vocab: 50257, PaddedVocab: 50304, MaxT: 1024, C: 1024, Layers: 24, Heads: 16},
	"gpt2-large":  {Name: "gpt2-large", Vocab: 50257, PaddedVocab: 50304, MaxT: 1024, C: 1280, Layers: 36, Heads: 20},
	"gpt2-xl":     {Name: "gpt2-xl", Vocab: 50257, PaddedVocab: 50304, MaxT: 1024, C: 1600, Layers: 48, Heads: 25},
}

// aliases are older names of presets; a manifest naming one keeps working.
var aliases = map[string]string{"gpt2-124m": "gpt2"}

// Preset returns a named configuration (PresetNames; "gpt2-124m" is an
// alias of "gpt2", whose Name the result carries).
func Preset(name string) (Config, error) {
	if a, ok := aliases[name]; ok {
		name = a
	}
	c, ok := presets[name]
	if !ok {
		return Config{}, fmt.Errorf("%w: unknown preset %q (known: %s)", ErrConfig, name, strings.Join(PresetNames(), ", "))
	}
	return c, nil
}

// PresetNames lists the preset names and aliases in a stable order.
func PresetNames() []string {
	names := make([]string, 0, len(presets)+len(aliases))
	for n := range presets {
		names = append(names, n)
	}
	for n := range aliases {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// WithVocab is c for a tokenizer of vocab ids: the real vocabulary, and
// wte's rows padded to a multiple of 64 for the kernels.
func (c Config) WithVocab(vocab int) Config {
	c.Vocab, c.PaddedVocab = vocab, (vocab+63)/64*64
	return c
}

// SameShape reports whether c and o have the same dimensions, whatever
// their names (a checkpoint of "gpt2-124m", the alias's old name, loads
// into "gpt2").
func (c Config) SameShape(o Config) bool {
	c.Name, o.Name = "", ""
	return c == o
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Vocab <= 0:
		return fmt.Errorf("%w: vocab %d must be positive", ErrConfig, c.Vocab)
	case c.PaddedVocab < c.Vocab:
		return fmt.Errorf("%w: padded vocab %d smaller than vocab %d", ErrConfig, c.PaddedVocab, c.Vocab)
	case c.MaxT <= 0:
		return fmt.Errorf("%w: context length %d must be positive", ErrConfig, c.MaxT)
	case c.C <= 0 || c.Heads <= 0 || c.C%c.Heads != 0:
		return fmt.Errorf("%w: channels %d must be a positive multiple of heads %d", ErrConfig, c.C, c.Heads)
	case c.Layers <= 0:
		return fmt.Errorf("%w: layers %d must be positive", ErrConfig, c.Layers)
	case c.Vocab > 1<<24 || c.C > 1<<16 || c.MaxT > 1<<20 || c.Layers > 1<<12:
		return fmt.Errorf("%w: dimensions too large (vocab %d, channels %d, context %d, layers %d)", ErrConfig, c.Vocab, c.C, c.MaxT, c.Layers)
	}
	return nil
}

// NumParams is the number of parameters of the whole model (tied embeddings
// counted once).
func (c Config) NumParams() int {
	n := 0
	for _, t := range Layout(c, FullSpec(c)) {
		n += t.Size()
	}
	return n
}

// FlopsPerToken estimates forward+backward floating-point operations per
// token at sequence length T (6 per parameter-token for the matmuls plus the
// attention scores), as in the PaLM/llm.c accounting.
func (c Config) FlopsPerToken(T int) float64 {
	C, L := float64(c.C), float64(c.Layers)
	matmulParams := L*12*C*C + float64(c.PaddedVocab)*C
	return 6*matmulParams + 6*L*float64(T)*C
}
