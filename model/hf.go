package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/skein-ml/skein/internal/atomicfile"
)

// Hugging Face's GPT-2 (transformers' GPT2LMHeadModel): a directory with
// config.json and model.safetensors, whose tensors are named
// "transformer.wte.weight", "transformer.h.3.attn.c_attn.weight", ... and
// whose matrices are Conv1D weights, stored (in, out): the transpose of
// ours. The vocabulary is the real one (wte has Vocab rows, not our
// PaddedVocab), and lm_head is tied to wte, so it is not stored.
const (
	HFConfigFile  = "config.json"
	HFWeightsFile = "model.safetensors"
	hfPrefix      = "transformer."
	maxHFConfig   = 1 << 20
)

// ErrHF is returned (wrapped) for a directory that is not a GPT-2 model
// this build can read.
var ErrHF = errors.New("model: not a Hugging Face GPT-2 model")

// hfConfig is the part of transformers' GPT2Config that shapes the model.
type hfConfig struct {
	Architectures []string `json:"architectures"`
	ModelType     string   `json:"model_type"`
	VocabSize     int      `json:"vocab_size"`
	NPositions    int      `json:"n_positions"`
	NCtx          int      `json:"n_ctx,omitempty"`
	NEmbd         int      `json:"n_embd"`
	NLayer        int      `json:"n_layer"`
	NHead         int      `json:"n_head"`
	NInner        *int     `json:"n_inner"`
	Activation    string   `json:"activation_function"`
	LNEps         float64  `json:"layer_norm_epsilon"`
	ResidPdrop    float64  `json:"resid_pdrop"`
	EmbdPdrop     float64  `json:"embd_pdrop"`
	AttnPdrop     float64  `json:"attn_pdrop"`
	InitRange     float64  `json:"initializer_range"`
	BOS           int      `json:"bos_token_id"`
	EOS           int      `json:"eos_token_id"`
	Tie           *bool    `json:"tie_word_embeddings,omitempty"`
	DType         string   `json:"torch_dtype,omitempty"`
}

// ExportHF writes ck, a whole model, into dir as a Hugging Face GPT-2
// model (config.json, model.safetensors with metadata {"format": "pt"}),
// each file written atomically. extra files (a tokenizer's, by name) are
// written beside them.
func ExportHF(dir string, ck *Checkpoint, extra map[string][]byte) error {
	c := ck.Config
	if ck.Spec != FullSpec(c) {
		return fmt.Errorf("%w: the checkpoint holds %s, not the whole model", ErrCheckpoint, ck.Spec.Holds())
	}
	if len(ck.Params) != c.NumParams() {
		return fmt.Errorf("%w: %d parameters, the %s model has %d", ErrCheckpoint, len(ck.Params), c.Name, c.NumParams())
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	special := 0
	if c.Vocab == 50257 {
		special = 50256 // <|endoftext|>
	}
	tie := true
	cfg := hfConfig{Architectures: []string{"GPT2LMHeadModel"}, ModelType: "gpt2", VocabSize: c.Vocab,
		NPositions: c.MaxT, NCtx: c.MaxT, NEmbd: c.C, NLayer: c.Layers, NHead: c.Heads, Activation: "gelu_new",
		LNEps: 1e-5, InitRange: 0.02, BOS: special, EOS: special, Tie: &tie, DType: "float32"}
	cj, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	var tensors []NamedTensor
	for _, t := range Layout(c, FullSpec(c)) {
		data := ck.Params[t.Offset : t.Offset+t.Size()]
		shape := t.Shape
		switch {
		case t.Name == "wte":
			data, shape = data[:c.Vocab*c.C], []int{c.Vocab, c.C} // no padding rows
		case conv1D(t):
			data, shape = transpose(data, shape[0], shape[1]), []int{shape[1], shape[0]}
		}
		tensors = append(tensors, NamedTensor{Name: hfPrefix + t.Name + weightSuffix(t.Name), Shape: shape, Data: data})
	}
	if err := atomicfile.Write(filepath.Join(dir, HFWeightsFile), 0o644, func(w io.Writer) error {
		return WriteSafetensors(w, tensors, map[string]string{"format": "pt",
			MetaSeqLen: strconv.Itoa(ck.SeqLen()), MetaTokenizer: ck.Tokenizer()})
	}); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, HFConfigFile), append(cj, '\n'), 0o644); err != nil {
		return err
	}
	for name, b := range extra {
		if err := atomicfile.WriteFile(filepath.Join(dir, filepath.Base(name)), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// conv1D: a block's matrices are Conv1D weights in Hugging Face's GPT-2,
// stored (in, out); the embeddings are not.
func conv1D(t Tensor) bool { return len(t.Shape) == 2 && t.Name != "wte" && t.Name != "wpe" }

// weightSuffix: our embeddings are "wte", "wpe"; Hugging Face's are
// "wte.weight", "wpe.weight".
func weightSuffix(name string) string {
	if name == "wte" || name == "wpe" {
		return ".weight"
	}
	return ""
}

// ImportHF reads a Hugging Face GPT-2 directory (config.json and
// model.safetensors in F32; lm_head.weight, if present, must equal wte) into
// a checkpoint of the whole model without optimizer state: a preset's
// configuration when the shapes are one's, else one named "hf". Sizes are
// checked against the file before anything is allocated.
func ImportHF(dir string) (*Checkpoint, error) {
	cb, err := readBounded(filepath.Join(dir, HFConfigFile), maxHFConfig)
	if err != nil {
		return nil, err
	}
	c, err := parseHFConfig(cb)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, HFWeightsFile)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	// The file must hold every parameter before they are allocated.
	if need := 4 * int64(c.NumParams()-(c.PaddedVocab-c.Vocab)*c.C); st.Size() < need {
		return nil, fmt.Errorf("%w: %s has %d bytes; the %d-layer, %d-channel model of config.json needs %d", ErrHF, path, st.Size(), c.Layers, c.C, need)
	}
	h, err := ReadSafetensorsHeader(f, st.Size(), 4*int64(c.NumParams()+c.Vocab*c.C))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	byName := map[string]STTensorInfo{}
	for _, t := range h.Tensors {
		byName[t.Name] = t
	}
	params := make([]float32, c.NumParams())
	for _, t := range Layout(c, FullSpec(c)) {
		name := hfPrefix + t.Name + weightSuffix(t.Name)
		info, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("%w: %s has no tensor %s", ErrHF, path, name)
		}
		want := t.Shape
		switch {
		case t.Name == "wte":
			want = []int{c.Vocab, c.C}
		case conv1D(t):
			want = []int{want[1], want[0]}
		}
		if !equalShape(info.Shape, want) {
			return nil, fmt.Errorf("%w: %s is %v, want %v", ErrHF, name, info.Shape, want)
		}
		n := want[0]
		if len(want) == 2 {
			n *= want[1]
		}
		buf := make([]float32, n)
		if err := h.ReadTensor(f, info, buf); err != nil {
			return nil, err
		}
		dst := params[t.Offset : t.Offset+t.Size()]
		if conv1D(t) {
			buf = transpose(buf, want[0], want[1])
		}
		copy(dst, buf) // wte: the padding rows stay zero
	}
	if info, ok := byName["lm_head.weight"]; ok {
		if !equalShape(info.Shape, []int{c.Vocab, c.C}) {
			return nil, fmt.Errorf("%w: lm_head.weight is %v, want %v", ErrHF, info.Shape, []int{c.Vocab, c.C})
		}
		head := make([]float32, c.Vocab*c.C)
		if err := h.ReadTensor(f, info, head); err != nil {
			return nil, err
		}
		for i, v := range head {
			if v != params[i] {
				return nil, fmt.Errorf("%w: lm_head.weight differs from wte at %d (Skein ties them)", ErrHF, i)
			}
		}
	}
	// Skein's own exports say what they were trained with; others are
	// taken as trained at their context, with GPT-2's tokenizer at its
	// vocabulary.
	meta := map[string]string{MetaSeqLen: strconv.Itoa(c.MaxT), MetaTokenizer: "byte", "skein.imported": dir}
	if c.Vocab == 50257 {
		meta[MetaTokenizer] = "gpt2"
	}
	for _, k := range []string{MetaSeqLen, MetaTokenizer} {
		if v, ok := h.Metadata[k]; ok && len(v) < 64 {
			meta[k] = v
		}
	}
	return &Checkpoint{Config: c, Spec: FullSpec(c), Params: params, Meta: meta}, nil
}

