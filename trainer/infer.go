package trainer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
)

// ErrEval is returned (wrapped) for an evaluation or sampling request that
// cannot be met (more tokens than the text has, an empty prompt, ids
// outside the model's vocabulary).
var ErrEval = errors.New("trainer: bad evaluation request")

// Loaded is a whole model from a checkpoint, ready for forward passes
// (evaluation, sampling), with the tokenizer it was trained with and the
// sequence length it was trained at.
type Loaded struct {
	Model     *model.Inference
	Tokenizer data.Tokenizer
	T         int // the checkpoint's sequence length (model.Checkpoint.SeqLen)
}

// LoadModel reads the checkpoint at path (a whole model: `skein train`'s,
// a data-parallel volunteer's) onto dev for forward passes only, checking
// first that it fits in available bytes (0: the system's figure; on a GPU,
// its free memory).
func LoadModel(path string, dev kernels.Device, available uint64) (*Loaded, error) {
	ck, err := model.LoadCheckpoint(path)
	if err != nil {
		return nil, err
	}
	if ck.Spec != model.FullSpec(ck.Config) {
		return nil, fmt.Errorf("%w: %s holds %s of the %s model, not the whole model", model.ErrCheckpoint, path, ck.Spec.Holds(), ck.Config.Name)
	}
	tok, err := tokenizerNamed(ck.Tokenizer())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	T := ck.SeqLen()
	need := 4 * uint64(model.InferenceFloatsOn(dev, ck.Config, 1, T)) // exact for the attention dev runs
	if err := checkInferenceMemory(ck.Config, T, need, available, dev); err != nil {
		return nil, err
	}
	m, err := model.NewInference(dev, ck.Config, 1, T)
	if err != nil {
		return nil, err
	}
	if err := m.Load(ck); err != nil {
		return nil, err
	}
	return &Loaded{Model: m, Tokenizer: tok, T: T}, nil
}

// tokenizerNamed is the tokenizer a checkpoint names.
func tokenizerNamed(name string) (data.Tokenizer, error) {
	tok, err := data.NewTokenizer(name)
	if err != nil {
		return nil, fmt.Errorf("%w: the checkpoint's tokenizer: %w", ErrEval, err)
	}
	return tok, nil
}

func checkInferenceMemory(c model.Config, T int, need, available uint64, dev any) error {
	name := "the host"
	if dm, ok := dev.(deviceMemory); ok {
		free, _, err := dm.MemInfo()
		if err != nil {
			return err
		}
		available, name = free, dm.Name()
	} else if available == 0 {
		var ok bool
		if available, ok = systemMemAvailable(); !ok {
			return nil
		}
	}
	if need > available {
		return fmt.Errorf("%w: the %s model at 1 x %d needs about %.2f GiB for a forward pass, but %.2f GiB is free on %s",
			ErrMemory, c.Name, T, gib(need), gib(available), name)
	}
	return nil
}

// EvalResult is the mean next-token loss over Predictions predictions.
type EvalResult struct {
	Loss        float64
	Predictions int
}

// Perplexity is exp(Loss).
func (r EvalResult) Perplexity() float64 { return math.Exp(r.Loss) }

// Eval scores the first n predictions of ids (n+1 ids are read; n <= 0:
// every id but the first is predicted) in consecutive windows of l.T
// tokens: window k reads ids [kT, kT+T) and predicts [kT+1, kT+T+1), the
// last window shorter. progress, if set, is told the predictions done after
// each window. The losses are summed in float64.
func (l *Loaded) Eval(ctx context.Context, ids []int32, n int, progress func(done, total int)) (EvalResult, error) {
	if n <= 0 {
		n = len(ids) - 1
	}
	if n <= 0 || n+1 > len(ids) {
		return EvalResult{}, fmt.Errorf("%w: %d predictions need %d tokens; the text has %d", ErrEval, max(n, 1), max(n, 1)+1, len(ids))
	}
	if err := l.checkIDs(ids[:n+1]); err != nil {
		return EvalResult{}, err
	}
	var sum float64
	for k := 0; k < n; k += l.T {
		if err := ctx.Err(); err != nil {
			return EvalResult{}, err
		}
		t := min(l.T, n-k)
		if err := l.Model.Forward(ids[k:k+t], ids[k+1:k+t+1], 1, t); err != nil {
			return EvalResult{}, err
		}
		for _, x := range l.Model.Losses() {
			sum += float64(x)
		}
		if progress != nil {
			progress(k+t, n)
		}
	}
	return EvalResult{Loss: sum / float64(n), Predictions: n}, nil
}

