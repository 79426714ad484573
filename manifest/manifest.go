package manifest

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"math"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/pipeline"
)

// Errors. Every error of Parse, Load (other than the file's I/O) and Validate
// matches ErrInvalid under errors.Is; every error of Check matches
// ErrMismatch.
var (
	// ErrInvalid means a manifest is malformed or a value is out of range.
	// The error's text names the field and the value.
	ErrInvalid = errors.New("manifest: invalid")
	// ErrMismatch means a volunteer's own setting disagrees with its run's
	// manifest. The error's text names the field and both values.
	ErrMismatch = errors.New("manifest: volunteer disagrees with the run")
)

// Format version and limits.
const (
	// Version is the only manifest format version this package reads and
	// writes. The canonical encoding (and so every hash) is part of it.
	Version = 1
	// MaxSize bounds a manifest's encoding; Parse and Load refuse larger
	// input before decoding it.
	MaxSize = 256 << 10
	// MaxRunIDLen bounds run_id (the same bound as p2p.MaxRunIDLen).
	MaxRunIDLen = 64
	// MaxBatch bounds model.batch.
	MaxBatch = 4096
	// MinGroupSize and MaxGroupSize bound optimizer.group_size (NoLoCo).
	MinGroupSize, MaxGroupSize = 2, 16
	// MaxShards bounds the number of data.shards entries, so that the
	// canonical encoding of any valid manifest stays within MaxSize.
	MaxShards = 1024
	// MaxShardBytes bounds data.shard_bytes and each shard's bytes (1 GiB).
	MaxShardBytes = 1 << 30
	// MaxShardFiles bounds each shard's files.
	MaxShardFiles = 1 << 20
	// MaxSeed is the largest model.seed: TOML integers are signed 64-bit.
	MaxSeed = 1<<63 - 1
)

// Accepted values of the enumerated string fields.
const (
	KindDiLoCo = "diloco" // optimizer.kind: DiLoCo, the butterfly collective among the round's group
	KindNoLoCo = "noloco" // optimizer.kind: NoLoCo, gossip with small random groups

	SourceShards = "shards" // data.source: the content-addressed shards listed in data.shards
	SourceLocal  = "local"  // data.source: each volunteer's own default corpus
	// SourceDataset (data.source) is a packed dataset (skein data pack):
	// token shards listed in data.shards, served by the bootstrap; each
	// volunteer fetches only the chunks it trains on (data.Ledger).
	SourceDataset = "dataset"
	// SplitValidation marks a data.shards entry of a dataset's validation
	// split (train shards leave split out).
	SplitValidation = "validation"
	// TokenizerByte is data.tokenizer's default: one token per byte.
	TokenizerByte = "byte"

	AdmissionOpen   = "open"   // admission.mode: anyone may join, within admission.max_members and max_per_prefix
	AdmissionClosed = "closed" // admission.mode: members need a join token signed by admission.run_key
)

// Defaults that no other package defines.
const (
	DefaultValFraction = 0.02     // the same as data.DefaultValFraction
	DefaultShardBytes  = 64 << 20 // target shard size when cutting a corpus

	// DefaultMaxMembers is admission.max_members: what a node is sized for
	// (p2p.DefaultLimits' ConnHigh of 256 connections).
	DefaultMaxMembers = 256
	// DefaultMaxPerPrefix is admission.max_per_prefix: members of an open
	// run behind one /24 (IPv4) or /48 (IPv6).
	DefaultMaxPerPrefix = 16
)

// Bounds of the [admission] section.
const (
	// MaxMembers bounds admission.max_members.
	MaxMembers = 1 << 16
	// RunKeyLen is the length of admission.run_key: the standard, padded
	// base64 of a 32-byte ed25519 public key.
	RunKeyLen = 44
)

