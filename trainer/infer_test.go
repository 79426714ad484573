package trainer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
)

// inferModel saves a small byte-level model with random O(0.3) weights
// (trained at T = 8) and returns the stage and the checkpoint's path.
func inferModel(t *testing.T) (*model.Stage, string) {
	t.Helper()
	c := model.Config{Name: "micro", Vocab: 256, PaddedVocab: 256, MaxT: 16, C: 16, Layers: 2, Heads: 2}
	s, err := model.NewStage(kernels.NewCPU(1), c, model.FullSpec(c), 1, 8, 1)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	p := make([]float32, s.NumParams())
	for i := range p {
		p[i] = float32(rng.NormFloat64() * 0.3)
	}
	s.Device().CopyIn(s.Params, p)
	path := filepath.Join(t.TempDir(), "ck.safetensors")
	if err := model.SaveCheckpoint(path, s.Snapshot(5, nil)); err != nil {
		t.Fatal(err)
	}
	return s, path
}

// Eval's windows: window k reads [kT, kT+T) and predicts [kT+1, kT+T+1),
// the last one shorter; the reference scores full windows, the short one
// padded (attention is causal, so the padding changes nothing before it).
func TestEvalWindows(t *testing.T) {
	s, path := inferModel(t)
	l, err := LoadModel(path, kernels.NewCPU(1), 0)
	if err != nil {
		t.Fatal(err)
	}
	if l.T != 8 {
		t.Fatalf("T = %d, want the 8 the model was trained at", l.T)
	}
	text := []byte("the quick brown fox jumps over")
	ids := l.Tokenizer.Encode(text)
	// The reference: full windows of T, padded past the text's end.
	ref, err := model.NewInference(kernels.NewCPU(1), s.Config, 1, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := ref.Load(s.Snapshot(0, nil)); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{len(ids) - 1, 8, 13, 1} {
		var sum float64
		for k := 0; k < n; k += 8 {
			tt := min(8, n-k)
			in, tg := make([]int32, 8), make([]int32, 8)
			copy(in, ids[k:k+tt])
			copy(tg, ids[k+1:k+tt+1])
			if err := ref.Forward(in, tg, 1, 8); err != nil {
				t.Fatal(err)
			}
			for _, x := range ref.Losses()[:tt] {
				sum += float64(x)
			}
		}
		got, err := l.Eval(context.Background(), ids, n, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got.Predictions != n || math.Abs(got.Loss-sum/float64(n)) > 1e-6 {
			t.Fatalf("n = %d: %+v, want loss %v", n, got, sum/float64(n))
		}
	}
	if _, err := l.Eval(context.Background(), ids, len(ids), nil); !errors.Is(err, ErrEval) {
		t.Fatalf("more predictions than the text holds: %v", err)
	}
	if _, err := l.Eval(context.Background(), ids[:1], 0, nil); !errors.Is(err, ErrEval) {
		t.Fatalf("one token: %v", err)
	}
}

// Sampling: greedy is the most likely token each time; a seed gives the
// same text; the tokens are the model's.
func TestSample(t *testing.T) {
	_, path := inferModel(t)
	l, err := LoadModel(path, kernels.NewCPU(1), 0)
	if err != nil {
		t.Fatal(err)
	}
	prompt := l.Tokenizer.Encode([]byte("hello"))
	run := func(cfg SampleConfig) []int32 {
		var out []int32
		if err := l.Sample(context.Background(), prompt, cfg, func(id int32) error { out = append(out, id); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(out) != cfg.MaxTokens {
			t.Fatalf("%d tokens, want %d", len(out), cfg.MaxTokens)
		}
		return out
	}
	greedy := run(SampleConfig{MaxTokens: 20})
	// The first greedy token is the argmax of the prompt's last logits.
	logits := make([]float32, 256)
	if err := l.Model.Forward(prompt, make([]int32, len(prompt)), 1, len(prompt)); err != nil {
		t.Fatal(err)
	}
	if err := l.Model.Logits(logits, len(prompt)-1); err != nil {
		t.Fatal(err)
	}
	if want := int32(slices.Index(logits, slices.Max(logits))); greedy[0] != want {
		t.Fatalf("greedy took %d, the argmax is %d", greedy[0], want)
	}
	if again := run(SampleConfig{MaxTokens: 20}); !slices.Equal(again, greedy) {
		t.Fatal("greedy is not deterministic")
	}
	a := run(SampleConfig{MaxTokens: 30, Temperature: 1, Seed: 7})
	if b := run(SampleConfig{MaxTokens: 30, Temperature: 1, Seed: 7}); !slices.Equal(a, b) {
		t.Fatal("the same seed gave another text")
	}
	if c := run(SampleConfig{MaxTokens: 30, Temperature: 1, Seed: 8}); slices.Equal(a, c) {
		t.Fatal("another seed gave the same 30 tokens")
	}
	// Top-1 at any temperature is greedy.
	if k1 := run(SampleConfig{MaxTokens: 20, Temperature: 2, TopK: 1, Seed: 9}); !slices.Equal(k1, greedy) {
		t.Fatal("top-k 1 is not greedy")
	}
	// Past the context: the model sees the last T tokens and goes on.
	run(SampleConfig{MaxTokens: 40, Temperature: 0.7, TopK: 5})
	for _, bad := range []SampleConfig{{MaxTokens: 0}, {MaxTokens: 1, Temperature: -1}, {MaxTokens: 1, TopK: -1}} {
		if err := l.Sample(context.Background(), prompt, bad, func(int32) error { return nil }); !errors.Is(err, ErrEval) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	if err := l.Sample(context.Background(), nil, SampleConfig{MaxTokens: 1}, func(int32) error { return nil }); !errors.Is(err, ErrEval) {
		t.Errorf("empty prompt: %v", err)
	}
}

// A checkpoint too large for the memory available is refused before
// anything is allocated.
func TestLoadModelMemory(t *testing.T) {
	_, path := inferModel(t)
	if _, err := LoadModel(path, kernels.NewCPU(1), 1024); !errors.Is(err, ErrMemory) {
		t.Fatalf("1 KiB available: %v", err)
	}
}

// skein train --tokenizer gpt2: the corpus goes through GPT-2's tokenizer,
// the model takes its vocabulary, the checkpoint names the tokenizer, and
// eval reads text with it; a resume with another tokenizer is refused.
func TestTrainWithGPT2Tokenizer(t *testing.T) {
	dir := t.TempDir()
	corpus := filepath.Join(dir, "corpus")
	os.MkdirAll(corpus, 0o755)
	for i := range 4 {
		os.WriteFile(filepath.Join(corpus, fmt.Sprintf("f%d.txt", i)), []byte(strings.Repeat(fmt.Sprintf("the number %d is here. ", i), 40)), 0o644)
	}
	cfg := DefaultTrainConfig()
	cfg.Preset, cfg.Steps, cfg.Batch, cfg.SeqLen, cfg.Threads = "tiny", 3, 2, 16, 1
	cfg.Corpus, cfg.Out, cfg.Tokenizer, cfg.EvalEvery = []string{corpus}, filepath.Join(dir, "run"), "gpt2", 0
	res, err := Train(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := model.LoadCheckpoint(res.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	if ck.Tokenizer() != "gpt2" || ck.Config.Vocab != 50257 || ck.Config.PaddedVocab != 50304 {
		t.Fatalf("checkpoint: tokenizer %q, vocab %d/%d", ck.Tokenizer(), ck.Config.Vocab, ck.Config.PaddedVocab)
	}
	l, err := LoadModel(res.Checkpoint, kernels.NewCPU(1), 0)
	if err != nil {
		t.Fatal(err)
	}
	ids := l.Tokenizer.Encode([]byte("the number 2 is here. the number 3 is here."))
	if len(ids) > 20 { // GPT-2 tokens, not bytes
		t.Fatalf("%d tokens: not GPT-2's", len(ids))
	}
	if _, err := l.Eval(context.Background(), ids, 0, nil); err != nil {
		t.Fatal(err)
	}
	cfg.Tokenizer, cfg.Resume, cfg.Steps = "byte", true, 4
	if _, err := Train(context.Background(), cfg); !errors.Is(err, ErrResumeMismatch) {
		t.Fatalf("resumed with the byte tokenizer: %v", err)
	}
}