// SampleConfig is how Sample draws each next token.
type SampleConfig struct {
	MaxTokens   int     // tokens to generate
	Temperature float64 // 0: greedy (the most likely token)
	TopK        int     // draw among the K most likely (0: all)
	Seed        uint64  // the draws' seed: the same seed, the same text
}

// Validate reports the first invalid field.
func (c SampleConfig) Validate() error {
	switch {
	case c.MaxTokens <= 0:
		return fmt.Errorf("%w: --max-tokens %d must be positive", ErrEval, c.MaxTokens)
	case c.Temperature < 0 || math.IsNaN(c.Temperature) || math.IsInf(c.Temperature, 0):
		return fmt.Errorf("%w: --temperature %v must be >= 0", ErrEval, c.Temperature)
	case c.TopK < 0:
		return fmt.Errorf("%w: --top-k %d must be >= 0", ErrEval, c.TopK)
	}
	return nil
}

// Sample continues prompt (ids) by cfg.MaxTokens tokens, handing each to
// emit as soon as it is drawn; the model sees the last l.T tokens. It stops
// early when ctx ends or emit fails.
func (l *Loaded) Sample(ctx context.Context, prompt []int32, cfg SampleConfig, emit func(id int32) error) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if len(prompt) == 0 {
		return fmt.Errorf("%w: an empty prompt (give --prompt some text)", ErrEval)
	}
	if err := l.checkIDs(prompt); err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5a3b1e))
	ctxIDs := append([]int32(nil), prompt...)
	logits := make([]float32, l.Model.Config.Vocab)
	dummy := make([]int32, l.T)
	for range cfg.MaxTokens {
		if err := ctx.Err(); err != nil {
			return err
		}
		win := ctxIDs[max(0, len(ctxIDs)-l.T):]
		t := len(win)
		if err := l.Model.Forward(win, dummy[:t], 1, t); err != nil {
			return err
		}
		if err := l.Model.Logits(logits, t-1); err != nil {
			return err
		}
		id := draw(logits, cfg, rng)
		if err := emit(id); err != nil {
			return err
		}
		ctxIDs = append(ctxIDs, id)
		if len(ctxIDs) > 2*l.T {
			ctxIDs = append(ctxIDs[:0], ctxIDs[len(ctxIDs)-l.T:]...)
		}
	}
	return nil
}

// draw picks the next token from logits: the most likely at temperature
// 0 (the smallest id among ties), else a draw from softmax(logits / T)
// over the TopK most likely.
func draw(logits []float32, cfg SampleConfig, rng *rand.Rand) int32 {
	if cfg.Temperature == 0 {
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		return int32(best)
	}
	idx := make([]int, len(logits))
	for i := range idx {
		idx[i] = i
	}
	if cfg.TopK > 0 && cfg.TopK < len(idx) {
		sort.SliceStable(idx, func(a, b int) bool { return logits[idx[a]] > logits[idx[b]] })
		idx = idx[:cfg.TopK]
	}
	mx := math.Inf(-1)
	for _, i := range idx {
		mx = math.Max(mx, float64(logits[i]))
	}
	p := make([]float64, len(idx))
	var sum float64
	for j, i := range idx {
		p[j] = math.Exp((float64(logits[i]) - mx) / cfg.Temperature)
		sum += p[j]
	}
	u := rng.Float64() * sum
	for j, i := range idx {
		if u < p[j] {
			return int32(i)
		}
		u -= p[j]
	}
	return int32(idx[len(idx)-1])
}

// checkIDs refuses ids the model cannot embed (a tokenizer with a larger
// vocabulary than the model's).
func (l *Loaded) checkIDs(ids []int32) error {
	v := l.Model.Config.Vocab
	for i, id := range ids {
		if id < 0 || int(id) >= v {
			return fmt.Errorf("%w: token %d (id %d) is outside the model's vocabulary of %d", ErrEval, i, id, v)
		}
	}
	return nil
}