// Manifest holds every run-wide setting. The zero value is not valid; start
// from Default, or Parse a file. Field comments give each key's TOML name,
// range and meaning; Validate enforces the ranges.
type Manifest struct {
	// RunID names the run in protocol IDs (/skein/<run_id>/...): 1 to
	// MaxRunIDLen characters of [A-Za-z0-9._-].
	RunID string `toml:"run_id"`
	// Version is the manifest format version; it must be Version.
	Version int `toml:"version"`
	// Created, optional, is when the operator wrote the manifest, in RFC
	// 3339 form ("2025-06-01T12:00:00Z"). Informational.
	Created string `toml:"created"`

	Model     Model     `toml:"model"`
	Optimizer Optimizer `toml:"optimizer"`
	Wire      Wire      `toml:"wire"`
	Data      Data      `toml:"data"`
	Admission Admission `toml:"admission"`
	Pipeline  Pipeline  `toml:"pipeline"`
}

// Model is the [model] section: what network every member trains, and how.
type Model struct {
	// Preset is a model.PresetNames() entry ("tiny", "small", "gpt2", ...;
	// "gpt2-124m" is an alias of "gpt2").
	Preset string `toml:"preset"`
	// Seed seeds the initial weights and the data order; at most MaxSeed.
	Seed uint64 `toml:"seed"`
	// Batch is the number of sequences per inner step on each member, in
	// [1, MaxBatch].
	Batch int `toml:"batch"`
	// SeqLen is the tokens per sequence, in [1, the preset's context];
	// 0 means the preset's context (see Manifest.SeqLen).
	SeqLen int `toml:"seq_len"`
}

// Optimizer is the [optimizer] section: the inner AdamW and the outer
// optimizer. Fields marked DiLoCo or NoLoCo are read only under that kind,
// but are always checked and always part of the canonical bytes.
type Optimizer struct {
	// Kind is KindDiLoCo or KindNoLoCo.
	Kind string `toml:"kind"`
	// InnerSteps is H, the inner AdamW steps per outer round (> 0).
	InnerSteps int `toml:"inner_steps"`
	// InnerLR is AdamW's peak learning rate (> 0, finite).
	InnerLR float64 `toml:"inner_lr"`
	// Warmup is the linear warmup in inner steps, in [0, TotalSteps].
	Warmup int `toml:"warmup"`
	// TotalSteps is the inner schedule's length in inner steps (> 0): the
	// cosine decay ends there and stays flat after.
	TotalSteps int `toml:"total_steps"`
	// WeightDecay is AdamW's decoupled weight decay (>= 0, finite).
	WeightDecay float64 `toml:"weight_decay"`
	// GradClip is the maximum global gradient norm (>= 0, finite; 0 disables
	// clipping).
	GradClip float64 `toml:"grad_clip"`
	// OuterLR is the outer learning rate eta (> 0, finite).
	OuterLR float64 `toml:"outer_lr"`
	// OuterMomentum is the outer momentum (mu for DiLoCo, beta for NoLoCo),
	// in [0, 1).
	OuterMomentum float64 `toml:"outer_momentum"`
	// Nesterov (DiLoCo) selects Nesterov momentum for the outer step.
	Nesterov bool `toml:"nesterov"`
	// Delayed (DiLoCo) overlaps each round's exchange with the next inner
	// phase: the phase starts from the round's expected result (the outer
	// step with the member's own pseudo-gradient: optimizer.DiLoCo's eager
	// start), and the round's result is applied as soon as the exchange
	// ends, a few inner steps in, keeping the progress made since
	// (optimizer.DiLoCo.Land).
	Delayed bool `toml:"delayed"`
	// GroupSize (NoLoCo) is the members averaged together per outer step, in
	// [MinGroupSize, MaxGroupSize].
	GroupSize int `toml:"group_size"`
	// Gamma (NoLoCo) is the pull towards the group's mean weights (>= 0,
	// finite).
	Gamma float64 `toml:"gamma"`
}

