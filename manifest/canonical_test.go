package manifest

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"github.com/skein-ml/skein/data"
)

var update = flag.Bool("update", false, "rewrite testdata/default.canonical.toml")

// roundTrip checks that m's canonical bytes parse back to m and encode to
// the same bytes.
func roundTrip(t *testing.T, name string, m Manifest) {
	t.Helper()
	c := m.Canonical()
	got, err := Parse(c)
	if err != nil {
		t.Fatalf("%s: Parse(Canonical()): %v\n%s", name, err, c)
	}
	if !reflect.DeepEqual(got, m) {
		t.Errorf("%s: round trip\ngot  %+v\nwant %+v\n%s", name, got, m, c)
	}
	if c2 := got.Canonical(); !bytes.Equal(c2, c) {
		t.Errorf("%s: canonical bytes differ after a round trip:\n%s\n%s", name, c, c2)
	}
	if got.Hash() != m.Hash() {
		t.Errorf("%s: hash differs after a round trip", name)
	}
}

// full returns a valid manifest in which every field differs from
// Default's.
func full() Manifest {
	m := withShards(3)
	m.RunID, m.Created = "full.run_2", "2030-12-31T23:59:59.999+01:00"
	m.Model = Model{Preset: "gpt2-124m", Seed: MaxSeed, Batch: MaxBatch, SeqLen: 1000}
	m.Optimizer = Optimizer{Kind: KindNoLoCo, InnerSteps: 500, InnerLR: 1.5e-7, Warmup: 123, TotalSteps: 1 << 30,
		WeightDecay: 1e21, GradClip: 0, OuterLR: 1, OuterMomentum: 0.999999, Nesterov: false, Delayed: true,
		GroupSize: 16, Gamma: 5e-324}
	m.Wire.Codec = "int4"
	m.Data.ValFraction, m.Data.ShardBytes = 0.1, 1
	m.Admission.MaxMembers, m.Admission.MaxPerPrefix = MaxMembers, MaxMembers
	m.Pipeline = Pipeline{Stages: 12, SkipRatio: 0.25, Microbatches: MaxMicrobatches, CheckFreePlus: true}
	return m
}

// fullTokenized is full() with the gpt2 tokenizer, which staged runs do not
// take yet: the tokenizer's keys are written only when it is not byte.
func fullTokenized() Manifest {
	m := full()
	m.Pipeline = Default().Pipeline
	m.Data.Tokenizer, m.Data.TokenizerHash = "gpt2", data.GPT2VocabHash
	return m
}

// fullDataset is fullTokenized() training on a packed dataset: its shards
// carry tokens, documents and a split instead of files.
func fullDataset() Manifest {
	m := fullTokenized()
	m.Data.Source = SourceDataset
	for i := range m.Data.Shards {
		m.Data.Shards[i].Files, m.Data.Shards[i].Tokens, m.Data.Shards[i].Documents = 0, int64(i+1)<<10, int64(i)
	}
	m.Data.Shards[2].Split = SplitValidation
	m.Data.Epochs, m.Data.MaxTokens = 3, 1<<40
	return m
}

// fullSupport and fullSubspace compact the outer exchange.
func fullSupport() Manifest {
	m := full()
	m.Optimizer.Kind, m.Pipeline = KindDiLoCo, Pipeline{Stages: 1, Microbatches: m.Pipeline.Microbatches}
	m.Wire.Outer, m.Wire.SupportK, m.Wire.ResidualDecay, m.Wire.BlockSize = OuterSupport, 64, 0.95, 1024
	return m
}

// fullRotated takes fullSupport's support in a rotated basis, with no
// residual (the outer momentum carries what is not sent).
func fullRotated() Manifest {
	m := fullSupport()
	m.Wire.Rotate, m.Wire.ResidualDecay = true, 0
	return m
}

// fullTiled is fullRotated with one draw a round for every chunk.
func fullTiled() Manifest {
	m := fullRotated()
	m.Wire.Tiled = true
	return m
}

