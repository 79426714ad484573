package manifest

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestDefaultIsValid(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatal(err)
	}
}

// The demo's run sends the rotated support with its own outer rule;
// switching it to NoLoCo or to the dense exchange leaves a valid run with
// Default's dense wire, and a staged run is refused a compacted wire.
func TestDemoWire(t *testing.T) {
	d := Demo()
	d.Data.Shards = []Shard{{Hash: fmt.Sprintf("%064x", 1), Bytes: 1 << 20, Files: 3}}
	if err := d.Validate(); err != nil {
		t.Fatal(err)
	}
	w := d.Wire
	if !w.Compacted() || !w.Rotate || !w.Tiled || w.SupportK != DemoSupportK || w.Codec != "sign" || w.ResidualDecay != 0 || w.BlockSize != 256 {
		t.Fatalf("demo wire %+v, want the rotated support of %d", w, DemoSupportK)
	}
	if o := d.Optimizer; math.Abs(o.OuterLR-0.7*4096/1536) > 1e-12 || o.OuterMomentum != 0.9 || !o.Nesterov {
		t.Fatalf("demo outer rule lr %v momentum %v nesterov %v", o.OuterLR, o.OuterMomentum, o.Nesterov)
	}
	staged := d
	staged.Pipeline.Stages = 3
	if err := staged.Validate(); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "wire.outer") {
		t.Fatalf("staged demo with the support: %v, want ErrInvalid naming wire.outer", err)
	}
	def := Default()
	for name, use := range map[string]func(m *Manifest){"dense": (*Manifest).UseDense, "noloco": (*Manifest).UseNoLoCo} {
		m := d
		use(&m)
		if m.Wire != def.Wire {
			t.Errorf("%s: wire %+v, want Default's %+v", name, m.Wire, def.Wire)
		}
		if err := m.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	m := d
	m.UseDense()
	if m.Optimizer != def.Optimizer {
		t.Errorf("dense: optimizer %+v, want Default's %+v", m.Optimizer, def.Optimizer)
	}
}

func TestZeroIsInvalid(t *testing.T) {
	if err := (Manifest{}).Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("zero Manifest: %v, want ErrInvalid", err)
	}
}

// withShards returns Default() training on n distinct shards.
func withShards(n int) Manifest {
	m := Default()
	m.Data.Source = SourceShards
	for i := range n {
		m.Data.Shards = append(m.Data.Shards, Shard{Hash: fmt.Sprintf("%064x", i+1), Bytes: 1 << 20, Files: 3})
	}
	return m
}

