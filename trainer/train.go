// Package trainer trains one model in one process: the single setup chain
// (preset -> corpus -> loader -> device -> stage -> AdamW) shared by `skein
// train`, volunteers and experiments, the training step, evaluation, the
// progress bar, and single-process runs with checkpoints and bit-exact
// resume (`skein train`, `skein bench train`).
//
// trainer must not talk to the network or implement numerics itself: it
// calls data, model, kernels and optimizer.
package trainer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/internal/atomicfile"
	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
)

// ErrConfig is returned (wrapped) for invalid training settings.
var ErrConfig = errors.New("trainer: invalid config")

// ErrResumeMismatch is returned when --resume finds a checkpoint made with
// settings that would change the run (model, seed, batch shape or corpus).
var ErrResumeMismatch = errors.New("trainer: checkpoint does not match this run")

// ErrCheckpointExists is returned when the output directory holds a
// checkpoint and neither Resume nor Force says what to do with it.
var ErrCheckpointExists = errors.New("trainer: a checkpoint exists")

// CheckpointFile is the name of the latest checkpoint inside TrainConfig.Out.
const CheckpointFile = "checkpoint.safetensors"

// TrainConfig configures a single-process training run.
type TrainConfig struct {
	Preset  string
	Steps   int
	Batch   int // sequences per step
	SeqLen  int // tokens per sequence; 0 means the preset's context length
	Seed    uint64
	Threads int // 0 means all cores
	// Dev, if set, trains instead of a CPU device with Threads (the caller
	// closes it).
	Dev kernels.Device

	AdamW optimizer.AdamWConfig // TotalSteps is set from Steps

	// Corpus paths (files or directories); empty means the Go standard
	// library sources of the local Go installation.
	Corpus []string
	// Tokenizer names the tokenizer (data.TokenizerNames; "" is byte): any
	// other tokenizes the corpus in memory at the start.
	Tokenizer string
	// Dataset, if set, is a packed dataset directory (skein data pack) to
	// train on instead of Corpus; its tokenizer is the run's (Tokenizer
	// must be empty or the same).
	Dataset string

	// Out is the run directory (checkpoint and metrics.jsonl); empty means
	// nothing is written.
	Out string
	// Resume continues from Out/checkpoint.safetensors when it exists.
	Resume bool
	// Force starts over, replacing Out/checkpoint.safetensors. Without
	// Resume or Force an existing checkpoint is refused
	// (ErrCheckpointExists), never overwritten.
	Force bool

	EvalEvery       int // steps between validation losses; 0 disables
	EvalBatches     int // batches per validation
	CheckpointEvery int // steps between checkpoints; 0 means only at the end

	Logger   *slog.Logger
	Progress io.Writer // progress bar; nil disables
	// OnStep, if set, is called after each completed step (0-based) with its
	// training loss; telemetry hooks in here.
	OnStep func(step int, loss float32)
}

// DefaultTrainConfig returns settings that train the tiny preset on the
// default corpus for a few minutes on a laptop.
func DefaultTrainConfig() TrainConfig {
	a := optimizer.DefaultAdamW()
	a.LR = 1e-3
	a.Warmup = 20
	return TrainConfig{Preset: "tiny", Steps: 300, Batch: 16, Seed: 1, AdamW: a,
		Out: "runs/train", EvalEvery: 50, EvalBatches: 8, CheckpointEvery: 100}
}

// Validate names the first invalid setting.
func (c *TrainConfig) Validate() error {
	if _, err := model.Preset(c.Preset); err != nil {
		return err
	}
	switch {
	case c.Steps <= 0:
		return fmt.Errorf("%w: steps %d must be positive", ErrConfig, c.Steps)
	case c.Batch <= 0:
		return fmt.Errorf("%w: batch %d must be positive", ErrConfig, c.Batch)
	case c.SeqLen < 0:
		return fmt.Errorf("%w: sequence length %d must be >= 0", ErrConfig, c.SeqLen)
	case c.Threads < 0:
		return fmt.Errorf("%w: threads %d must be >= 0", ErrConfig, c.Threads)
	case c.EvalEvery < 0 || c.EvalBatches < 0 || c.CheckpointEvery < 0:
		return fmt.Errorf("%w: eval-every, eval-batches and checkpoint-every must be >= 0", ErrConfig)
	case c.Resume && c.Out == "":
		return fmt.Errorf("%w: --resume needs an output directory", ErrConfig)
	case c.Resume && c.Force:
		return fmt.Errorf("%w: --resume (continue from the checkpoint) and --force (start over) exclude each other", ErrConfig)
	}
	a := c.AdamW
	a.TotalSteps = c.Steps
	return a.Validate()
}

