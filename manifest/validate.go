package manifest

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/model"
)

// invalidError is a bad manifest: "manifest: <msg>". It matches ErrInvalid
// and unwraps to its cause (a toml.ParseError, for example) if any.
type invalidError struct {
	msg   string
	cause error
}

func (e *invalidError) Error() string        { return "manifest: " + e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }
func (e *invalidError) Unwrap() error        { return e.cause }

// literal is a value that bad prints as is, not quoted.
type literal string

// bad returns the error for field = value: "manifest: field = value: why".
// Strings are quoted.
func bad(field string, value any, why string, args ...any) error {
	if s, ok := value.(string); ok {
		value = fmt.Sprintf("%q", s)
	}
	return &invalidError{msg: fmt.Sprintf("%s = %v: %s", field, value, fmt.Sprintf(why, args...))}
}

// Validate reports the first invalid field, in the order of the struct's
// fields, as "manifest: optimizer.inner_steps = 0: must be positive"; the
// error matches ErrInvalid.
func (m Manifest) Validate() error {
	if err := m.ValidateTemplate(); err != nil {
		return err
	}
	if m.Data.Source == SourceShards && len(m.Data.Shards) == 0 {
		return bad("data.shards", literal("[]"), "data.source = %q needs at least one shard", SourceShards)
	}
	if m.Data.Source == SourceDataset {
		if len(m.Data.Shards) == 0 {
			return bad("data.shards", literal("[]"), "data.source = %q needs the dataset's shards (skein bootstrap --dataset DIR fills them in)", SourceDataset)
		}
		if _, err := m.Data.Dataset(); err != nil {
			return bad("data.shards", entries(len(m.Data.Shards)), "not a packed dataset: %v", err)
		}
	}
	return nil
}

// ValidateTemplate is Validate for the manifest a bootstrap starts from: a
// run whose data source is "shards" may list none yet, because the
// bootstrap packs its corpus and fills them in (then Validate must pass).
func (m Manifest) ValidateTemplate() error {
	if err := validRunID(m.RunID); err != nil {
		return err
	}
	if m.Version != Version {
		return bad("version", m.Version, "this skein reads manifest version %d only", Version)
	}
	if m.Created != "" {
		if _, err := time.Parse(time.RFC3339, m.Created); err != nil {
			return bad("created", m.Created, "want an RFC 3339 time such as \"2025-06-01T12:00:00Z\"")
		}
	}
	for _, check := range []func() error{m.Model.validate, m.Optimizer.validate, m.Wire.validate, m.Data.validate, m.Admission.validate, m.validatePipeline} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validRunID is p2p.ValidateRunID's rule, written again so that this package
// does not import p2p.
func validRunID(id string) error {
	if id == "" || len(id) > MaxRunIDLen {
		return bad("run_id", id, "length %d out of range [1, %d]", len(id), MaxRunIDLen)
	}
	for _, c := range id {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return bad("run_id", id, "character %q not in [A-Za-z0-9._-]", c)
		}
	}
	return nil
}

func (s Model) validate() error {
	cfg, err := model.Preset(s.Preset)
	if err != nil {
		return bad("model.preset", s.Preset, "want one of %s", quoteAll(model.PresetNames()))
	}
	switch {
	case s.Seed > MaxSeed:
		return bad("model.seed", s.Seed, "must be at most %d (TOML integers are signed 64-bit)", uint64(MaxSeed))
	case s.Batch <= 0 || s.Batch > MaxBatch:
		return bad("model.batch", s.Batch, "out of range [1, %d]", MaxBatch)
	case s.SeqLen < 0 || s.SeqLen > cfg.MaxT:
		return bad("model.seq_len", s.SeqLen, "out of range [1, %d] (the %s preset's context), or 0 for the context", cfg.MaxT, s.Preset)
	}
	return nil
}

