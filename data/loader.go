package data

import (
	"fmt"
	"math"
)

// ValidationSeed is the fixed seed of NewValidationLoader, so every node and
// every run on the same corpus evaluates the same held-out batches.
const ValidationSeed uint64 = 0x5eed_0f_5ce1_0a1d

// maxBatchTokens bounds B*T so buffer sizes and sample numbers stay far from
// overflow.
const maxBatchTokens = 1 << 30

// LoaderConfig selects a worker's stream of batches.
type LoaderConfig struct {
	// Seed selects the permutation of windows; workers of one run share it.
	Seed uint64
	// Worker is this worker's id in [0, Workers).
	Worker int
	// Workers is the number of workers drawing disjoint streams, >= 1.
	Workers int
	// B is the number of sequences per batch, >= 1.
	B int
	// T is the sequence length in tokens, >= 1. Each sequence reads a window
	// of T+1 tokens: T inputs and T targets.
	T int
}

// Validate reports the first field out of range, wrapping ErrInvalidConfig.
func (c LoaderConfig) Validate() error {
	switch {
	case c.Workers < 1:
		return fmt.Errorf("data: LoaderConfig.Workers = %d, must be >= 1: %w", c.Workers, ErrInvalidConfig)
	case c.Worker < 0 || c.Worker >= c.Workers:
		return fmt.Errorf("data: LoaderConfig.Worker = %d out of range [0, %d): %w", c.Worker, c.Workers, ErrInvalidConfig)
	case c.B < 1:
		return fmt.Errorf("data: LoaderConfig.B = %d, must be >= 1: %w", c.B, ErrInvalidConfig)
	case c.T < 1:
		return fmt.Errorf("data: LoaderConfig.T = %d, must be >= 1: %w", c.T, ErrInvalidConfig)
	case int64(c.B)*int64(c.T) > maxBatchTokens:
		return fmt.Errorf("data: LoaderConfig.B*T = %d*%d exceeds %d tokens: %w", c.B, c.T, maxBatchTokens, ErrInvalidConfig)
	}
	return nil
}

// Loader serves one worker's batches from one split of a corpus. A batch is
// a pure function of (corpus, split, Seed, Workers, Worker, B, T, step); see
// the package documentation for the sampling contract. A Loader reuses one
// read buffer and is not safe for concurrent use; loaders sharing a Corpus
// may run concurrently.
type Loader struct {
	src     TokenSource
	split   Split
	cfg     LoaderConfig
	windows uint64

	perm      Permutation // of the epoch permEpoch
	permEpoch uint64
	buf       []int32 // one window

	block *blockDraw // set by UseBlock
}

// blockDraw is a Loader drawing one block's windows (UseBlock).
type blockDraw struct {
	b     Blocks
	slot  Slot
	first int
}

// UseBlock makes the loader draw from slot s's block of b from step first
// on: sequence i of step first+k is the block's window k*B+i (modulo the
// block's windows). It is how a member of a run over a packed dataset
// trains its round's block (see Ledger); the sampling contract above does
// not apply while it is set. ClearBlock undoes it.
func (l *Loader) UseBlock(b Blocks, s Slot, first int) {
	l.block = &blockDraw{b: b, slot: s, first: first}
}

// ClearBlock makes the loader draw by the sampling contract again.
func (l *Loader) ClearBlock() { l.block = nil }

// TokenSource is a token stream per split, read at any offset: a Corpus
// (one token per byte), or a TokenizedCorpus (its files through a
// tokenizer).
type TokenSource interface {
	// Tokens is the length in tokens of split s's stream.
	Tokens(s Split) int64
	// ReadTokens fills dst with split s's tokens from off on; reading past
	// the end is an error.
	ReadTokens(s Split, dst []int32, off int64) error
}

// byteSource is a Corpus as a TokenSource: one token per byte.
type byteSource struct {
	c   *Corpus
	buf []byte
}

func (b *byteSource) Tokens(s Split) int64 { return b.c.Size(s) }

func (b *byteSource) ReadTokens(s Split, dst []int32, off int64) error {
	if cap(b.buf) < len(dst) {
		b.buf = make([]byte, len(dst))
	}
	buf := b.buf[:len(dst)]
	if m, err := b.c.ReadAt(s, buf, off); err != nil || m != len(buf) {
		return fmt.Errorf("%d of %d bytes at %d: %w", m, len(buf), off, err)
	}
	for i, c := range buf {
		dst[i] = int32(c)
	}
	return nil
}

// NewLoader returns a loader over split of c. It fails with ErrInvalidConfig
// for a bad cfg and ErrCorpusTooSmall when the split holds fewer than T+1
// tokens.
func NewLoader(c *Corpus, split Split, cfg LoaderConfig) (*Loader, error) {
	if c == nil {
		return nil, fmt.Errorf("data: NewLoader with nil corpus: %w", ErrInvalidConfig)
	}
	return NewTokenLoader(&byteSource{c: c}, split, cfg)
}