// TrainResult summarizes a run.
type TrainResult struct {
	StartStep, EndStep int       // steps [StartStep, EndStep) ran in this call
	Losses             []float32 // training loss of each step run
	ValLosses          map[int]float32
	TokensPerSec       float64
	Interrupted        bool   // stopped by ctx; a checkpoint was saved
	Checkpoint         string // path of the last checkpoint written, if any
	Device             string
	Params             int
}

// runIdentity is what must match between a checkpoint and a resumed run.
type runIdentity struct {
	Preset string `json:"preset"`
	Seed   uint64 `json:"seed"`
	Batch  int    `json:"batch"`
	SeqLen int    `json:"seq_len"`
	Corpus string `json:"corpus"` // fingerprint
	// Tokenizer is "" for byte (checkpoints from before tokenizers).
	Tokenizer string `json:"tokenizer,omitempty"`
}

// Train runs single-process training until cfg.Steps or until ctx is
// cancelled, in which case it saves a checkpoint and returns with
// Interrupted set and a nil error.
func Train(ctx context.Context, cfg TrainConfig) (*TrainResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	ckPath := ""
	if cfg.Out != "" {
		ckPath = filepath.Join(cfg.Out, CheckpointFile)
		if _, err := os.Lstat(ckPath); err == nil && !cfg.Resume && !cfg.Force {
			return nil, fmt.Errorf("%w: %s; pass --resume to continue from it or --force to start over and replace it",
				ErrCheckpointExists, ckPath)
		}
		removed, err := atomicfile.RemoveStale(cfg.Out, atomicfile.ProcessStart())
		if err != nil {
			return nil, fmt.Errorf("trainer: %w", err)
		}
		if len(removed) > 0 {
			log.Info("removed temporary files left by a crash", "dir", cfg.Out, "files", removed)
		}
	}
	acfg := cfg.AdamW
	acfg.TotalSteps = cfg.Steps
	valBatches := 0
	if cfg.EvalEvery > 0 {
		valBatches = cfg.EvalBatches
	}
	var tokProgress func(done, total int64)
	if cfg.Tokenizer != "" && cfg.Tokenizer != "byte" && cfg.Progress != nil {
		last := time.Now()
		tokProgress = func(done, total int64) {
			if time.Since(last) >= time.Second || done == total {
				last = time.Now()
				fmt.Fprintf(cfg.Progress, "\rtokenizing the corpus with %s: %.0f of %.0f MB", cfg.Tokenizer, float64(done)/1e6, float64(total)/1e6)
				if done == total {
					fmt.Fprintln(cfg.Progress)
				}
			}
		}
	}
	var packed *data.PackedSource
	var fingerprint string
	if cfg.Dataset != "" {
		var err error
		if packed, err = data.OpenPackedDir(cfg.Dataset); err != nil {
			return nil, err
		}
		ds := packed.Dataset()
		if cfg.Tokenizer != "" && cfg.Tokenizer != ds.Tokenizer {
			return nil, fmt.Errorf("%w: --tokenizer %s, but the dataset in %s was packed with %s", ErrConfig, cfg.Tokenizer, cfg.Dataset, ds.Tokenizer)
		}
		cfg.Tokenizer = ds.Tokenizer
		h := fnv.New64a()
		for _, sh := range ds.AllShards() {
			h.Write([]byte(sh.Name))
		}
		fingerprint = "dataset:" + strconv.FormatUint(h.Sum64(), 16)
		log.Info("dataset", "dir", cfg.Dataset, "tokenizer", ds.Tokenizer, "train_tokens", ds.SplitTokens(data.Train),
			"val_tokens", ds.SplitTokens(data.Validation))
	}
	scfg := SetupConfig{Preset: cfg.Preset, Batch: cfg.Batch, SeqLen: cfg.SeqLen, Seed: cfg.Seed,
		Threads: cfg.Threads, Dev: cfg.Dev, CorpusPaths: cfg.Corpus, AdamW: acfg, ValBatches: valBatches,
		Tokenizer: cfg.Tokenizer, Progress: tokProgress}
	if packed != nil {
		scfg.Source, scfg.Progress = packed, nil
	}
	su, err := NewSetup(scfg)
	if err != nil {
		return nil, err
	}
	defer su.Close()
	mc, T, corpus, stage, dev := su.Model, su.T, su.Corpus, su.Stage, su.Dev
	if corpus != nil {
		st := corpus.Stats()
		log.Info("corpus", "train_files", st.Train.Files, "train_bytes", st.Train.Bytes,
			"val_files", st.Validation.Files, "val_bytes", st.Validation.Bytes)
		fingerprint = strconv.FormatUint(corpus.Fingerprint(), 16)
	}
	id := runIdentity{Preset: mc.Name, Seed: cfg.Seed, Batch: cfg.Batch, SeqLen: T, Corpus: fingerprint}
	if su.Tokenizer != "byte" {
		id.Tokenizer = su.Tokenizer
	}
	idJSON, _ := json.Marshal(id)

	res := &TrainResult{ValLosses: map[int]float32{}, Device: dev.Name(), Params: stage.NumParams()}
	start := 0
	if cfg.Resume {
		ck, err := model.LoadCheckpoint(ckPath)
		switch {
		case errors.Is(err, os.ErrNotExist):
			log.Info("no checkpoint to resume; starting fresh", "path", ckPath)
		case err != nil:
			return nil, err
		default:
			var got runIdentity
			if err := json.Unmarshal([]byte(ck.Meta["skein.run"]), &got); err != nil || got != id {
				return nil, fmt.Errorf("%w: %s was made with %s, this run is %s", ErrResumeMismatch, ckPath, ck.Meta["skein.run"], idJSON)
			}
			if err := stage.Restore(ck); err != nil {
				return nil, err
			}
			start = ck.Step
			log.Info("resumed", "path", ckPath, "step", start)
		}
	}
	res.StartStep, res.EndStep = start, start

	var metrics *os.File
	if cfg.Out != "" {
		if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
			return nil, fmt.Errorf("trainer: creating output directory: %w", err)
		}
		mpath := filepath.Join(cfg.Out, "metrics.jsonl")
		if err := trimMetrics(mpath, start); err != nil {
			return nil, err
		}
		metrics, err = os.OpenFile(mpath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("trainer: opening metrics: %w", err)
		}
		defer metrics.Close()
	}
	// Checkpoints are written in the background (Checkpointer): the loop
	// waits only for the copy to host memory; the last one is waited for.
	var cp *Checkpointer
	if ckPath != "" {
		cp = NewCheckpointer(ckPath)
		defer cp.Wait()
	}
	save := func(step int, last bool) error {
		if cp == nil {
			return nil
		}
		if err := cp.Save(stage, step, map[string]string{"skein.run": string(idJSON), model.MetaTokenizer: su.Tokenizer}); err != nil {
			return err
		}
		if last {
			if err := cp.Wait(); err != nil {
				return err
			}
			stalled, wrote, n := cp.Stats()
			log.Debug("checkpoints", "saves", n, "training_waited", stalled, "written_in_background", wrote)
		}
		res.Checkpoint = ckPath
		return nil
	}

	bar := NewProgress(cfg.Progress, start, cfg.Steps, cfg.Batch*T)
	began := time.Now()
	for step := start; step < cfg.Steps; step++ {
		if ctx.Err() != nil {
			res.Interrupted = true
			break
		}
		r, err := su.Step(step)
		if err != nil {
			return res, err
		}
		loss := r.Loss
		res.Losses = append(res.Losses, loss)
		res.EndStep = step + 1
		rec := map[string]any{"step": step, "loss": loss, "lr": r.LR, "grad_norm": r.GradNorm}
		if su.Val != nil && ((step+1)%cfg.EvalEvery == 0 || step+1 == cfg.Steps) {
			vl, err := su.Eval()
			if err != nil {
				return res, err
			}
			res.ValLosses[step+1] = vl
			rec["val_loss"] = vl
			bar.Note(fmt.Sprintf("step %d: val loss %.4f", step+1, vl))
			log.Debug("validation", "step", step+1, "val_loss", vl)
		}
		if metrics != nil {
			b, _ := json.Marshal(rec)
			metrics.Write(append(b, '\n'))
		}
		bar.Update(step+1, loss)
		if cfg.OnStep != nil {
			cfg.OnStep(step, loss)
		}
		if cfg.CheckpointEvery > 0 && (step+1)%cfg.CheckpointEvery == 0 && step+1 < cfg.Steps {
			if err := save(step+1, false); err != nil {
				return res, err
			}
		}
	}
	elapsed := time.Since(began).Seconds()
	if n := res.EndStep - res.StartStep; n > 0 && elapsed > 0 {
		res.TokensPerSec = float64(n*cfg.Batch*T) / elapsed
	}
	bar.Done()
	if err := save(res.EndStep, true); err != nil {
		return res, err
	}
	if n := len(res.Losses); n > 0 && (math.IsNaN(float64(res.Losses[n-1]))) {
		return res, fmt.Errorf("trainer: training diverged")
	}
	return res, nil
}