// Wire is the [wire] section: how tensors cross the network.
type Wire struct {
	// Codec is the name of a compression codec (compression.Codec.String):
	// "minmax8", "int8", "int4", "int2", "sign", "bf16", "fp16" or "fp32".
	Codec string `toml:"codec"`
	// Outer (DiLoCo, one stage) is what of each pseudo-gradient crosses the
	// wire: OuterDense ("" too: every coordinate) or OuterSupport (of every
	// SupportChunk coordinates, the SupportK of the round's shared support:
	// half by the certified outer momentum and half by a keyed hash of the
	// round, or all by the hash when outer_momentum is 0;
	// optimizer.SupportConfig). What a member does not send stays in
	// its residual, decayed by ResidualDecay each round. Every member sends
	// the same coordinates, so the butterfly's robust rule applies
	// unchanged.
	Outer         string  `toml:"outer"`
	SupportK      int     `toml:"support_k"`
	ResidualDecay float64 `toml:"residual_decay"`
	// Rotate (with OuterSupport) takes the support in a fixed randomized
	// Hadamard basis of every SupportChunk coordinates
	// (optimizer.SupportConfig.Rotate), all of it by the hash: each
	// round's rotated coordinates carry a share of every coordinate, and
	// signs of rotated values lose no more than 8-bit values of plain
	// ones. Measured best with ResidualDecay 0 and the outer momentum
	// (BENCHMARKS.md, issue [3/4], session 14).
	Rotate bool `toml:"rotate"`
	// Tiled (with Rotate) draws the support's positions once a round and
	// takes them, cyclically shifted by a keyed offset per chunk, in every
	// SupportChunk coordinates (optimizer.SupportConfig.Tiled): each
	// rotated coordinate is still sent in SupportK/SupportChunk of the
	// rounds, at one draw a round instead of one per chunk (0.2 s of the
	// 124M round's CPU time).
	Tiled bool `toml:"tiled"`
	// BlockSize is how many values share one scale in the blockwise
	// codecs (0: compression.DefaultBlockSize). A sign's scale is 32 bits
	// for 1-bit values: 1024 makes scales 3% of a sign frame, 256 11%.
	BlockSize int `toml:"block_size"`
}

// Block is wire.block_size, or the codecs' default when it is 0.
func (w Wire) Block() int {
	if w.BlockSize == 0 {
		return compression.DefaultBlockSize
	}
	return w.BlockSize
}

// The outer exchanges of wire.outer.
const (
	OuterDense   = "dense"
	OuterSupport = "support"
	// SupportChunk is the chunk a shared support picks SupportK of.
	SupportChunk = 4096
)

// Compacted reports whether wire.outer sends less than every coordinate.
func (w Wire) Compacted() bool { return w.Outer == OuterSupport }

// Data is the [data] section: the corpus every member trains on.
type Data struct {
	// Source is SourceShards (train on Shards) or SourceLocal (each
	// volunteer's own default corpus; for tests and private runs).
	Source string `toml:"source"`
	// ValFraction is the fraction held out for validation, in (0, 0.5).
	ValFraction float64 `toml:"val_fraction"`
	// ShardBytes is the target shard size used when the corpus was cut, in
	// [1, MaxShardBytes].
	ShardBytes int64 `toml:"shard_bytes"`
	// Shards lists the corpus's shards, each named by the SHA-256 of its
	// contents: 1 to MaxShards distinct entries under SourceShards, none
	// under SourceLocal.
	Shards []Shard `toml:"shards"`
	// Tokenizer names the tokenizer the run trains with (data.NewTokenizer:
	// "byte", the default, or "gpt2"); it also gives the model its
	// vocabulary (ModelConfig). Every volunteer tokenizes its corpus with it
	// at the start.
	Tokenizer string `toml:"tokenizer"`
	// TokenizerHash, if set, is the tokenizer's vocabulary hash
	// (data.Named.VocabHash): a volunteer whose tokenizer of that name
	// hashes otherwise is refused. The bootstrap fills it in.
	TokenizerHash string `toml:"tokenizer_hash"`
	// Epochs and MaxTokens (SourceDataset) end the run once it has trained
	// that many epochs of the train split, or that many tokens (counted in
	// certified rounds); 0 is no limit. A volunteer that sees the end saves
	// its checkpoint and leaves.
	Epochs    int64 `toml:"epochs"`
	MaxTokens int64 `toml:"max_tokens"`
}