// parseHFConfig is the model configuration of a config.json: a GPT-2 whose
// layers Skein computes the same way (gelu_new, layer norm epsilon 1e-5, no
// n_inner other than 4 x n_embd).
func parseHFConfig(b []byte) (Config, error) {
	var h hfConfig
	if err := json.Unmarshal(b, &h); err != nil {
		return Config{}, fmt.Errorf("%w: config.json: %v", ErrHF, err)
	}
	switch {
	case h.ModelType != "gpt2":
		return Config{}, fmt.Errorf("%w: model_type %q", ErrHF, h.ModelType)
	case h.Activation != "" && h.Activation != "gelu_new":
		return Config{}, fmt.Errorf("%w: activation_function %q (Skein computes gelu_new)", ErrHF, h.Activation)
	case h.LNEps != 0 && (h.LNEps < 0.99e-5 || h.LNEps > 1.01e-5):
		return Config{}, fmt.Errorf("%w: layer_norm_epsilon %v (Skein computes 1e-5)", ErrHF, h.LNEps)
	case h.NInner != nil && *h.NInner != 4*h.NEmbd:
		return Config{}, fmt.Errorf("%w: n_inner %d (Skein computes 4 x n_embd)", ErrHF, *h.NInner)
	case h.Tie != nil && !*h.Tie:
		return Config{}, fmt.Errorf("%w: untied word embeddings", ErrHF)
	}
	c := Config{Name: "hf", Vocab: h.VocabSize, PaddedVocab: (h.VocabSize + 63) / 64 * 64, MaxT: h.NPositions,
		C: h.NEmbd, Layers: h.NLayer, Heads: h.NHead}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrHF, err)
	}
	for _, name := range PresetNames() {
		if p, _ := Preset(name); p.SameShape(c) {
			return p, nil
		}
	}
	return c, nil
}

// readBounded reads the file at path, refusing one past max bytes.
func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrHF, path, max)
	}
	return b, nil
}

// transpose returns the (cols, rows) transpose of the (rows, cols) matrix m.
func transpose(m []float32, rows, cols int) []float32 {
	out := make([]float32, len(m))
	for i := range rows {
		for j := range cols {
			out[j*rows+i] = m[i*cols+j]
		}
	}
	return out
}