func (o Optimizer) validate() error {
	switch {
	case o.Kind != KindDiLoCo && o.Kind != KindNoLoCo:
		return bad("optimizer.kind", o.Kind, "want %q or %q", KindDiLoCo, KindNoLoCo)
	case o.InnerSteps <= 0:
		return bad("optimizer.inner_steps", o.InnerSteps, "must be positive")
	case !positive(o.InnerLR):
		return bad("optimizer.inner_lr", o.InnerLR, "must be positive and finite")
	case o.TotalSteps <= 0:
		// Checked before warmup, whose bound it is.
		return bad("optimizer.total_steps", o.TotalSteps, "must be positive")
	case o.Warmup < 0 || o.Warmup > o.TotalSteps:
		return bad("optimizer.warmup", o.Warmup, "out of range [0, %d] (optimizer.total_steps)", o.TotalSteps)
	case !nonNegative(o.WeightDecay):
		return bad("optimizer.weight_decay", o.WeightDecay, "must be >= 0 and finite")
	case !nonNegative(o.GradClip):
		return bad("optimizer.grad_clip", o.GradClip, "must be >= 0 and finite (0 disables clipping)")
	case !positive(o.OuterLR):
		return bad("optimizer.outer_lr", o.OuterLR, "must be positive and finite")
	case !(o.OuterMomentum >= 0 && o.OuterMomentum < 1):
		return bad("optimizer.outer_momentum", o.OuterMomentum, "out of range [0, 1)")
	case o.GroupSize < MinGroupSize || o.GroupSize > MaxGroupSize:
		return bad("optimizer.group_size", o.GroupSize, "out of range [%d, %d]", MinGroupSize, MaxGroupSize)
	case !nonNegative(o.Gamma):
		return bad("optimizer.gamma", o.Gamma, "must be >= 0 and finite")
	}
	return nil
}

func (w Wire) validate() error {
	if _, ok := codecByName(w.Codec); !ok {
		return bad("wire.codec", w.Codec, "want one of %s", quoteAll(codecNames()))
	}
	if b := w.BlockSize; b != 0 && (b < compression.MinBlockSize || b > compression.MaxBlockSize || b%8 != 0) {
		return bad("wire.block_size", b, "want 0 (the default, %d) or a multiple of 8 in [%d, %d]", compression.DefaultBlockSize, compression.MinBlockSize, compression.MaxBlockSize)
	}
	switch w.Outer {
	case "", OuterDense:
		if w.SupportK != 0 || w.ResidualDecay != 0 || w.Rotate || w.Tiled {
			return bad("wire.outer", w.Outer, "a dense exchange takes no support_k, residual_decay, rotate or tiled")
		}
		if w.Codec == compression.Int2.String() || w.Codec == compression.Sign.String() {
			return bad("wire.codec", w.Codec, "only with wire.outer = %q, whose residual keeps what its rounding loses", OuterSupport)
		}
		return nil
	case OuterSupport:
		if w.SupportK < 1 || w.SupportK > SupportChunk {
			return bad("wire.support_k", w.SupportK, "out of range [1, %d] (coordinates of every %d)", SupportChunk, SupportChunk)
		}
	default:
		return bad("wire.outer", w.Outer, "want %q or %q", OuterDense, OuterSupport)
	}
	if !(w.ResidualDecay >= 0 && w.ResidualDecay <= 1) {
		return bad("wire.residual_decay", w.ResidualDecay, "out of range [0, 1] (0: no residual)")
	}
	if w.Tiled && !w.Rotate {
		return bad("wire.tiled", w.Tiled, "only with wire.rotate (a plain support takes half by the momentum, chunk by chunk)")
	}
	return nil
}

