package trainer

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/pipeline"
)

// An existing checkpoint is never overwritten by accident: a new run on its
// directory is refused with the file and both ways out named, --force
// starts over, and --resume with --force is a contradiction.
func TestTrainRefusesExistingCheckpoint(t *testing.T) {
	out := t.TempDir()
	if _, err := Train(context.Background(), shortRun(t, out, 2)); err != nil {
		t.Fatal(err)
	}
	ck := filepath.Join(out, CheckpointFile)
	before, err := os.ReadFile(ck)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Train(context.Background(), shortRun(t, out, 3))
	if !errors.Is(err, ErrCheckpointExists) {
		t.Fatalf("second run: %v, want ErrCheckpointExists", err)
	}
	for _, want := range []string{ck, "--resume", "--force"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if after, _ := os.ReadFile(ck); string(after) != string(before) {
		t.Fatal("the refused run changed the checkpoint")
	}

	c := shortRun(t, out, 3)
	c.Resume, c.Force = true, true
	if _, err := Train(context.Background(), c); !errors.Is(err, ErrConfig) {
		t.Fatalf("--resume with --force: %v, want ErrConfig", err)
	}
	c.Resume = false
	res, err := Train(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if res.StartStep != 0 || res.EndStep != 3 {
		t.Fatalf("--force ran steps %d..%d, want 0..3", res.StartStep, res.EndStep)
	}
}

// Temporary files a crash left in the output directory go at start; other
// files, and temporary files newer than the process, stay.
func TestTrainRemovesStaleTempFiles(t *testing.T) {
	out := t.TempDir()
	old := time.Now().Add(-time.Hour)
	mk := func(name string, mod time.Time) string {
		p := filepath.Join(out, name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, mod, mod)
		return p
	}
	stale := mk(".checkpoint.safetensors.12345.tmp", old)
	kept := []string{mk("notes.tmp", old), mk(".metrics.jsonl.777.tmp", time.Now().Add(time.Minute))}
	if _, err := Train(context.Background(), shortRun(t, out, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temporary file kept: %v", err)
	}
	for _, p := range kept {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s removed: %v", p, err)
		}
	}
}

// A model that cannot fit is refused before anything is allocated, with
// both figures in GiB.
func TestNewSetupRefusesModelTooLarge(t *testing.T) {
	a := optimizer.DefaultAdamW()
	a.TotalSteps = 10
	cfg := SetupConfig{Preset: "tiny", Batch: 4, SeqLen: 64, AdamW: a, HostCopies: 4, MemAvailable: 1 << 20,
		CorpusPaths: []string{filepath.Join(t.TempDir(), "absent")}} // never opened: refused first
	_, err := NewSetup(cfg)
	if !errors.Is(err, ErrMemory) {
		t.Fatalf("got %v, want ErrMemory", err)
	}
	mc, _ := model.Preset("tiny")
	need := memoryNeed(mc, 4, 64, 4)
	if want := (4 + 4) * 4 * uint64(mc.NumParams()); need <= want {
		t.Fatalf("need %d bytes, not more than the %d of the parameter copies alone", need, want)
	}
	if n := strings.Count(err.Error(), "GiB"); n != 2 {
		t.Fatalf("error %q names %d figures in GiB, want 2", err, n)
	}
	if err := checkMemory(mc, 4, 64, 4, need, nil); err != nil {
		t.Fatalf("exactly enough memory refused: %v", err)
	}
}

// fakeGPU has memory of its own.
type fakeGPU struct{ free uint64 }

func (g fakeGPU) MemInfo() (uint64, uint64, error) { return g.free, 2 * g.free, nil }
func (g fakeGPU) Name() string                     { return "cuda:0 (fake)" }

// On a GPU the stage is held to the GPU's free memory, and only the outer
// state to the host's.
func TestCheckMemoryOnAGPU(t *testing.T) {
	mc, _ := model.Preset("tiny")
	onGPU := memoryNeed(mc, 4, 64, 0)
	host := 4 * 4 * uint64(mc.NumParams())
	for _, tc := range []struct {
		name       string
		free, host uint64
		fails      string
	}{
		{"fits", onGPU, host, ""},
		{"GPU too small", onGPU - 1, 1 << 40, "cuda:0 (fake)"},
		{"host too small for the outer state", 1 << 40, host - 1, "outer state"},
	} {
		err := checkMemory(mc, 4, 64, 4, tc.host, fakeGPU{tc.free})
		switch {
		case tc.fails == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.fails != "" && (!errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), tc.fails)):
			t.Errorf("%s: got %v, want ErrMemory naming %q", tc.name, err, tc.fails)
		}
	}
}

// flashGPU is a fake GPU that runs the fused attention: a CPU device with
// memory of its own that prefers the fused kernels.
type flashGPU struct {
	*kernels.CPU
	free uint64
}

func (g flashGPU) MemInfo() (uint64, uint64, error) { return g.free, 2 * g.free, nil }
func (g flashGPU) Name() string                     { return "cuda:0,flash (fake)" }
func (g flashGPU) PrefersFusedAttention() bool      { return true }

