package model

import (
	"fmt"
	"math"
	"strings"
)

// Tensor is one named parameter tensor: a view [Offset, Offset+Size()) of a
// stage's flat buffers.
type Tensor struct {
	Name   string
	Shape  []int
	Offset int
	// Decay says whether AdamW applies weight decay (matrices and
	// embeddings: yes; biases and layernorm parameters: no).
	Decay bool
}

// Size is the number of elements.
func (t Tensor) Size() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// StageSpec selects the part of the model a Stage holds: layers
// [FirstLayer, LastLayer), and optionally the embedding (token and position)
// and the head (final layernorm, tied output projection and loss). A stage
// with the head but not the embedding holds its own copy of the tied token
// embedding, which the pipeline keeps in sync.
type StageSpec struct {
	FirstLayer int  `json:"first_layer"`
	LastLayer  int  `json:"last_layer"`
	Embedding  bool `json:"embedding"`
	Head       bool `json:"head"`
}

// Holds says what a stage holds, for people: "embedding, head, layer 0",
// "layers 2-3" (stage 0 holds the head and the loss with the embedding).
func (s StageSpec) Holds() string {
	var parts []string
	if s.Embedding {
		parts = append(parts, "embedding, head")
	}
	switch n := s.LastLayer - s.FirstLayer; {
	case n == 1:
		parts = append(parts, fmt.Sprintf("layer %d", s.FirstLayer))
	case n > 1:
		parts = append(parts, fmt.Sprintf("layers %d-%d", s.FirstLayer, s.LastLayer-1))
	}
	return strings.Join(parts, ", ")
}

// FullSpec is the whole model as one stage.
func FullSpec(c Config) StageSpec {
	return StageSpec{FirstLayer: 0, LastLayer: c.Layers, Embedding: true, Head: true}
}

// Validate checks the spec against a config.
func (s StageSpec) Validate(c Config) error {
	if s.FirstLayer < 0 || s.LastLayer > c.Layers || s.FirstLayer > s.LastLayer {
		return fmt.Errorf("%w: stage layers [%d, %d) outside [0, %d)", ErrConfig, s.FirstLayer, s.LastLayer, c.Layers)
	}
	if s.FirstLayer == s.LastLayer && !s.Embedding && !s.Head {
		return fmt.Errorf("%w: empty stage", ErrConfig)
	}
	return nil
}

// Per-block tensor suffixes, in layout order.
const (
	tLn1W = iota
	tLn1B
	tQkvW
	tQkvB
	tAttProjW
	tAttProjB
	tLn2W
	tLn2B
	tFcW
	tFcB
	tFcProjW
	tFcProjB
	numBlockTensors
)

var blockNames = [numBlockTensors]string{
	"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
	"attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
	"mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
}

func blockShapes(C int) [numBlockTensors][]int {
	return [numBlockTensors][]int{
		{C}, {C}, {3 * C, C}, {3 * C}, {C, C}, {C}, {C}, {C}, {4 * C, C}, {4 * C}, {C, 4 * C}, {C},
	}
}

// Layout lists the tensors of a stage in buffer order. Names follow Hugging
// Face's GPT-2 ("wte", "h.3.attn.c_attn.weight", "ln_f.weight"), but matrix
// weights are stored (out, in) like torch.nn.Linear, not transposed like
// GPT-2's Conv1D.
func Layout(c Config, s StageSpec) []Tensor {
	var ts []Tensor
	off := 0
	add := func(name string, shape []int) {
		t := Tensor{Name: name, Shape: shape, Offset: off, Decay: len(shape) >= 2}
		ts = append(ts, t)
		off += t.Size()
	}
	if s.Embedding || s.Head {
		add("wte", []int{c.PaddedVocab, c.C})
	}
	if s.Embedding {
		add("wpe", []int{c.MaxT, c.C})
	}
	shapes := blockShapes(c.C)
	for l := s.FirstLayer; l < s.LastLayer; l++ {
		for i := 0; i < numBlockTensors; i++ {
			add(fmt.Sprintf("h.%d.%s", l, blockNames[i]), shapes[i])
		}
	}
	if s.Head {
		add("ln_f.weight", []int{c.C})
		add("ln_f.bias", []int{c.C})
	}
	return ts
}

// initStd returns the standard deviation of a tensor's normal init, or a
// negative value for constant init (value returned as second result).
func initStd(c Config, name string, shape []int) (std float64, constant float32) {
	switch {
	case len(shape) == 1 && (hasSuffix(name, "ln_1.weight") || hasSuffix(name, "ln_2.weight") || name == "ln_f.weight"):
		return -1, 1
	case len(shape) == 1:
		return -1, 0
	case hasSuffix(name, "c_proj.weight"):
		return 0.02 / math.Sqrt(2*float64(c.Layers)), 0
	default:
		return 0.02, 0
	}
}

func hasSuffix(s, suf string) bool { return len(s) >= len(suf) && s[len(s)-len(suf):] == suf }
