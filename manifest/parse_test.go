package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func mustLoad(t *testing.T, path string) Manifest {
	t.Helper()
	m, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestParseExample(t *testing.T) {
	m := mustLoad(t, filepath.Join("testdata", "run.toml"))
	want := Manifest{
		RunID: "skein-small-01", Version: 1, Created: "2025-06-01T12:00:00Z",
		Model: Model{Preset: "small", Seed: 42, Batch: 16, SeqLen: 0},
		Optimizer: Optimizer{Kind: KindDiLoCo, InnerSteps: 100, InnerLR: 4e-4, Warmup: 100, TotalSteps: 20000,
			WeightDecay: 0.1, GradClip: 1, OuterLR: 0.7, OuterMomentum: 0.9, Nesterov: true, Delayed: false,
			GroupSize: 2, Gamma: 0.7},
		Wire: Wire{Codec: "minmax8"},
		Data: Data{Source: SourceShards, ValFraction: 0.02, ShardBytes: 64 << 20, Shards: []Shard{
			{Hash: "15c0f201cb87e86f96d52ed0ae05a262cc9bb6412c3ee93ae5b87d96122e444e", Bytes: 67108864, Files: 112},
			{Hash: "6c26c15631f11ae6bea043ea66a4a58e1abbdf95e87e987a45f6488a36712100", Bytes: 23462910, Files: 40},
		}},
		Admission: Admission{Mode: AdmissionOpen, MaxMembers: 256, MaxPerPrefix: 16},
		Pipeline:  Pipeline{Stages: 1, Microbatches: 4},
	}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", m, want)
	}
	if m.SeqLen() != 256 {
		t.Errorf("SeqLen() = %d, want the small preset's 256", m.SeqLen())
	}
}