// On a device that runs the fused attention, the check counts its
// (B,NH,T) per layer, not the (B,NH,T,T) matrices: a batch that only fits
// that way is let in there and refused on a device without it.
func TestCheckMemoryCountsFusedAttention(t *testing.T) {
	mc, _ := model.Preset("tiny")
	const B, T = 8, 256
	dev := flashGPU{CPU: kernels.NewCPU(1)}
	fused, materialized := stageMemoryOn(dev, mc, model.FullSpec(mc), B, T, 0), memoryNeed(mc, B, T, 0)
	if fused >= materialized {
		t.Fatalf("fused %d bytes, materialized %d: the fused attention saves nothing", fused, materialized)
	}
	dev.free = fused
	if err := checkMemory(mc, B, T, 4, 1<<40, dev); err != nil {
		t.Fatalf("fits with the fused attention: %v", err)
	}
	if err := checkMemory(mc, B, T, 4, 1<<40, fakeGPU{fused}); !errors.Is(err, ErrMemory) {
		t.Fatalf("the same memory without the fused attention: %v, want ErrMemory", err)
	}
}

func TestParseMemAvailable(t *testing.T) {
	got, ok := parseMemAvailable([]byte("MemTotal:       32774000 kB\nMemFree:  100 kB\nMemAvailable:   24177752 kB\n"))
	if !ok || got != 24177752<<10 {
		t.Fatalf("got %d, %v", got, ok)
	}
	if _, ok := parseMemAvailable([]byte("MemTotal: 1 kB\n")); ok {
		t.Fatal("MemAvailable found in a meminfo without it")
	}
}

// A non-finite loss is reported as ErrNonFinite, not as any other failure.
func TestStepReportsNonFinite(t *testing.T) {
	a := optimizer.DefaultAdamW()
	a.TotalSteps = 10
	su, err := NewSetup(SetupConfig{Preset: "tiny", Batch: 2, SeqLen: 16, Threads: 1, AdamW: a})
	if err != nil {
		t.Fatal(err)
	}
	defer su.Close()
	p := make([]float32, su.Stage.NumParams())
	su.Dev.CopyOut(p, su.Stage.Params)
	for i := range p[:su.Model.C*su.Model.PaddedVocab] { // wte: every token's embedding
		p[i] = float32(math.NaN())
	}
	su.Dev.CopyIn(su.Stage.Params, p)
	if _, err := su.Step(0); !errors.Is(err, ErrNonFinite) {
		t.Fatalf("poisoned weights: %v, want ErrNonFinite", err)
	}
}

// A staged volunteer is held to the largest stage it could be given: less
// than the whole model, and refused below it.
func TestCheckStageMemory(t *testing.T) {
	mc, _ := model.Preset("small")
	specs, err := pipeline.SplitLayers(mc, 3)
	if err != nil {
		t.Fatal(err)
	}
	var big uint64
	for _, sp := range specs {
		big = max(big, StageMemoryNeed(mc, sp, 4, 64, 7))
	}
	if whole := memoryNeed(mc, 4, 64, 7); big >= whole {
		t.Fatalf("largest stage needs %d bytes, the whole model %d", big, whole)
	}
	if err := CheckStageMemory(mc, specs, 4, 64, 7, big, nil); err != nil {
		t.Fatalf("exactly enough refused: %v", err)
	}
	err = CheckStageMemory(mc, specs, 4, 64, 7, big-1, nil)
	if !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), "stage ") {
		t.Fatalf("one byte short: %v", err)
	}
	if err := CheckStageMemory(mc, specs, 4, 64, 7, 1<<40, fakeGPU{free: 1 << 20}); !errors.Is(err, ErrMemory) || !strings.Contains(err.Error(), "fake") {
		t.Fatalf("a GPU too small: %v", err)
	}
}

// The GPT-2 family on this project's 24 GiB CPU machines, as a DiLoCo
// volunteer holds it (four parameter copies of its own and four of the
// outer optimizer's) at batch B x 1024: gpt2 fits at 8 (18 GiB),
// gpt2-medium only at 1 (14 GiB; 41 GiB at 8), gpt2-large and gpt2-xl
// never (23 and 46 GiB for the parameter copies alone): refused before
// anything is allocated, with the figures that say why.
func TestGPT2FamilyMemory(t *testing.T) {
	const machine = 24 << 30
	for _, tc := range []struct {
		preset string
		batch  int
		fits   bool
	}{
		{"gpt2", 8, true},
		{"gpt2-medium", 1, true},
		{"gpt2-medium", 8, false},
		{"gpt2-large", 1, false},
		{"gpt2-xl", 1, false},
	} {
		mc, err := model.Preset(tc.preset)
		if err != nil {
			t.Fatal(err)
		}
		err = checkMemory(mc, tc.batch, 1024, 4, machine, nil)
		if tc.fits != (err == nil) || (err != nil && !errors.Is(err, ErrMemory)) {
			t.Errorf("%s at batch %d: need %.1f GiB of %d: %v", tc.preset, tc.batch, gib(memoryNeed(mc, tc.batch, 1024, 4)), machine>>30, err)
		}
	}
}