// NewTokenLoader is NewLoader over any token stream (a TokenizedCorpus).
func NewTokenLoader(src TokenSource, split Split, cfg LoaderConfig) (*Loader, error) {
	if src == nil {
		return nil, fmt.Errorf("data: NewTokenLoader with no source: %w", ErrInvalidConfig)
	}
	if split != Train && split != Validation {
		return nil, fmt.Errorf("data: NewLoader split = %v: %w", split, ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	size := src.Tokens(split)
	w := uint64(size) / uint64(cfg.T+1)
	if w == 0 {
		return nil, fmt.Errorf("data: %v split has %d tokens, need at least T+1 = %d: %w", split, size, cfg.T+1, ErrCorpusTooSmall)
	}
	l := &Loader{
		src:     src,
		split:   split,
		cfg:     cfg,
		windows: w,
		buf:     make([]int32, cfg.T+1),
	}
	l.perm = NewPermutation(w, cfg.Seed, 0)
	return l, nil
}

// NewValidationLoader returns the loader of the fixed held-out set: the
// Validation split with ValidationSeed and a single worker. Its batches for
// steps 0..n-1 are the same for every node and independent of training. If
// n*B exceeds Windows, later steps repeat windows in a new order.
func NewValidationLoader(c *Corpus, B, T int) (*Loader, error) {
	return NewLoader(c, Validation, LoaderConfig{Seed: ValidationSeed, Workers: 1, B: B, T: T})
}

// Source is the token stream the loader reads.
func (l *Loader) Source() TokenSource { return l.src }

// Config returns the loader's configuration.
func (l *Loader) Config() LoaderConfig { return l.cfg }

// Windows returns W, the number of windows of T+1 tokens in the split: the
// number of sequences in one epoch across all workers.
func (l *Loader) Windows() uint64 { return l.windows }

// StepsPerEpoch returns W / (Workers*B) rounded up: how many steps the
// workers together take to draw every window once.
func (l *Loader) StepsPerEpoch() uint64 {
	per := uint64(l.cfg.Workers) * uint64(l.cfg.B)
	return (l.windows + per - 1) / per
}

// Window returns the window index and epoch of sequence b of the batch of
// step. The sequence's tokens are the split's bytes [index*(T+1),
// (index+1)*(T+1)).
func (l *Loader) Window(step, b int) (index, epoch uint64) {
	if step < 0 || b < 0 || b >= l.cfg.B {
		panic(fmt.Sprintf("data: Loader.Window(%d, %d) out of range (B = %d)", step, b, l.cfg.B))
	}
	k := l.sample(step, b)
	epoch = k / l.windows
	return l.permFor(epoch).At(k % l.windows), epoch
}

// sample is the global sample number of sequence b at step.
func (l *Loader) sample(step, b int) uint64 {
	return (uint64(step)*uint64(l.cfg.Workers)+uint64(l.cfg.Worker))*uint64(l.cfg.B) + uint64(b)
}

func (l *Loader) permFor(epoch uint64) Permutation {
	if epoch == l.permEpoch {
		return l.perm
	}
	return NewPermutation(l.windows, l.cfg.Seed, epoch)
}

// Batch fills inputs and targets, each of length B*T in (B,T) row-major
// order, with the batch of step: targets[i] is the token after inputs[i].
// It does not allocate once the corpus's open files are cached.
func (l *Loader) Batch(step int, inputs, targets []int32) error {
	B, T := l.cfg.B, l.cfg.T
	if step < 0 {
		return fmt.Errorf("data: Batch step = %d, must be >= 0: %w", step, ErrInvalidConfig)
	}
	if uint64(step) > math.MaxUint64/uint64(l.cfg.Workers)/uint64(B)-1 {
		return fmt.Errorf("data: Batch step = %d overflows the sample count: %w", step, ErrInvalidConfig)
	}
	if len(inputs) != B*T || len(targets) != B*T {
		return fmt.Errorf("data: Batch buffers have len(inputs) = %d, len(targets) = %d, want B*T = %d: %w", len(inputs), len(targets), B*T, ErrInvalidConfig)
	}
	n := int64(T + 1)
	if d := l.block; d != nil {
		if d.b.T != T {
			return fmt.Errorf("data: blocks of windows of %d tokens for a loader of %d: %w", d.b.T+1, T+1, ErrInvalidConfig)
		}
		k := max(step-d.first, 0)
		for b := range B {
			off := d.b.WindowOffset(d.slot, k*B+b)
			if err := l.src.ReadTokens(l.split, l.buf, off); err != nil {
				return fmt.Errorf("data: reading block %d window at %d of the %v split: %w", d.b.Block(d.slot), off, l.split, err)
			}
			copy(inputs[b*T:(b+1)*T], l.buf[:T])
			copy(targets[b*T:(b+1)*T], l.buf[1:])
		}
		return nil
	}
	for b := range B {
		k := l.sample(step, b)
		epoch := k / l.windows
		if epoch != l.permEpoch {
			l.perm, l.permEpoch = NewPermutation(l.windows, l.cfg.Seed, epoch), epoch
		}
		w := l.perm.At(k % l.windows)
		if err := l.src.ReadTokens(l.split, l.buf, int64(w)*n); err != nil {
			return fmt.Errorf("data: reading window %d of the %v split: %w", w, l.split, err)
		}
		copy(inputs[b*T:(b+1)*T], l.buf[:T])
		copy(targets[b*T:(b+1)*T], l.buf[1:])
	}
	return nil
}
