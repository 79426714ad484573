package trainer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
)

// SetupConfig names everything the setup chain needs: which model, which
// data stream, which device and which inner optimizer.
type SetupConfig struct {
	Preset string
	Batch  int // sequences per step
	SeqLen int // tokens per sequence; 0 means the preset's context
	Seed   uint64
	// Threads for the CPU device; 0 means all cores.
	Threads int
	// Dev, if set, is used instead of a new CPU device with Threads (several
	// in-process workers share one).
	Dev kernels.Device

	// Corpus, if set, is used as is (and not closed by Setup.Close);
	// otherwise CorpusPaths are opened (empty: the Go standard library
	// sources of the local Go installation).
	Corpus      *data.Corpus
	CorpusPaths []string
	// Source, if set, is the token stream instead of a corpus (a packed
	// dataset, already in the tokenizer's ids: data.PackedSource); Corpus
	// and CorpusPaths are then ignored.
	Source data.TokenSource
	// Tokenizer names the tokenizer (data.NewTokenizer; "" is byte). Any
	// other than byte tokenizes the corpus in memory first
	// (data.Tokenize) and gives the model its vocabulary (padded to a
	// multiple of 64 rows for the kernels).
	Tokenizer string
	// Progress, if set, is told the bytes tokenized so far.
	Progress func(done, total int64)
	// Worker and Workers select this worker's disjoint batch stream;
	// Workers 0 means 1.
	Worker, Workers int

	// AdamW is the inner optimizer; TotalSteps must be set.
	AdamW optimizer.AdamWConfig
	// ValBatches > 0 builds a validation loader over the held-out split.
	ValBatches int
	// Init, if set, replaces the seeded initial parameters (warm start);
	// its optimizer moments are not used.
	Init *model.Checkpoint

	// HostCopies is how many more float32 copies of the parameters the
	// caller keeps beside the stage (an outer optimizer's phi, momentum and
	// buffers); they count in the memory check.
	HostCopies int
	// MemAvailable is the memory the setup may take, in bytes; 0 means the
	// system's figure (MemAvailable of /proc/meminfo on Linux; elsewhere no
	// check). A model that needs more is refused (ErrMemory) before
	// anything is allocated.
	MemAvailable uint64
}

// Setup is one model ready to train: the single chain preset -> corpus ->
// loader -> device -> stage -> AdamW that `skein train`, every volunteer and
// every in-process experiment share, so that they cannot drift apart.
type Setup struct {
	Model     model.Config
	T         int
	Tokenizer string // its name ("byte" unless SetupConfig.Tokenizer says)
	Corpus    *data.Corpus
	// Tokens is the corpus through the tokenizer; nil for byte.
	Tokens *data.TokenizedCorpus
	Loader *data.Loader
	Val    *data.Loader // nil unless ValBatches > 0
	Dev    kernels.Device
	Stage  *model.Stage
	Opt    *optimizer.AdamW

	valBatches int
	in, tg     []int32
	ownsCorpus bool
}