func (d Data) validate() error {
	tokenizers := data.TokenizerNames()
	switch {
	case d.Tokenizer != "" && !slices.Contains(tokenizers, d.Tokenizer):
		return bad("data.tokenizer", d.Tokenizer, "want one of %s", quoteAll(tokenizers))
	case d.TokenizerHash != "" && !isSHA256Hex(d.TokenizerHash):
		return bad("data.tokenizer_hash", d.TokenizerHash, "want 64 lowercase hex digits (a SHA-256)")
	case d.Source != SourceShards && d.Source != SourceLocal && d.Source != SourceDataset:
		return bad("data.source", d.Source, "want %q, %q or %q", SourceShards, SourceLocal, SourceDataset)
	case !(d.ValFraction > 0 && d.ValFraction < 0.5):
		return bad("data.val_fraction", d.ValFraction, "out of range (0, 0.5)")
	case d.ShardBytes <= 0 || d.ShardBytes > MaxShardBytes:
		return bad("data.shard_bytes", d.ShardBytes, "out of range [1, %d]", MaxShardBytes)
	case d.Source == SourceLocal && len(d.Shards) > 0:
		return bad("data.shards", entries(len(d.Shards)),
			"must be empty when data.source = %q (set data.source = %q to train on them)", SourceLocal, SourceShards)
	case len(d.Shards) > MaxShards:
		return bad("data.shards", entries(len(d.Shards)), "at most %d entries", MaxShards)
	case d.Epochs < 0 || d.Epochs > 1<<32:
		return bad("data.epochs", d.Epochs, "out of range [0, %d] (0: no limit)", int64(1)<<32)
	case d.MaxTokens < 0:
		return bad("data.max_tokens", d.MaxTokens, "must be >= 0 (0: no limit)")
	case (d.Epochs != 0 || d.MaxTokens != 0) && d.Source != SourceDataset:
		return bad("data.source", d.Source, "data.epochs and data.max_tokens end runs over a packed dataset (data.source = %q) only", SourceDataset)
	}
	seen := make(map[string]int, len(d.Shards))
	for i, s := range d.Shards {
		field := fmt.Sprintf("data.shards[%d]", i)
		switch {
		case !isSHA256Hex(s.Hash):
			return bad(field+".hash", s.Hash, "want 64 lowercase hex digits (a SHA-256)")
		case s.Bytes <= 0 || s.Bytes > MaxShardBytes:
			return bad(field+".bytes", s.Bytes, "out of range [1, %d]", MaxShardBytes)
		case d.Source != SourceDataset && (s.Files <= 0 || s.Files > MaxShardFiles):
			return bad(field+".files", s.Files, "out of range [1, %d]", MaxShardFiles)
		case d.Source != SourceDataset && (s.Tokens != 0 || s.Documents != 0 || s.Split != ""):
			return bad(field, literal("tokens, documents, split"), "apply to data.source = %q only", SourceDataset)
		case d.Source == SourceDataset && s.Files != 0:
			return bad(field+".files", s.Files, "a dataset's token shards hold no files; leave it out")
		case d.Source == SourceDataset && (s.Tokens <= 0 || s.Tokens > data.MaxShardTokens):
			return bad(field+".tokens", s.Tokens, "out of range [1, %d]", data.MaxShardTokens)
		case d.Source == SourceDataset && (s.Documents < 0 || s.Documents > s.Tokens):
			return bad(field+".documents", s.Documents, "out of range [0, %d] (its tokens)", s.Tokens)
		case s.Split != "" && s.Split != SplitValidation:
			return bad(field+".split", s.Split, "want %q or nothing (train)", SplitValidation)
		}
		if j, dup := seen[s.Hash]; dup {
			return bad(field+".hash", s.Hash, "the same shard as data.shards[%d]", j)
		}
		seen[s.Hash] = i
	}
	return nil
}

// entries describes a shard list by its length: "[1 entry]", "[3 entries]".
func entries(n int) literal {
	if n == 1 {
		return "[1 entry]"
	}
	return literal(fmt.Sprintf("[%d entries]", n))
}