// Shard is one [[data.shards]] entry.
type Shard struct {
	// Hash is the SHA-256 of the shard's bytes: 64 lowercase hex digits.
	Hash string `toml:"hash"`
	// Bytes is the shard's size, in [1, MaxShardBytes].
	Bytes int64 `toml:"bytes"`
	// Files is the number of corpus files in the shard, in [1, MaxShardFiles]
	// (SourceShards; 0 under SourceDataset).
	Files int `toml:"files"`
	// Tokens and Documents (SourceDataset) are the shard's tokens, in [1,
	// data.MaxShardTokens], and the documents starting in it.
	Tokens    int64 `toml:"tokens"`
	Documents int64 `toml:"documents"`
	// Split (SourceDataset) is SplitValidation for a validation shard, empty
	// for a train shard. Each split is its shards' tokens in list order.
	Split string `toml:"split"`
}

// Admission is the [admission] section: who may join. Every member checks
// every other (p2p/admission.go): a member that breaks the rules is left
// out of its member list and its streams are refused.
type Admission struct {
	// Mode is AdmissionOpen (anyone may join, within the caps below) or
	// AdmissionClosed (only holders of a join token signed by RunKey).
	Mode string `toml:"mode"`
	// MaxMembers is the most members a run has, the bootstrap included, in
	// [1, MaxMembers]; a member refuses newcomers past it. Every mode.
	MaxMembers int `toml:"max_members"`
	// MaxPerPrefix (open runs) is the most members behind one address
	// prefix, /24 for IPv4 and /48 for IPv6, in [1, max_members]: one host
	// cannot fill an open run with identities of its own. A closed run
	// admits by token and leaves it at its default.
	MaxPerPrefix int `toml:"max_per_prefix"`
	// RunKey (closed runs, required there) is the run's ed25519 public key,
	// standard base64 (RunKeyLen characters) as `skein token keygen`
	// prints it. Its private half signs the join tokens (`skein token
	// issue`) and stays with the operator; an open run leaves it empty.
	RunKey string `toml:"run_key"`
}

// Pipeline is the [pipeline] section: a model split into stages held by
// different members, microbatches taking SkipPipe paths through them and a
// stage that loses its last member rebuilt by CheckFree (ALGORITHMS.md 3
// and 4). The default, one stage, is plain data parallelism.
type Pipeline struct {
	// Stages is S, in [1, the preset's layers + 1]: stage 0 holds the
	// embedding, the head and the loss, every later stage at least one
	// layer. 1: no pipeline.
	Stages int `toml:"stages"`
	// SkipRatio is k, in [0, 1): every microbatch visits L = S(1-k) stages,
	// which must be a whole number (with S = 3: 0 or 1/3), and skips at
	// most MaxSkip of them.
	SkipRatio float64 `toml:"skip_ratio"`
	// Microbatches is the microbatches per step, each of model.batch
	// sequences, in [1, MaxMicrobatches].
	Microbatches int `toml:"microbatches"`
	// CheckFreePlus swaps stages 1 and 2 (and the last two, from 5 stages)
	// on odd microbatches so that an edge stage can be rebuilt as a copy of
	// its partner; without it only stages 2..S-2 can be rebuilt.
	CheckFreePlus bool `toml:"checkfree_plus"`
}