// NewSetup builds the chain. Close releases the corpus when Setup opened it.
func NewSetup(cfg SetupConfig) (*Setup, error) {
	mc, err := model.Preset(cfg.Preset)
	if err != nil {
		return nil, err
	}
	tokName := cfg.Tokenizer
	if tokName == "" {
		tokName = "byte"
	}
	tok, err := data.NewTokenizer(tokName)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if tokName != "byte" {
		mc = mc.WithVocab(tok.VocabSize())
	}
	T := cfg.SeqLen
	if T == 0 {
		T = mc.MaxT
	}
	switch {
	case cfg.Batch <= 0:
		return nil, fmt.Errorf("%w: batch %d must be positive", ErrConfig, cfg.Batch)
	case T < 0 || T > mc.MaxT:
		return nil, fmt.Errorf("%w: sequence length %d outside [1, %d] (the %s context)", ErrConfig, T, mc.MaxT, mc.Name)
	case cfg.Threads < 0:
		return nil, fmt.Errorf("%w: threads %d must be >= 0", ErrConfig, cfg.Threads)
	case cfg.HostCopies < 0:
		return nil, fmt.Errorf("%w: host copies %d must be >= 0", ErrConfig, cfg.HostCopies)
	}
	dev := cfg.Dev
	if dev == nil {
		dev = kernels.NewCPU(cfg.Threads)
	}
	if err := checkMemory(mc, cfg.Batch, T, cfg.HostCopies, cfg.MemAvailable, dev); err != nil {
		return nil, err
	}
	s := &Setup{Model: mc, T: T, Tokenizer: tokName, Corpus: cfg.Corpus, valBatches: cfg.ValBatches, Dev: dev}
	if cfg.Source != nil {
		s.Corpus = nil
	} else if s.Corpus == nil {
		if s.Corpus, err = OpenCorpus(cfg.CorpusPaths); err != nil {
			return nil, err
		}
		s.ownsCorpus = true
	}
	fail := func(err error) (*Setup, error) {
		s.Close()
		return nil, err
	}
	workers := max(cfg.Workers, 1)
	src := cfg.Source
	if src == nil && tokName != "byte" {
		if s.Tokens, err = data.Tokenize(context.Background(), s.Corpus, tok, cfg.Progress); err != nil {
			return fail(err)
		}
		src = s.Tokens
	}
	lcfg := data.LoaderConfig{Seed: cfg.Seed, Worker: cfg.Worker, Workers: workers, B: cfg.Batch, T: T}
	if src != nil {
		s.Loader, err = data.NewTokenLoader(src, data.Train, lcfg)
	} else {
		s.Loader, err = data.NewLoader(s.Corpus, data.Train, lcfg)
	}
	if err != nil {
		return fail(err)
	}
	if cfg.ValBatches > 0 {
		vcfg := data.LoaderConfig{Seed: data.ValidationSeed, Workers: 1, B: cfg.Batch, T: T}
		if src != nil {
			s.Val, err = data.NewTokenLoader(src, data.Validation, vcfg)
		} else {
			s.Val, err = data.NewValidationLoader(s.Corpus, cfg.Batch, T)
		}
		if errors.Is(err, data.ErrCorpusTooSmall) && cfg.Source != nil {
			s.Val, err = nil, nil // a dataset packed without a validation split
		}
		if err != nil {
			return fail(err)
		}
	}
	if s.Stage, err = model.NewStage(s.Dev, mc, model.FullSpec(mc), cfg.Batch, T, cfg.Seed); err != nil {
		return fail(err)
	}
	if cfg.Init != nil {
		if len(cfg.Init.Params) != s.Stage.NumParams() {
			return fail(fmt.Errorf("%w: initial checkpoint has %d parameters, the model %d", ErrConfig, len(cfg.Init.Params), s.Stage.NumParams()))
		}
		s.Dev.CopyIn(s.Stage.Params, cfg.Init.Params)
	}
	if s.Opt, err = optimizer.NewAdamW(cfg.AdamW); err != nil {
		return fail(err)
	}
	s.in, s.tg = make([]int32, cfg.Batch*T), make([]int32, cfg.Batch*T)
	return s, nil
}

// TokensPerStep is batch x sequence length.
func (s *Setup) TokensPerStep() int { return len(s.in) }

// Step runs training step `step` on its batch: forward, backward and a
// clipped AdamW update.
func (s *Setup) Step(step int) (StepResult, error) {
	return trainStep(s.Stage, s.Opt, s.Loader, step, s.in, s.tg)
}

// Eval returns the mean loss over the first ValBatches batches of the
// held-out split (the same batches every time, on every worker).
func (s *Setup) Eval() (float32, error) {
	if s.Val == nil {
		return 0, fmt.Errorf("%w: no validation loader (ValBatches is 0)", ErrConfig)
	}
	return evalLoss(s.Stage, s.Val, s.valBatches, s.in, s.tg)
}

// Close releases the corpus if Setup opened it.
func (s *Setup) Close() error {
	if s.ownsCorpus && s.Corpus != nil {
		return s.Corpus.Close()
	}
	return nil
}

// WorkerSlot maps a volunteer's name (its peer ID) to one of `slots` batch
// streams. Volunteers are not numbered, so each draws its stream by a hash
// of its name; two collide with probability 1/slots.
func WorkerSlot(name string, slots int) int {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int(h.Sum64() % uint64(slots))
}

// OpenCorpus opens paths, or the default corpus when there are none.
func OpenCorpus(paths []string) (*data.Corpus, error) {
	return data.OpenPaths(paths, 0)
}