// A compacted exchange's fields are in the hash, an older manifest's hash
// does not change, and what does not fit is refused.
func TestOuterExchange(t *testing.T) {
	for name, base := range map[string]Manifest{"support": fullSupport(), "rotated": fullRotated(), "tiled": fullTiled()} {
		if err := base.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		roundTrip(t, name, base)
		for k, edit := range map[string]func(m *Manifest){
			"outer":  func(m *Manifest) { m.Wire.Outer, m.Wire.SupportK, m.Wire.ResidualDecay = "", 0, 0 },
			"k":      func(m *Manifest) { m.Wire.SupportK++ },
			"decay":  func(m *Manifest) { m.Wire.ResidualDecay = (m.Wire.ResidualDecay + 1) / 2 },
			"block":  func(m *Manifest) { m.Wire.BlockSize = 512 },
			"rotate": func(m *Manifest) { m.Wire.Rotate, m.Wire.Tiled = !m.Wire.Rotate, false },
			"tiled":  func(m *Manifest) { m.Wire.Rotate, m.Wire.Tiled = true, !m.Wire.Tiled },
		} {
			m := base
			edit(&m)
			if m.Hash() == base.Hash() {
				t.Errorf("%s: changing %s leaves the hash unchanged", name, k)
			}
		}
	}
	m := full()
	dense := m.Hash()
	m.Wire.Outer = OuterDense
	if m.Hash() != dense {
		t.Error(`wire.outer = "dense" changes an older manifest's hash`)
	}
	for name, edit := range map[string]func(m *Manifest){
		"unknown":       func(m *Manifest) { m.Wire.Outer = "topk" },
		"k 0":           func(m *Manifest) { m.Wire.SupportK = 0 },
		"k too large":   func(m *Manifest) { m.Wire.SupportK = SupportChunk + 1 },
		"subspace":      func(m *Manifest) { m.Wire.Outer = "subspace" },
		"decay below 0": func(m *Manifest) { m.Wire.ResidualDecay = -0.5 },
		"dense, rotated": func(m *Manifest) {
			m.Wire.Outer, m.Wire.SupportK, m.Wire.ResidualDecay, m.Wire.Rotate = OuterDense, 0, 0, true
		},
		"decay > 1":    func(m *Manifest) { m.Wire.ResidualDecay = 1.5 },
		"tiled, plain": func(m *Manifest) { m.Wire.Tiled = true },
		"dense, tiled": func(m *Manifest) {
			m.Wire.Outer, m.Wire.SupportK, m.Wire.ResidualDecay, m.Wire.Tiled = OuterDense, 0, 0, true
		},
		"staged":           func(m *Manifest) { m.Pipeline.Stages = 3 },
		"noloco":           func(m *Manifest) { m.Optimizer.Kind = KindNoLoCo },
		"dense with decay": func(m *Manifest) { m.Wire.Outer, m.Wire.SupportK = OuterDense, 0 },
		"block too small":  func(m *Manifest) { m.Wire.BlockSize = 32 },
		"block too large":  func(m *Manifest) { m.Wire.BlockSize = 1 << 17 },
		"block not 8k":     func(m *Manifest) { m.Wire.BlockSize = 1020 },
	} {
		m := fullSupport()
		edit(&m)
		if err := m.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The hash of a dataset run covers its shards' tokens, documents and split.
func TestDatasetHashCoversShardFields(t *testing.T) {
	base := fullDataset()
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, "fullDataset", base)
	for k, edit := range map[string]func(m *Manifest){
		"tokens":    func(m *Manifest) { m.Data.Shards[1].Tokens++ },
		"documents": func(m *Manifest) { m.Data.Shards[1].Documents++ },
		"split":     func(m *Manifest) { m.Data.Shards[1].Split = SplitValidation },
		"epochs":    func(m *Manifest) { m.Data.Epochs++ },
		"maxTokens": func(m *Manifest) { m.Data.MaxTokens = 0 },
		"order":     func(m *Manifest) { slices.Reverse(m.Data.Shards) },
	} {
		m := base
		m.Data.Shards = slices.Clone(base.Data.Shards)
		edit(&m)
		if m.Hash() == base.Hash() {
			t.Errorf("changing %s leaves the hash unchanged", k)
		}
	}
	// A shards run with dataset fields, and a dataset run with files, are
	// refused.
	m := full()
	m.Data.Shards[0].Tokens = 5
	if err := m.Validate(); err == nil {
		t.Error("a shards run took data.shards.tokens")
	}
	m = fullDataset()
	m.Data.Shards = slices.Clone(m.Data.Shards)
	m.Data.Shards[0].Files = 1
	if err := m.Validate(); err == nil {
		t.Error("a dataset run took data.shards.files")
	}
	m = fullDataset()
	m.Data.Shards = m.Data.Shards[2:] // validation only
	if err := m.Validate(); err == nil {
		t.Error("a dataset without train shards")
	}
}

// fullClosed is full() as a closed run: the keys of an open run that a
// closed one leaves at their defaults are replaced by run_key.
func fullClosed() Manifest {
	m := full()
	m.Admission = Admission{Mode: AdmissionClosed, MaxMembers: 1, MaxPerPrefix: DefaultMaxPerPrefix, RunKey: testRunKey}
	return m
}

func TestCanonicalRoundTrip(t *testing.T) {
	roundTrip(t, "Default", Default())
	roundTrip(t, "run.toml", mustLoad(t, filepath.Join("testdata", "run.toml")))
	roundTrip(t, "full", full())
	roundTrip(t, "fullClosed", fullClosed())
	roundTrip(t, "MaxShards", withShards(MaxShards))
	for _, x := range []float64{1, 1e-3, 0.1, 1.0 / 3, 1e20, 1e21, 123456789012345678, math.SmallestNonzeroFloat64, 2.5e-7, math.Nextafter(1, 2)} {
		m := Default()
		m.Optimizer.InnerLR = x
		roundTrip(t, "inner_lr", m)
	}
}

func TestCanonicalNormalizes(t *testing.T) {
	m := Default()
	m.Optimizer.GradClip = math.Copysign(0, -1)
	m.Data.Shards = []Shard{}
	d := Default()
	d.Optimizer.GradClip = 0
	if !bytes.Equal(m.Canonical(), d.Canonical()) {
		t.Errorf("-0 and an empty shard list change the canonical bytes:\n%s", m.Canonical())
	}
	if !strings.Contains(string(m.Canonical()), "\ngrad_clip = 0.0\n") {
		t.Errorf("-0 not written as 0.0:\n%s", m.Canonical())
	}
	// Parse returns the normal form too.
	p, err := Parse([]byte("[optimizer]\ngrad_clip = -0.0\n[data]\nshards = []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if math.Signbit(p.Optimizer.GradClip) || p.Data.Shards != nil {
		t.Errorf("Parse kept -0 or an empty shard list: %+v", p)
	}
}

// TestCanonicalGolden pins the canonical form: if it changes, every run's
// manifest hash changes, and the format needs a new Version.
func TestCanonicalGolden(t *testing.T) {
	path := filepath.Join("testdata", "default.canonical.toml")
	got := Default().Canonical()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("Default().Canonical() changed: every manifest hash changes with it.\ngot:\n%s\nwant:\n%s", got, want)
	}
}

// TestCanonicalHasEveryKey reads canonical bytes with the TOML library and
// checks that they hold every key of the schema, and nothing else: full()
// has every key of an open run, fullClosed() those of a closed one.
func TestCanonicalHasEveryKey(t *testing.T) {
	var got []string
	for _, m := range []Manifest{full(), fullClosed(), fullTokenized(), fullDataset(), fullSupport(), fullRotated(), fullTiled()} {
		var v map[string]any
		md, err := toml.Decode(string(m.Canonical()), &v)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range md.Keys() {
			if !slices.Contains(got, k.String()) {
				got = append(got, k.String())
			}
		}
	}
	var want []string
	for k := range knownKeys {
		want = append(want, k)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("canonical keys\n%v\nwant\n%v", got, want)
	}
}

func TestCanonicalFitsMaxSize(t *testing.T) {
	m := full()
	m.Data.Shards = withShards(MaxShards).Data.Shards
	for i := range m.Data.Shards {
		m.Data.Shards[i].Bytes, m.Data.Shards[i].Files = MaxShardBytes, MaxShardFiles
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	if n := len(m.Canonical()); n > MaxSize {
		t.Fatalf("largest valid manifest encodes to %d bytes, over MaxSize %d", n, MaxSize)
	}
	roundTrip(t, "largest", m)
}

// TestHashIgnoresFormatting: comments, order, spacing, inline tables and
// number spelling do not change the hash; values do.
func TestHashIgnoresFormatting(t *testing.T) {
	a, err := Parse([]byte("run_id = \"r\"\n[model]\npreset = \"small\"\nbatch = 16\n[optimizer]\ninner_lr = 0.001\nwarmup = 20\n"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse([]byte("# the same run\nmodel = { batch = 0x10, preset = 'small' }\noptimizer.warmup = +20\noptimizer.inner_lr = 1e-3\nrun_id = \"r\"   # id\n"))
	if err != nil {
		t.Fatal(err)
	}
	if a.Hash() != b.Hash() {
		t.Errorf("same values, different hashes:\n%s\n%s", a.Canonical(), b.Canonical())
	}
	if a.Hash() == Default().Hash() {
		t.Error("different values, same hash")
	}
}

// TestHashCoversEveryField changes each leaf of the schema in turn; every
// change must change the hash. A key of the schema with no entry here fails
// the test, so a new field cannot be left out of Canonical.
func TestHashCoversEveryField(t *testing.T) {
	base := mustLoad(t, filepath.Join("testdata", "run.toml"))
	edits := map[string]func(m *Manifest){
		"run_id":                   func(m *Manifest) { m.RunID += "x" },
		"version":                  func(m *Manifest) { m.Version++ },
		"created":                  func(m *Manifest) { m.Created = "" },
		"model.preset":             func(m *Manifest) { m.Model.Preset = "tiny" },
		"model.seed":               func(m *Manifest) { m.Model.Seed++ },
		"model.batch":              func(m *Manifest) { m.Model.Batch++ },
		"model.seq_len":            func(m *Manifest) { m.Model.SeqLen = 256 }, // the same length, a different document
		"optimizer.kind":           func(m *Manifest) { m.Optimizer.Kind = KindNoLoCo },
		"optimizer.inner_steps":    func(m *Manifest) { m.Optimizer.InnerSteps++ },
		"optimizer.inner_lr":       func(m *Manifest) { m.Optimizer.InnerLR = math.Nextafter(m.Optimizer.InnerLR, 1) },
		"optimizer.warmup":         func(m *Manifest) { m.Optimizer.Warmup++ },
		"optimizer.total_steps":    func(m *Manifest) { m.Optimizer.TotalSteps++ },
		"optimizer.weight_decay":   func(m *Manifest) { m.Optimizer.WeightDecay = 0 },
		"optimizer.grad_clip":      func(m *Manifest) { m.Optimizer.GradClip = 0 },
		"optimizer.outer_lr":       func(m *Manifest) { m.Optimizer.OuterLR = 0.8 },
		"optimizer.outer_momentum": func(m *Manifest) { m.Optimizer.OuterMomentum = 0 },
		"optimizer.nesterov":       func(m *Manifest) { m.Optimizer.Nesterov = !m.Optimizer.Nesterov },
		"optimizer.delayed":        func(m *Manifest) { m.Optimizer.Delayed = !m.Optimizer.Delayed },
		"optimizer.group_size":     func(m *Manifest) { m.Optimizer.GroupSize++ },
		"optimizer.gamma":          func(m *Manifest) { m.Optimizer.Gamma = 0 },
		"wire.codec":               func(m *Manifest) { m.Wire.Codec = "int8" },
		// The compacted exchange's fields: TestOuterExchange.
		"wire.outer":          nil,
		"wire.support_k":      nil,
		"wire.residual_decay": nil,
		"wire.rotate":         nil,
		"wire.tiled":          nil,
		"wire.block_size":     func(m *Manifest) { m.Wire.BlockSize = 512 },
		"data.source":         func(m *Manifest) { m.Data.Source = SourceLocal },
		"data.val_fraction":   func(m *Manifest) { m.Data.ValFraction = 0.03 },
		"data.shard_bytes":    func(m *Manifest) { m.Data.ShardBytes-- },
		"data.shards":         func(m *Manifest) { m.Data.Shards = m.Data.Shards[:1] },
		"data.shards.hash":    func(m *Manifest) { m.Data.Shards[1].Hash = strings.Repeat("0", 64) },
		"data.shards.bytes":   func(m *Manifest) { m.Data.Shards[1].Bytes++ },
		"data.shards.files":   func(m *Manifest) { m.Data.Shards[1].Files++ },
		// The dataset fields: TestDatasetHashCoversShardFields.
		"data.shards.tokens":       nil,
		"data.shards.documents":    nil,
		"data.shards.split":        nil,
		"data.epochs":              nil,
		"data.max_tokens":          nil,
		"data.tokenizer":           func(m *Manifest) { m.Data.Tokenizer = "gpt2" },
		"data.tokenizer_hash":      func(m *Manifest) { m.Data.TokenizerHash = data.GPT2VocabHash },
		"admission.mode":           func(m *Manifest) { m.Admission.Mode = "closed" },
		"admission.max_members":    func(m *Manifest) { m.Admission.MaxMembers++ },
		"admission.max_per_prefix": func(m *Manifest) { m.Admission.MaxPerPrefix-- },
		"admission.run_key": func(m *Manifest) {
			m.Admission.Mode, m.Admission.RunKey = AdmissionClosed, testRunKey
		},
		"pipeline.stages":         func(m *Manifest) { m.Pipeline.Stages = 3 },
		"pipeline.skip_ratio":     func(m *Manifest) { m.Pipeline.SkipRatio = 1.0 / 3 },
		"pipeline.microbatches":   func(m *Manifest) { m.Pipeline.Microbatches++ },
		"pipeline.checkfree_plus": func(m *Manifest) { m.Pipeline.CheckFreePlus = true },
	}
	for k := range knownKeys {
		if _, ok := edits[k]; !ok && !isTable(k) {
			t.Errorf("no edit for key %q", k)
		}
	}
	h := base.Hash()
	if base.Hash() != h {
		t.Fatal("Hash is not stable")
	}
	// Swapping two shards is a change too: the list's order is the run's.
	swapped := base
	swapped.Data.Shards = slices.Clone(base.Data.Shards)
	slices.Reverse(swapped.Data.Shards)
	edits["data.shards (order)"] = func(m *Manifest) { *m = swapped }

	for k, edit := range edits {
		if edit == nil {
			continue
		}
		m := base
		m.Data.Shards = slices.Clone(base.Data.Shards)
		edit(&m)
		if m.Hash() == h {
			t.Errorf("changing %s leaves the hash unchanged", k)
		}
		if m.Validate() == nil {
			roundTrip(t, k, m)
		}
	}
}

// isTable reports whether k names a table of the schema (a key with keys
// under it) rather than a value.
func isTable(k string) bool {
	for other := range knownKeys {
		if strings.HasPrefix(other, k+".") {
			return true
		}
	}
	return false
}

func TestHashString(t *testing.T) {
	m := Default()
	h := m.Hash()
	s := m.HashString()
	if s != fmt.Sprintf("%x", h) {
		t.Errorf("HashString() = %q, want %x", s, h)
	}
	if m.ShortHash() != s[:12] {
		t.Errorf("ShortHash() = %q, want %q", m.ShortHash(), s[:12])
	}
}