// TestDocExample checks that the example in the package doc is
// testdata/run.toml, byte for byte.
func TestDocExample(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	got := docExample(doc)
	if got == nil {
		t.Fatal("doc.go has no indented block after its # Example heading")
	}
	want, err := os.ReadFile(filepath.Join("testdata", "run.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("doc.go's example differs from testdata/run.toml:\n%s", got)
	}
}

// docExample returns the first indented block after "// # Example" in a Go
// source file's comments, without the comment markers.
func docExample(src []byte) []byte {
	_, after, ok := bytes.Cut(src, []byte("// # Example\n"))
	if !ok {
		return nil
	}
	var block []byte
	for line := range bytes.Lines(after) {
		switch {
		case bytes.HasPrefix(line, []byte("//\t")):
			block = append(block, line[3:]...)
		case block != nil && string(line) == "//\n":
			block = append(block, '\n')
		case block != nil:
			return append(bytes.TrimRight(block, "\n"), '\n')
		}
	}
	return block
}

func TestParseEmptyIsDefault(t *testing.T) {
	for _, in := range []string{"", "# nothing\n", "[model]\n[optimizer]\n"} {
		m, err := Parse([]byte(in))
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if !reflect.DeepEqual(m, Default()) {
			t.Errorf("%q: got %+v, want Default()", in, m)
		}
	}
}

func TestParseTakesDefaultsForMissingKeys(t *testing.T) {
	m, err := Parse([]byte("run_id = \"r1\"\n[model]\nbatch = 32\n[optimizer]\ninner_lr = 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.RunID, want.Model.Batch, want.Optimizer.InnerLR = "r1", 32, 1
	if !reflect.DeepEqual(m, want) {
		t.Errorf("got %+v, want %+v", m, want)
	}
}

func TestParseNoLoCoDefaults(t *testing.T) {
	m, err := Parse([]byte("[optimizer]\nkind = \"noloco\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if o := m.Optimizer; o.OuterLR != 0.7 || o.OuterMomentum != 0.5 || o.GroupSize != 2 || o.Gamma != 0.7 {
		t.Errorf("noloco defaults: %+v, want outer lr 0.7, momentum 0.5, group 2, gamma 0.7", o)
	}
	m, err = Parse([]byte("[optimizer]\nkind = \"noloco\"\nouter_momentum = 0.9\nouter_lr = 0.5\n"))
	if err != nil {
		t.Fatal(err)
	}
	if o := m.Optimizer; o.OuterLR != 0.5 || o.OuterMomentum != 0.9 {
		t.Errorf("given values replaced: %+v", o)
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct{ in, want string }{
		// Unknown keys, anywhere.
		{"name = \"x\"\n", `manifest: unknown key "name"`},
		{"[model]\nlayers = 4\n", `manifest: unknown key "model.layers"`},
		{"[model.extra]\n", `manifest: unknown key "model.extra"`},
		{"[training]\nsteps = 1\n", `manifest: unknown key "training"`},
		{"[data]\nsource = \"shards\"\n[[data.shards]]\nhash = \"" + strings.Repeat("a", 64) + "\"\nbytes = 1\nfiles = 1\nsize = 3\n",
			`manifest: unknown key "data.shards.size"`},
		{"\"model.preset\" = \"tiny\"\n", `manifest: unknown key "\"model.preset\""`},
		{"model = { preset = \"tiny\", heads = 4 }\n", `manifest: unknown key "model.heads"`},
		// Keys are case-sensitive, though the TOML decoder is not.
		{"RUN_ID = \"x\"\n", `manifest: unknown key "RUN_ID" (keys are case-sensitive; did you mean "run_id"?)`},
		{"[Model]\npreset = \"small\"\n", `did you mean "model"?`},
		{"[model]\nPreset = \"small\"\n", `did you mean "model.preset"?`},
		// Syntax and types.
		{"run_id = \n", "manifest: toml: line 1"},
		{"run_id = \"a\"\nrun_id = \"b\"\n", "manifest: toml:"},
		{"[model]\nbatch = 8.5\n", "manifest: toml:"},
		{"[model]\nbatch = \"8\"\n", "manifest: toml:"},
		{"version = 99999999999999999999\n", "manifest: toml:"},
		{"created = 2025-06-01T12:00:00Z\n", "manifest: toml:"},
		{"[optimizer]\nnesterov = 1\n", "manifest: toml:"},
		{"[data]\nshards = 3\n", "manifest: toml:"},
		// Values, as Validate names them.
		{"[model]\nseed = -1\n", "manifest: model.seed = -1: must be >= 0"},
		{"[optimizer]\ninner_steps = 0\n", "manifest: optimizer.inner_steps = 0: must be positive"},
		{"[optimizer]\ninner_lr = nan\n", "manifest: optimizer.inner_lr = NaN: must be positive and finite"},
		{"[optimizer]\ngamma = -inf\n", "manifest: optimizer.gamma = -Inf:"},
		{"[admission]\nmode = \"closed\"\n", `manifest: admission.run_key = "": a closed run needs the run's public key`},
		{"[admission]\nmode = \"allowlist\"\n", `manifest: admission.mode = "allowlist": want "open" or "closed"`},
		{"[admission]\nmax_members = 0\n", `manifest: admission.max_members = 0: out of range [1, 65536]`},
		{"[admission]\nmax_members = \"10\"\n", "manifest: toml:"},
		{"[admission]\nrun_key = \"" + testRunKey + "\"\n", `manifest: admission.run_key = "` + testRunKey + `": applies to closed runs only`},
		{"[admission]\nmode = \"closed\"\nrun_key = \"" + testRunKey + "\"\nmax_per_prefix = 4\n", `manifest: admission.max_per_prefix = 4: applies to open runs only`},
		{"[admission]\nRun_Key = \"x\"\n", `did you mean "admission.run_key"?`},
		{"[admission]\ntoken = \"x\"\n", `manifest: unknown key "admission.token"`},
		{"[data]\nsource = \"shards\"\n", `manifest: data.shards = []: data.source = "shards" needs at least one shard`},
		{"[[data.shards]]\nhash = \"" + strings.Repeat("a", 64) + "\"\nbytes = 1\nfiles = 1\n",
			`manifest: data.shards = [1 entry]: must be empty when data.source = "local" (set data.source = "shards"`},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.in))
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: got %v, want ErrInvalid", c.in, err)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n\tgot  %q\n\twant %q in it", c.in, err, c.want)
		}
	}
}

// testRunKey is a valid admission.run_key (the public key of the seed
// 0x01 x 32).
const testRunKey = "iojj3XQJ8ZX9UtstPLpdcspnCb8dlBIb83SIAbQPb1w="

func TestParseClosedRun(t *testing.T) {
	m, err := Parse([]byte("run_id = \"private\"\n[admission]\nmode = \"closed\"\nrun_key = \"" + testRunKey + "\"\nmax_members = 40\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := Admission{Mode: AdmissionClosed, MaxMembers: 40, MaxPerPrefix: DefaultMaxPerPrefix, RunKey: testRunKey}
	if m.Admission != want {
		t.Errorf("admission %+v, want %+v", m.Admission, want)
	}
	if k := m.Admission.RunPublicKey(); len(k) != 32 || k[0] != 0x8a {
		t.Errorf("RunPublicKey() = %x", k)
	}
	if Default().Admission.RunPublicKey() != nil {
		t.Error("an open run has a run key")
	}
	// The keys left at their defaults are not written, the others are.
	c := string(m.Canonical())
	if !strings.HasSuffix(c, "[admission]\nmode = \"closed\"\nmax_members = 40\nrun_key = \""+testRunKey+"\"\n") {
		t.Errorf("canonical admission:\n%s", c)
	}
	roundTrip(t, "closed", m)
}

func TestParseSyntaxErrorUnwraps(t *testing.T) {
	_, err := Parse([]byte("[model\n"))
	var pe toml.ParseError
	if !errors.As(err, &pe) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("got %T %v, want a toml.ParseError matching ErrInvalid", err, err)
	}
}

func TestParseSize(t *testing.T) {
	pad := func(n int) []byte {
		b := []byte("run_id = \"big\"\n")
		return append(b, bytes.Repeat([]byte("#"), n-len(b))...)
	}
	if _, err := Parse(pad(MaxSize)); err != nil {
		t.Errorf("MaxSize bytes: %v", err)
	}
	_, err := Parse(pad(MaxSize + 1))
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("%d bytes, more than the limit of %d", MaxSize+1, MaxSize)) {
		t.Errorf("MaxSize+1 bytes: %v", err)
	}
	// Refused before decoding: an oversize input that is not TOML at all
	// gets the size error, not a syntax error.
	_, err = Parse(bytes.Repeat([]byte{'['}, MaxSize+1))
	if err == nil || !strings.Contains(err.Error(), "more than the limit") {
		t.Errorf("oversize garbage: %v", err)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.toml")); !errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrInvalid) {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.toml")
	if err := os.WriteFile(big, bytes.Repeat([]byte("#"), 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "more than the limit") {
		t.Errorf("big file: %v", err)
	}
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("version = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(bad)
	if want := bad + ": manifest: version = 2:"; !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("bad file: %v, want it to start with %q", err, want)
	}
}

// TestKnownKeys pins the schema's keys: adding or renaming one is a change
// of the manifest format.
func TestKnownKeys(t *testing.T) {
	want := []string{
		"run_id", "version", "created",
		"model", "model.preset", "model.seed", "model.batch", "model.seq_len",
		"optimizer", "optimizer.kind", "optimizer.inner_steps", "optimizer.inner_lr", "optimizer.warmup",
		"optimizer.total_steps", "optimizer.weight_decay", "optimizer.grad_clip", "optimizer.outer_lr",
		"optimizer.outer_momentum", "optimizer.nesterov", "optimizer.delayed", "optimizer.group_size", "optimizer.gamma",
		"wire", "wire.codec", "wire.outer", "wire.support_k", "wire.residual_decay", "wire.block_size", "wire.rotate", "wire.tiled",
		"data", "data.source", "data.val_fraction", "data.shard_bytes",
		"data.shards", "data.shards.hash", "data.shards.bytes", "data.shards.files",
		"data.shards.tokens", "data.shards.documents", "data.shards.split", "data.epochs", "data.max_tokens",
		"data.tokenizer", "data.tokenizer_hash",
		"admission", "admission.mode", "admission.max_members", "admission.max_per_prefix", "admission.run_key",
		"pipeline", "pipeline.stages", "pipeline.skip_ratio", "pipeline.microbatches", "pipeline.checkfree_plus",
	}
	if len(knownKeys) != len(want) {
		t.Errorf("%d known keys, want %d", len(knownKeys), len(want))
	}
	for _, k := range want {
		if !knownKeys[k] {
			t.Errorf("key %q missing", k)
		}
	}
}
