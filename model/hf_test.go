package model

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/skein-ml/skein/kernels"
)

// Export then import is the identity on every parameter but wte's padding
// rows, which Hugging Face's format does not hold (they are zero after
// import and never reach a logit). The file has Hugging Face's names,
// Conv1D (in, out) layout and {"format": "pt"}; the model computes the
// same losses after the round trip.
func TestExportImportHF(t *testing.T) {
	c := Config{Name: "tiny-hf", Vocab: 50, PaddedVocab: 64, MaxT: 8, C: 8, Layers: 2, Heads: 2}
	s, ck := randomCheckpoint(t, c, 11)
	dir := t.TempDir()
	if err := ExportHF(dir, ck, map[string][]byte{"vocab.json": []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, HFWeightsFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	h, err := ReadSafetensorsHeader(f, st.Size(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if h.Metadata["format"] != "pt" {
		t.Fatalf("metadata %v", h.Metadata)
	}
	shapes := map[string][]int{}
	for _, ti := range h.Tensors {
		shapes[ti.Name] = ti.Shape
	}
	for name, want := range map[string][]int{
		"transformer.wte.weight":             {50, 8},
		"transformer.wpe.weight":             {8, 8},
		"transformer.h.1.attn.c_attn.weight": {8, 24},
		"transformer.h.0.mlp.c_proj.weight":  {32, 8},
		"transformer.h.0.mlp.c_fc.bias":      {32},
		"transformer.ln_f.weight":            {8},
	} {
		if !slices.Equal(shapes[name], want) {
			t.Errorf("%s: shape %v, want %v", name, shapes[name], want)
		}
	}
	// c_attn is Conv1D: element (i, j) of the file is our (j, i).
	ours := ck.Params[s.tensors[s.index["h.1.attn.c_attn.weight"]].Offset:]
	var file []float32
	for _, ti := range h.Tensors {
		if ti.Name == "transformer.h.1.attn.c_attn.weight" {
			file = make([]float32, 8*24)
			if err := h.ReadTensor(f, ti, file); err != nil {
				t.Fatal(err)
			}
		}
	}
	if file[2*24+5] != ours[5*8+2] {
		t.Fatal("c_attn is not stored (in, out)")
	}
	// wpe is an embedding, (positions, channels) as ours: not transposed.
	for _, ti := range h.Tensors {
		if ti.Name == "transformer.wpe.weight" {
			wpe := make([]float32, 8*8)
			if err := h.ReadTensor(f, ti, wpe); err != nil {
				t.Fatal(err)
			}
			off := s.tensors[s.index["wpe"]].Offset
			if !slices.Equal(wpe, ck.Params[off:off+64]) {
				t.Fatal("wpe was not stored as it is")
			}
		}
	}
	cj, _ := os.ReadFile(filepath.Join(dir, HFConfigFile))
	for _, want := range []string{`"GPT2LMHeadModel"`, `"n_embd": 8`, `"vocab_size": 50`, `"gelu_new"`} {
		if !bytes.Contains(cj, []byte(want)) {
			t.Errorf("config.json lacks %s:\n%s", want, cj)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "vocab.json")); err != nil || string(b) != "{}" {
		t.Errorf("extra file: %q %v", b, err)
	}

	back, err := ImportHF(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !back.Config.SameShape(c) || back.Spec != FullSpec(c) {
		t.Fatalf("imported %+v %+v", back.Config, back.Spec)
	}
	pad := c.Vocab * c.C // wte's real rows end here
	for i := range ck.Params {
		if i >= pad && i < c.PaddedVocab*c.C {
			if back.Params[i] != 0 {
				t.Fatalf("padding row value %d = %v after import", i, back.Params[i])
			}
			continue
		}
		if back.Params[i] != ck.Params[i] {
			t.Fatalf("parameter %d: %v after the round trip, %v before", i, back.Params[i], ck.Params[i])
		}
	}
	// The same losses from both.
	in, tg := []int32{1, 4, 9, 16, 25, 36, 49, 0}, []int32{4, 9, 16, 25, 36, 49, 0, 1}
	losses := func(ck *Checkpoint) []float32 {
		m, err := NewInference(kernels.NewCPU(1), c, 1, 8)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Load(ck); err != nil {
			t.Fatal(err)
		}
		if err := m.Forward(in, tg, 1, 8); err != nil {
			t.Fatal(err)
		}
		return slices.Clone(m.Losses())
	}
	if a, b := losses(ck), losses(back); !slices.Equal(a, b) {
		t.Fatalf("losses %v before, %v after", a, b)
	}
}

// A preset's shapes import as the preset; configurations Skein does not
// compute the same way are refused with the reason.
func TestParseHFConfig(t *testing.T) {
	c, err := parseHFConfig([]byte(`{"model_type":"gpt2","vocab_size":50257,"n_positions":1024,"n_embd":768,"n_layer":12,"n_head":12,"activation_function":"gelu_new","layer_norm_epsilon":1e-05}`))
	if err != nil || c.Name != "gpt2" {
		t.Fatalf("gpt2: %+v %v", c, err)
	}
	for _, bad := range []string{
		`{"model_type":"llama"}`,
		`{"model_type":"gpt2","vocab_size":50257,"n_positions":1024,"n_embd":768,"n_layer":12,"n_head":12,"activation_function":"relu"}`,
		`{"model_type":"gpt2","vocab_size":50257,"n_positions":1024,"n_embd":768,"n_layer":12,"n_head":12,"n_inner":1000}`,
		`{"model_type":"gpt2","vocab_size":50257,"n_positions":1024,"n_embd":768,"n_layer":12,"n_head":7}`,
		`{"model_type":"gpt2","vocab_size":0}`,
		`not json`,
	} {
		if _, err := parseHFConfig([]byte(bad)); !errors.Is(err, ErrHF) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

func FuzzParseHFConfig(f *testing.F) {
	f.Add([]byte(`{"model_type":"gpt2","vocab_size":50257,"n_positions":1024,"n_embd":768,"n_layer":12,"n_head":12}`))
	f.Add([]byte(`{"model_type":"gpt2","vocab_size":1,"n_positions":1,"n_embd":1,"n_layer":1,"n_head":1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseHFConfig(b)
		if err == nil && c.Validate() != nil {
			t.Fatalf("accepted an invalid config %+v", c)
		}
		if err != nil && !errors.Is(err, ErrHF) && !strings.Contains(err.Error(), "model") {
			t.Fatalf("unwrapped error %v", err)
		}
	})
}

// A config.json declaring a huge model next to a small weights file is
// refused before the parameters are allocated.
func TestImportHFBounded(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, HFConfigFile), []byte(`{"model_type":"gpt2","vocab_size":16000000,"n_positions":1000000,"n_embd":65536,"n_layer":4096,"n_head":1}`), 0o644)
	os.WriteFile(filepath.Join(dir, HFWeightsFile), []byte("\x02\x00\x00\x00\x00\x00\x00\x00{}"), 0o644)
	if _, err := ImportHF(dir); !errors.Is(err, ErrHF) {
		t.Fatalf("%v", err)
	}
}

// randomCheckpoint is the whole model c, trained at its context, with
// randomize's O(0.3) weights from seed, and its snapshot.
func randomCheckpoint(t *testing.T, c Config, seed uint64) (*Stage, *Checkpoint) {
	t.Helper()
	s, err := NewStage(kernels.NewCPU(1), c, FullSpec(c), 1, c.MaxT, 1)
	if err != nil {
		t.Fatal(err)
	}
	randomize(s, seed)
	return s, s.Snapshot(0, nil)
}