// Bounds of the [pipeline] section.
const (
	// MaxSkip is the most stages one microbatch skips: a jump over more
	// breaks SkipPipe's rule 4 (pipeline.DefaultRules().MaxJump).
	MaxSkip = 3
	// MaxMicrobatches bounds pipeline.microbatches.
	MaxMicrobatches = 1024
)

// Staged reports whether the run is split into pipeline stages.
func (p Pipeline) Staged() bool { return p.Stages > 1 }

// Skip is the number of stages every microbatch skips, S - L.
func (p Pipeline) Skip() int { return int(math.Round(p.SkipRatio * float64(p.Stages))) }

// Default returns the demo's manifest: run "skein-demo", the tiny preset on
// each volunteer's local corpus, DiLoCo with H = 50 and minmax8 on the wire.
// It matches node.DefaultVolunteerConfig, so a volunteer started without a
// manifest trains the same run. Optimizer settings not set by the demo come
// from optimizer.DefaultAdamW, DefaultDiLoCo and DefaultNoLoCo.
func Default() Manifest {
	a, d, n := optimizer.DefaultAdamW(), optimizer.DefaultDiLoCo(), optimizer.DefaultNoLoCo()
	return Manifest{
		RunID:   "skein-demo",
		Version: Version,
		Model:   Model{Preset: "tiny", Seed: 1, Batch: 8, SeqLen: 0},
		Optimizer: Optimizer{
			Kind:          KindDiLoCo,
			InnerSteps:    50,
			InnerLR:       1e-3,
			Warmup:        20,
			TotalSteps:    10000,
			WeightDecay:   a.WeightDecay,
			GradClip:      a.Clip,
			OuterLR:       d.OuterLR,
			OuterMomentum: d.Momentum,
			Nesterov:      true,
			Delayed:       false,
			GroupSize:     n.GroupSize,
			Gamma:         n.Gamma,
		},
		Wire:      Wire{Codec: compression.MinMax8.String()},
		Data:      Data{Source: SourceLocal, ValFraction: DefaultValFraction, ShardBytes: DefaultShardBytes},
		Admission: Admission{Mode: AdmissionOpen, MaxMembers: DefaultMaxMembers, MaxPerPrefix: DefaultMaxPerPrefix},
		Pipeline:  Pipeline{Stages: 1, Microbatches: 4},
	}
}

// Demo returns the run that `skein demo` and a `skein bootstrap` without a
// manifest file start: Default with its corpus packed into 4 MiB shards that
// travel with the run, so that a volunteer needs no corpus of its own, and
// the rotated shared support on the wire (UseRotatedSupport): in the
// 3-minute demo it ends as low as the dense exchange at about 2100x less
// traffic than fp32 data-parallel, where the dense one sends 128x less
// (BENCHMARKS.md, issue [3/4], session 15).
func Demo() Manifest {
	m := Default()
	m.Data.Source, m.Data.ShardBytes = SourceShards, 4<<20
	m.UseRotatedSupport(DemoSupportK)
	return m
}

// DemoSupportK is the demo run's wire.support_k: 1536 of every 4096
// rotated coordinates, 1-bit signs with a scale per 256 (0.42 bits a
// parameter a round before framing).
const DemoSupportK = 1536

// UseRotatedSupport sets m's DiLoCo round to send k of every SupportChunk
// coordinates of the rotated basis (wire.rotate), drawn once a round and
// tiled (wire.tiled), as signs with a scale per 256, with no residual,
// and the outer rule measured best with it: the
// Nesterov momentum 0.9 at lr 0.7 x SupportChunk/k, the paper's step
// scaled by how rarely a rotated coordinate is sent (BENCHMARKS.md, issue
// [3/4], session 14).
func (m *Manifest) UseRotatedSupport(k int) {
	m.Wire = Wire{Codec: compression.Sign.String(), Outer: OuterSupport, SupportK: k, Rotate: true, Tiled: true, BlockSize: 256}
	m.Optimizer.OuterLR, m.Optimizer.OuterMomentum, m.Optimizer.Nesterov = 0.7*SupportChunk/float64(k), 0.9, true
}