// BenchResult is the measured training throughput of BenchTrain.
type BenchResult struct {
	Preset       string  `json:"preset"`
	Batch        int     `json:"batch"`
	SeqLen       int     `json:"seq_len"`
	Threads      int     `json:"threads"`
	Steps        int     `json:"steps"`
	Device       string  `json:"device"`
	Loss         float32 `json:"loss"`
	TokensPerSec float64 `json:"tokens_per_sec"`
	GFLOPS       float64 `json:"gflops"`
}

// BenchTrain times full training steps (forward, backward, clip, AdamW) of
// a preset on fixed random tokens, after warmup untimed steps. It is the
// counterpart of bench/torch_gpt.py.
//
// dev nil means the CPU with threads workers. On a GPU the clock stops
// after the last step's update has finished (a read of the parameters).
func BenchTrain(ctx context.Context, dev kernels.Device, preset string, batch, threads, steps, warmup int) (*BenchResult, error) {
	mc, err := model.Preset(preset)
	if err != nil {
		return nil, err
	}
	if batch <= 0 || steps <= 0 || warmup < 0 || threads < 0 {
		return nil, fmt.Errorf("%w: batch %d, steps %d, warmup %d, threads %d", ErrConfig, batch, steps, warmup, threads)
	}
	T := mc.MaxT
	if dev == nil {
		dev = kernels.NewCPU(threads)
	}
	stage, err := model.NewStage(dev, mc, model.FullSpec(mc), batch, T, 1)
	if err != nil {
		return nil, err
	}
	a := optimizer.DefaultAdamW()
	a.TotalSteps = steps + warmup
	opt, err := optimizer.NewAdamW(a)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(1, 2))
	in, tg := make([]int32, batch*T), make([]int32, batch*T)
	for i := range in {
		in[i], tg[i] = int32(rng.IntN(mc.Vocab)), int32(rng.IntN(mc.Vocab))
	}
	var loss float32
	var began time.Time
	for i := 0; i < warmup+steps; i++ {
		if i == warmup {
			began = time.Now()
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if loss, err = stage.Forward(in, nil, tg); err != nil {
			return nil, err
		}
		stage.ZeroGrad()
		if err := stage.Backward(nil); err != nil {
			return nil, err
		}
		if _, _, err := opt.Step(stage, i); err != nil {
			return nil, err
		}
	}
	dev.CopyOut(make([]float32, 1), stage.Params.Slice(0, 1))
	if err := kernels.Err(dev); err != nil {
		return nil, err
	}
	sec := time.Since(began).Seconds()
	tps := float64(batch*T*steps) / sec
	return &BenchResult{Preset: preset, Batch: batch, SeqLen: T, Threads: dev.Threads(), Steps: steps,
		Device: dev.Name(), Loss: loss, TokensPerSec: tps, GFLOPS: tps * mc.FlopsPerToken(T) / 1e9}, nil
}

// trimMetrics keeps the records of steps before start: after a crash the
// steps since the last checkpoint run again and must not appear twice.
func trimMetrics(path string, start int) error {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("trainer: reading metrics: %w", err)
	}
	var kept []byte
	for _, line := range bytes.Split(raw, []byte("\n")) {
		var rec struct {
			Step *int `json:"step"`
		}
		if json.Unmarshal(line, &rec) == nil && rec.Step != nil && *rec.Step < start {
			kept = append(append(kept, line...), '\n')
		}
	}
	if len(kept) == len(raw) {
		return nil
	}
	return atomicfile.WriteFile(path, kept, 0o644)
}