func (a Admission) validate() error {
	switch {
	case a.Mode != AdmissionOpen && a.Mode != AdmissionClosed:
		return bad("admission.mode", a.Mode, "want %q or %q", AdmissionOpen, AdmissionClosed)
	case a.MaxMembers < 1 || a.MaxMembers > MaxMembers:
		return bad("admission.max_members", a.MaxMembers, "out of range [1, %d]", MaxMembers)
	case a.Mode == AdmissionClosed && a.MaxPerPrefix != DefaultMaxPerPrefix:
		return bad("admission.max_per_prefix", a.MaxPerPrefix, "applies to open runs only (a closed run admits by token); leave it out")
	case a.Mode == AdmissionOpen && (a.MaxPerPrefix < 1 || a.MaxPerPrefix > a.MaxMembers):
		return bad("admission.max_per_prefix", a.MaxPerPrefix, "out of range [1, %d] (admission.max_members)", a.MaxMembers)
	case a.Mode == AdmissionOpen && a.RunKey != "":
		return bad("admission.run_key", a.RunKey, "applies to closed runs only (set admission.mode = %q to use it)", AdmissionClosed)
	case a.Mode == AdmissionClosed && a.RunKey == "":
		return bad("admission.run_key", a.RunKey, "a closed run needs the run's public key (`skein token keygen` prints it)")
	}
	if a.Mode == AdmissionClosed {
		if _, err := decodeRunKey(a.RunKey); err != nil {
			return bad("admission.run_key", a.RunKey, "%v: want the standard base64 of a 32-byte ed25519 public key, as `skein token keygen` prints it", err)
		}
	}
	return nil
}

func (m Manifest) validatePipeline() error {
	p := m.Pipeline
	layers := 0
	if c, err := model.Preset(m.Model.Preset); err == nil {
		layers = c.Layers
	}
	switch {
	case p.Stages < 1 || p.Stages > layers+1:
		return bad("pipeline.stages", p.Stages, "out of range [1, %d] (stage 0 and one stage per layer of the %s preset at most)", layers+1, m.Model.Preset)
	case p.Stages > 1 && m.Data.Tokenized():
		return bad("data.tokenizer", m.Data.Tokenizer, "staged runs (pipeline.stages = %d) train on bytes only for now", p.Stages)
	case m.Wire.Compacted() && (p.Stages > 1 || m.Optimizer.Kind != KindDiLoCo):
		return bad("wire.outer", m.Wire.Outer, "a compacted outer exchange needs a one-stage DiLoCo run for now (pipeline.stages %d, optimizer.kind %q)", p.Stages, m.Optimizer.Kind)
	case !(p.SkipRatio >= 0 && p.SkipRatio < 1):
		return bad("pipeline.skip_ratio", p.SkipRatio, "out of range [0, 1)")
	case math.Abs(p.SkipRatio*float64(p.Stages)-float64(p.Skip())) > 1e-6:
		return bad("pipeline.skip_ratio", p.SkipRatio, "skips %.3g of %d stages: S x skip_ratio must be a whole number", p.SkipRatio*float64(p.Stages), p.Stages)
	case p.Skip() > MaxSkip || (p.Stages > 1 && p.Skip() > p.Stages-2):
		return bad("pipeline.skip_ratio", p.SkipRatio, "skips %d stages: at most %d, and stage 0 and one other are always visited", p.Skip(), MaxSkip)
	case !p.Staged() && (p.SkipRatio != 0 || p.CheckFreePlus):
		return bad("pipeline.stages", p.Stages, "skip_ratio and checkfree_plus apply to a staged run (stages of 2 or more)")
	case p.Microbatches < 1 || p.Microbatches > MaxMicrobatches:
		return bad("pipeline.microbatches", p.Microbatches, "out of range [1, %d]", MaxMicrobatches)
	}
	return nil
}

// positive reports x > 0 and finite (false for NaN).
func positive(x float64) bool { return x > 0 && !math.IsInf(x, 1) }

// nonNegative reports x >= 0 and finite (false for NaN).
func nonNegative(x float64) bool { return x >= 0 && !math.IsInf(x, 1) }

func isSHA256Hex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := range len(s) {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// codecByName returns the compression codec whose String is name.
func codecByName(name string) (compression.Codec, bool) {
	for _, c := range compression.Codecs() {
		if c.String() == name {
			return c, true
		}
	}
	return 0, false
}

// codecNames lists the codec names, sorted.
func codecNames() []string {
	var names []string
	for _, c := range compression.Codecs() {
		names = append(names, c.String())
	}
	slices.Sort(names)
	return names
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}