// UseDense sets m's DiLoCo round to send every coordinate as minmax8, with
// Default's outer rule.
func (m *Manifest) UseDense() {
	d := Default()
	m.Wire = d.Wire
	m.Optimizer.OuterLR, m.Optimizer.OuterMomentum, m.Optimizer.Nesterov = d.Optimizer.OuterLR, d.Optimizer.OuterMomentum, d.Optimizer.Nesterov
}

// UseNoLoCo switches m to NoLoCo with its own outer defaults (ALGORITHMS.md
// 2; a DiLoCo run's outer settings are not NoLoCo's), and a compacted wire
// (a DiLoCo round's) to Default's dense one.
func (m *Manifest) UseNoLoCo() {
	if m.Wire.Compacted() {
		m.UseDense()
	}
	n := optimizer.DefaultNoLoCo()
	m.Optimizer.Kind, m.Optimizer.OuterLR, m.Optimizer.OuterMomentum = KindNoLoCo, n.OuterLR, n.Momentum
}

// SeqLen returns the sequence length the run trains at: model.seq_len, or
// the preset's context when that is 0 (0 if the preset is unknown, in which
// case Validate fails).
func (m Manifest) SeqLen() int {
	if m.Model.SeqLen != 0 {
		return m.Model.SeqLen
	}
	cfg, err := model.Preset(m.Model.Preset)
	if err != nil {
		return 0
	}
	return cfg.MaxT
}

// TokenizerName is data.tokenizer, "byte" when left out.
func (d Data) TokenizerName() string {
	if d.Tokenizer == "" {
		return TokenizerByte
	}
	return d.Tokenizer
}

// Tokenized reports whether the run's tokenizer is not byte: volunteers
// tokenize the corpus, and the model takes the tokenizer's vocabulary.
func (d Data) Tokenized() bool { return d.TokenizerName() != TokenizerByte }

// Dataset returns a SourceDataset run's data as the index of a packed
// dataset (its shards in list order; totals summed), for data's readers.
func (d Data) Dataset() (*data.Dataset, error) {
	if d.Source != SourceDataset {
		return nil, fmt.Errorf("manifest: data.source is %q, not %q", d.Source, SourceDataset)
	}
	tok, err := data.NewTokenizer(d.TokenizerName())
	if err != nil {
		return nil, err
	}
	ds := &data.Dataset{Format: data.DatasetFormat, Tokenizer: d.TokenizerName(), TokenizerHash: d.TokenizerHash, Vocab: tok.VocabSize(),
		Validation: []data.DatasetShard{}}
	for _, s := range d.Shards {
		sh := data.DatasetShard{Name: s.Hash, Bytes: s.Bytes, Tokens: s.Tokens, Documents: s.Documents}
		if s.Split == SplitValidation {
			ds.Validation = append(ds.Validation, sh)
		} else {
			ds.Train = append(ds.Train, sh)
		}
		ds.Documents += s.Documents
		ds.Tokens += s.Tokens
	}
	if ds.TokenizerHash == "" {
		ds.TokenizerHash = tok.(data.Named).VocabHash()
	}
	return ds, ds.Check()
}

// SetDataset makes the run train on the packed dataset ds.
func (d *Data) SetDataset(ds *data.Dataset) {
	d.Source, d.Tokenizer, d.TokenizerHash, d.Shards = SourceDataset, ds.Tokenizer, ds.TokenizerHash, nil
	if d.Tokenizer == TokenizerByte {
		d.Tokenizer = ""
	}
	for _, sp := range []data.Split{data.Train, data.Validation} {
		for _, sh := range ds.Shards(sp) {
			s := Shard{Hash: sh.Name, Bytes: sh.Bytes, Tokens: sh.Tokens, Documents: sh.Documents}
			if sp == data.Validation {
				s.Split = SplitValidation
			}
			d.Shards = append(d.Shards, s)
		}
	}
}

