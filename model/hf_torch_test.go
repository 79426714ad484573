package model

import (
	"encoding/json"
	"math"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/skein-ml/skein/kernels"
)

// An export checked against an independent implementation: a GPT-2 written
// in PyTorch from transformers' definition (testdata/torch_gpt2.py; neither
// transformers nor the safetensors package is installable here) loads the
// exported directory and computes every position's logits and the mean
// next-token loss, which must match ours within 1e-4. scripts/test.sh
// installs Debian's python3-torch; without it the test skips, saying so.
func TestExportMatchesPyTorch(t *testing.T) {
	py := "/usr/bin/python3"
	if out, err := exec.Command(py, "-c", "import torch, numpy").CombinedOutput(); err != nil {
		t.Skipf("no PyTorch for %s (apt-get install python3-torch): %v %s", py, err, out)
	}
	c := Config{Name: "check", Vocab: 50, PaddedVocab: 64, MaxT: 16, C: 16, Layers: 2, Heads: 4}
	_, ck := randomCheckpoint(t, c, 21)
	dir := t.TempDir()
	if err := ExportHF(dir, ck, nil); err != nil {
		t.Fatal(err)
	}
	ids := []int32{3, 17, 42, 8, 8, 0, 49, 23, 11, 30, 5, 19}
	arg, _ := json.Marshal(ids)
	out, err := exec.Command(py, filepath.Join("testdata", "torch_gpt2.py"), dir, string(arg)).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("torch_gpt2.py: %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var ref struct {
		Logits [][]float64 `json:"logits"`
		Loss   float64     `json:"loss"`
	}
	if err := json.Unmarshal(out, &ref); err != nil {
		t.Fatalf("%v: %.200s", err, out)
	}
	m, err := NewInference(kernels.NewCPU(1), c, 1, 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Load(ck); err != nil {
		t.Fatal(err)
	}
	T := len(ids) - 1
	if err := m.Forward(ids[:T], ids[1:], 1, T); err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, l := range m.Losses() {
		sum += float64(l)
	}
	if got := sum / float64(T); math.Abs(got-ref.Loss) > 1e-4 {
		t.Fatalf("mean loss %.6f, PyTorch's %.6f", got, ref.Loss)
	}
	logits := make([]float32, c.Vocab)
	worst := 0.0
	for i := range T {
		if err := m.Logits(logits, i); err != nil {
			t.Fatal(err)
		}
		for j, v := range logits {
			worst = math.Max(worst, math.Abs(float64(v)-ref.Logits[i][j]))
		}
	}
	if worst > 1e-4 {
		t.Fatalf("logits differ from PyTorch's by up to %g", worst)
	}
	t.Logf("loss %.6f (PyTorch %.6f); logits within %.2g of PyTorch's over %d positions", sum/float64(T), ref.Loss, worst, T)
}