func TestValidate(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	cases := []struct {
		field string // the key the error must name, "" for a valid manifest
		want  string // a further substring of the error
		edit  func(m *Manifest)
	}{
		{"", "", func(m *Manifest) {}},
		{"", "", func(m *Manifest) { m.RunID = strings.Repeat("a", MaxRunIDLen) }},
		{"", "", func(m *Manifest) { m.RunID = "Run_1.2-x" }},
		{"", "", func(m *Manifest) { m.Created = "2025-06-01T12:00:00.5+02:00" }},
		{"", "", func(m *Manifest) { m.Model.Seed = MaxSeed }},
		{"", "", func(m *Manifest) { m.Model.Seed = 0 }},
		{"", "", func(m *Manifest) { m.Model.Batch = MaxBatch }},
		{"", "", func(m *Manifest) { m.Model.SeqLen = 128 }},
		{"", "", func(m *Manifest) { m.Model.Preset, m.Model.SeqLen = "small", 256 }},
		{"", "", func(m *Manifest) { m.Optimizer.Warmup = m.Optimizer.TotalSteps }},
		{"", "", func(m *Manifest) { m.Optimizer.Warmup = 0 }},
		{"", "", func(m *Manifest) { m.Optimizer.GradClip, m.Optimizer.WeightDecay, m.Optimizer.Gamma = 0, 0, 0 }},
		{"", "", func(m *Manifest) { m.Optimizer.OuterMomentum = 0 }},
		{"", "", func(m *Manifest) { m.Optimizer.Kind, m.Optimizer.GroupSize = KindNoLoCo, MaxGroupSize }},
		{"", "", func(m *Manifest) { m.Optimizer.OuterLR = 1e300 }},
		{"", "", func(m *Manifest) { m.Wire.Codec = "fp32" }},
		{"", "", func(m *Manifest) { *m = withShards(1) }},
		{"", "", func(m *Manifest) { *m = withShards(MaxShards) }},
		{"", "", func(m *Manifest) { m.Data.ShardBytes = MaxShardBytes }},

		{"run_id", "length 0", func(m *Manifest) { m.RunID = "" }},
		{"run_id", "length 65", func(m *Manifest) { m.RunID = strings.Repeat("a", MaxRunIDLen+1) }},
		{"run_id", `character ' '`, func(m *Manifest) { m.RunID = "my run" }},
		{"run_id", `character '/'`, func(m *Manifest) { m.RunID = "run/1" }},
		{"run_id", `character 'é'`, func(m *Manifest) { m.RunID = "café" }},
		{"version", "version 1 only", func(m *Manifest) { m.Version = 0 }},
		{"version", "version 1 only", func(m *Manifest) { m.Version = 2 }},
		{"created", "RFC 3339", func(m *Manifest) { m.Created = "2025-06-01" }},
		{"created", "RFC 3339", func(m *Manifest) { m.Created = "yesterday" }},
		{"model.preset", `"gpt2-xl", "small", "tiny"`, func(m *Manifest) { m.Model.Preset = "huge" }},
		{"model.preset", "want one of", func(m *Manifest) { m.Model.Preset = "" }},
		{"data.tokenizer", `"byte", "gpt2"`, func(m *Manifest) { m.Data.Tokenizer = "bpe" }},
		{"data.tokenizer_hash", "SHA-256", func(m *Manifest) { m.Data.TokenizerHash = "abc" }},
		{"data.tokenizer", "bytes only", func(m *Manifest) { m.Data.Tokenizer, m.Pipeline.Stages = "gpt2", 3 }},
		{"model.preset", "want one of", func(m *Manifest) { m.Model.Preset = "Tiny" }},
		{"model.seed", "at most 9223372036854775807", func(m *Manifest) { m.Model.Seed = math.MaxUint64 }},
		{"model.batch", "[1, 4096]", func(m *Manifest) { m.Model.Batch = 0 }},
		{"model.batch", "[1, 4096]", func(m *Manifest) { m.Model.Batch = -8 }},
		{"model.batch", "[1, 4096]", func(m *Manifest) { m.Model.Batch = MaxBatch + 1 }},
		{"model.seq_len", "[1, 128]", func(m *Manifest) { m.Model.SeqLen = -1 }},
		{"model.seq_len", "the tiny preset's context", func(m *Manifest) { m.Model.SeqLen = 129 }},
		{"optimizer.kind", `want "diloco" or "noloco"`, func(m *Manifest) { m.Optimizer.Kind = "adam" }},
		{"optimizer.kind", `want "diloco" or "noloco"`, func(m *Manifest) { m.Optimizer.Kind = "" }},
		{"optimizer.inner_steps", "must be positive", func(m *Manifest) { m.Optimizer.InnerSteps = 0 }},
		{"optimizer.inner_steps", "must be positive", func(m *Manifest) { m.Optimizer.InnerSteps = -50 }},
		{"optimizer.inner_lr", "positive and finite", func(m *Manifest) { m.Optimizer.InnerLR = 0 }},
		{"optimizer.inner_lr", "positive and finite", func(m *Manifest) { m.Optimizer.InnerLR = -1e-3 }},
		{"optimizer.inner_lr", "positive and finite", func(m *Manifest) { m.Optimizer.InnerLR = nan }},
		{"optimizer.inner_lr", "positive and finite", func(m *Manifest) { m.Optimizer.InnerLR = inf }},
		{"optimizer.total_steps", "must be positive", func(m *Manifest) { m.Optimizer.TotalSteps = 0 }},
		{"optimizer.warmup", "[0, 10000]", func(m *Manifest) { m.Optimizer.Warmup = -1 }},
		{"optimizer.warmup", "[0, 10000] (optimizer.total_steps)", func(m *Manifest) { m.Optimizer.Warmup = 10001 }},
		{"optimizer.weight_decay", ">= 0 and finite", func(m *Manifest) { m.Optimizer.WeightDecay = -0.1 }},
		{"optimizer.weight_decay", ">= 0 and finite", func(m *Manifest) { m.Optimizer.WeightDecay = nan }},
		{"optimizer.weight_decay", ">= 0 and finite", func(m *Manifest) { m.Optimizer.WeightDecay = inf }},
		{"optimizer.grad_clip", ">= 0 and finite", func(m *Manifest) { m.Optimizer.GradClip = -1 }},
		{"optimizer.grad_clip", ">= 0 and finite", func(m *Manifest) { m.Optimizer.GradClip = inf }},
		{"optimizer.outer_lr", "positive and finite", func(m *Manifest) { m.Optimizer.OuterLR = 0 }},
		{"optimizer.outer_lr", "positive and finite", func(m *Manifest) { m.Optimizer.OuterLR = nan }},
		{"optimizer.outer_momentum", "[0, 1)", func(m *Manifest) { m.Optimizer.OuterMomentum = 1 }},
		{"optimizer.outer_momentum", "[0, 1)", func(m *Manifest) { m.Optimizer.OuterMomentum = -0.1 }},
		{"optimizer.outer_momentum", "[0, 1)", func(m *Manifest) { m.Optimizer.OuterMomentum = nan }},
		{"optimizer.group_size", "[2, 16]", func(m *Manifest) { m.Optimizer.GroupSize = 1 }},
		{"optimizer.group_size", "[2, 16]", func(m *Manifest) { m.Optimizer.GroupSize = 17 }},
		{"optimizer.gamma", ">= 0 and finite", func(m *Manifest) { m.Optimizer.Gamma = -0.7 }},
		{"optimizer.gamma", ">= 0 and finite", func(m *Manifest) { m.Optimizer.Gamma = inf }},
		{"wire.codec", `"bf16", "fp16", "fp32", "int2", "int4", "int8", "minmax8", "sign"`, func(m *Manifest) { m.Wire.Codec = "zstd" }},
		{"wire.codec", `only with wire.outer = "support"`, func(m *Manifest) { m.Wire.Codec = "int2" }},
		{"wire.codec", `only with wire.outer = "support"`, func(m *Manifest) { m.Wire.Codec = "sign" }},
		{"wire.codec", "want one of", func(m *Manifest) { m.Wire.Codec = "MinMax8" }},
		{"wire.codec", "want one of", func(m *Manifest) { m.Wire.Codec = "" }},
		{"data.source", `want "shards", "local" or "dataset"`, func(m *Manifest) { m.Data.Source = "http" }},
		{"data.val_fraction", "(0, 0.5)", func(m *Manifest) { m.Data.ValFraction = 0 }},
		{"data.val_fraction", "(0, 0.5)", func(m *Manifest) { m.Data.ValFraction = 0.5 }},
		{"data.val_fraction", "(0, 0.5)", func(m *Manifest) { m.Data.ValFraction = nan }},
		{"data.shard_bytes", "[1, 1073741824]", func(m *Manifest) { m.Data.ShardBytes = 0 }},
		{"data.shard_bytes", "[1, 1073741824]", func(m *Manifest) { m.Data.ShardBytes = MaxShardBytes + 1 }},
		{"data.shards", `must be empty when data.source = "local"`, func(m *Manifest) {
			m.Data.Shards = withShards(1).Data.Shards
		}},
		{"data.shards", "needs at least one shard", func(m *Manifest) { m.Data.Source = SourceShards }},
		{"data.shards", "at most 1024 entries", func(m *Manifest) { *m = withShards(MaxShards + 1) }},
		{"data.shards[0].hash", "64 lowercase hex", func(m *Manifest) {
			*m = withShards(1)
			m.Data.Shards[0].Hash = strings.ToUpper(m.Data.Shards[0].Hash[:62]) + "AB"
		}},
		{"data.shards[1].hash", "64 lowercase hex", func(m *Manifest) {
			*m = withShards(2)
			m.Data.Shards[1].Hash = m.Data.Shards[1].Hash[1:]
		}},
		{"data.shards[0].hash", "64 lowercase hex", func(m *Manifest) {
			*m = withShards(1)
			m.Data.Shards[0].Hash = strings.Repeat("g", 64)
		}},
		{"data.shards[0].bytes", "[1, 1073741824]", func(m *Manifest) { *m = withShards(1); m.Data.Shards[0].Bytes = 0 }},
		{"data.shards[0].bytes", "[1, 1073741824]", func(m *Manifest) { *m = withShards(1); m.Data.Shards[0].Bytes = MaxShardBytes + 1 }},
		{"data.shards[0].files", "[1, 1048576]", func(m *Manifest) { *m = withShards(1); m.Data.Shards[0].Files = 0 }},
		{"data.shards[0].files", "[1, 1048576]", func(m *Manifest) { *m = withShards(1); m.Data.Shards[0].Files = MaxShardFiles + 1 }},
		{"data.shards[2].hash", "the same shard as data.shards[0]", func(m *Manifest) {
			*m = withShards(3)
			m.Data.Shards[2].Hash = m.Data.Shards[0].Hash
		}},
		{"admission.mode", `want "open" or "closed"`, func(m *Manifest) { m.Admission.Mode = "allowlist" }},
		{"admission.mode", `want "open" or "closed"`, func(m *Manifest) { m.Admission.Mode = "" }},
		{"admission.max_members", "[1, 65536]", func(m *Manifest) { m.Admission.MaxMembers = 0 }},
		{"admission.max_members", "[1, 65536]", func(m *Manifest) { m.Admission.MaxMembers = MaxMembers + 1 }},
		{"admission.max_per_prefix", "[1, 256] (admission.max_members)", func(m *Manifest) { m.Admission.MaxPerPrefix = 0 }},
		{"admission.max_per_prefix", "[1, 8] (admission.max_members)", func(m *Manifest) { m.Admission.MaxMembers = 8 }},
		{"", "", func(m *Manifest) { m.Admission.MaxMembers, m.Admission.MaxPerPrefix = 1, 1 }},
		{"admission.run_key", "applies to closed runs only", func(m *Manifest) { m.Admission.RunKey = testRunKey }},
		{"admission.run_key", "a closed run needs the run's public key", func(m *Manifest) { m.Admission.Mode = AdmissionClosed }},
		{"", "", func(m *Manifest) { m.Admission.Mode, m.Admission.RunKey = AdmissionClosed, testRunKey }},
		{"", "", func(m *Manifest) {
			m.Admission.Mode, m.Admission.RunKey, m.Admission.MaxMembers = AdmissionClosed, testRunKey, 3
		}},
		{"", "", func(m *Manifest) { m.Pipeline.Stages, m.Pipeline.SkipRatio, m.Pipeline.CheckFreePlus = 3, 1.0/3, true }},
		{"", "", func(m *Manifest) { m.Pipeline.Stages, m.Pipeline.SkipRatio = 5, 0.4 }},
		{"pipeline.stages", "[1, 5]", func(m *Manifest) { m.Pipeline.Stages = 6 }},
		{"pipeline.stages", "[1, 5]", func(m *Manifest) { m.Pipeline.Stages = 0 }},
		{"pipeline.skip_ratio", "whole number", func(m *Manifest) { m.Pipeline.Stages, m.Pipeline.SkipRatio = 3, 0.25 }},
		{"pipeline.skip_ratio", "[0, 1)", func(m *Manifest) { m.Pipeline.Stages, m.Pipeline.SkipRatio = 3, nan }},
		{"pipeline.skip_ratio", "always visited", func(m *Manifest) { m.Pipeline.Stages, m.Pipeline.SkipRatio = 3, 2.0/3 }},
		{"pipeline.stages", "apply to a staged run", func(m *Manifest) { m.Pipeline.CheckFreePlus = true }},
		{"pipeline.microbatches", "[1, 1024]", func(m *Manifest) { m.Pipeline.Microbatches = 0 }},
		{"admission.max_per_prefix", "applies to open runs only", func(m *Manifest) {
			m.Admission.Mode, m.Admission.RunKey, m.Admission.MaxPerPrefix = AdmissionClosed, testRunKey, 2
		}},
		{"admission.run_key", "43 characters, want 44", func(m *Manifest) {
			m.Admission.Mode, m.Admission.RunKey = AdmissionClosed, testRunKey[:43]
		}},
		{"admission.run_key", "not the base64 of 32 bytes", func(m *Manifest) {
			m.Admission.Mode, m.Admission.RunKey = AdmissionClosed, strings.Repeat("-", 44)
		}},
		{"admission.run_key", "not the base64 of 32 bytes", func(m *Manifest) {
			// Hex is 64 characters; base64 of 33 bytes is 44 without padding.
			m.Admission.Mode, m.Admission.RunKey = AdmissionClosed, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
		}},
	}
	for i, c := range cases {
		m := Default()
		c.edit(&m)
		err := m.Validate()
		if c.field == "" {
			if err != nil {
				t.Errorf("case %d: valid manifest refused: %v", i, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("case %d (%s): got %v, want ErrInvalid", i, c.field, err)
			continue
		}
		if msg := err.Error(); !strings.HasPrefix(msg, "manifest: "+c.field+" = ") || !strings.Contains(msg, c.want) {
			t.Errorf("case %d: %q\n\twant it to start with %q and contain %q", i, msg, "manifest: "+c.field+" = ", c.want)
		}
	}
}

// TestValidateMessage pins the form of an error.
func TestValidateMessage(t *testing.T) {
	m := Default()
	m.Optimizer.InnerSteps = 0
	if got, want := m.Validate().Error(), "manifest: optimizer.inner_steps = 0: must be positive"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	m = Default()
	m.Model.Preset = "huge"
	if got, want := m.Validate().Error(), `manifest: model.preset = "huge": want one of "gpt2", "gpt2-124m", "gpt2-large", "gpt2-medium", "gpt2-xl", "small", "tiny"`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// The tokenizer gives the model its vocabulary.
func TestModelConfigTokenizer(t *testing.T) {
	m := Default()
	m.Model.Preset = "small"
	c, err := m.ModelConfig()
	if err != nil || c.Vocab != 256 {
		t.Fatalf("byte: %+v %v", c, err)
	}
	m.Data.Tokenizer = "gpt2"
	if c, err = m.ModelConfig(); err != nil || c.Vocab != 50257 || c.PaddedVocab != 50304 || c.C != 384 {
		t.Fatalf("gpt2: %+v %v", c, err)
	}
}