// ModelConfig is the model the run trains: the preset, with the
// vocabulary of data.tokenizer when it is not byte (the presets' own
// vocabularies are byte's for the toy models and GPT-2's for the gpt2
// family).
func (m Manifest) ModelConfig() (model.Config, error) {
	c, err := model.Preset(m.Model.Preset)
	if err != nil {
		return model.Config{}, err
	}
	if m.Data.Tokenized() {
		tok, err := data.NewTokenizer(m.Data.Tokenizer)
		if err != nil {
			return model.Config{}, err
		}
		c = c.WithVocab(tok.VocabSize())
	}
	return c, nil
}

// Codec returns wire.codec as a compression.Codec, or 0 (not a codec) when
// the name is unknown, in which case Validate fails.
func (m Manifest) Codec() compression.Codec {
	c, _ := codecByName(m.Wire.Codec)
	return c
}

// WireCodec returns c with wire.codec and wire.block_size: how every
// collective of the run encodes what crosses the wire.
func (m Manifest) WireCodec(c compression.Config) compression.Config {
	c.Codec, c.BlockSize = m.Codec(), m.Wire.Block()
	return c
}

// Policy is the admission policy as p2p enforces it: the bootstrap
// enforces it from the start, and a volunteer checks the one it learned at
// the door against it.
func (a Admission) Policy() p2p.Admission {
	if a.Mode == AdmissionClosed {
		return p2p.Admission{Closed: true, RunKey: a.RunPublicKey(), MaxMembers: a.MaxMembers}
	}
	return p2p.Admission{MaxMembers: a.MaxMembers, MaxPerPrefix: a.MaxPerPrefix}
}

// RunPublicKey returns admission.run_key decoded, or nil for an open run
// (or a key Validate refuses).
func (a Admission) RunPublicKey() ed25519.PublicKey {
	k, err := decodeRunKey(a.RunKey)
	if err != nil {
		return nil
	}
	return k
}

// decodeRunKey decodes a run_key: exactly RunKeyLen characters of standard
// base64 holding ed25519.PublicKeySize bytes.
func decodeRunKey(s string) (ed25519.PublicKey, error) {
	if len(s) != RunKeyLen {
		return nil, fmt.Errorf("%d characters, want %d", len(s), RunKeyLen)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, errors.New("not the base64 of 32 bytes")
	}
	return ed25519.PublicKey(b), nil
}

// Schedule is the schedule every member of a staged run computes for each
// iteration from its placement (pipeline.RotatingSchedule): the pipeline
// section's microbatches, skips and CheckFree+, seeded by the model's seed.
func (m Manifest) Schedule() pipeline.RotatingSchedule {
	return pipeline.RotatingSchedule{Microbatches: m.Pipeline.Microbatches, Skip: m.Pipeline.Skip(), Seed: m.Model.Seed,
		CheckFreePlus: m.Pipeline.CheckFreePlus}
}

// CheckStaged says whether volunteers can run m's pipeline: a staged
// run averages each stage's replicas with Nesterov DiLoCo, not delayed
// (NoLoCo between a stage's replicas runs in process, `skein bench
// staged`, not yet over `skein node join`). nil for a data-parallel run.
func (m Manifest) CheckStaged() error {
	p, o := m.Pipeline, m.Optimizer
	switch {
	case !p.Staged():
		return nil
	case o.Kind != KindDiLoCo:
		return fmt.Errorf("a staged run's volunteers average each stage's replicas with DiLoCo; optimizer.kind = %q runs staged only in process (skein bench staged), not over skein node join",
			o.Kind)
	case !o.Nesterov || o.Delayed:
		return fmt.Errorf("a staged run's DiLoCo is Nesterov and not delayed (optimizer.nesterov = %v, delayed = %v)", o.Nesterov, o.Delayed)
	}
	return nil
}
