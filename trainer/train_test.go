package trainer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
)

func testConfig(t *testing.T, out string) TrainConfig {
	t.Helper()
	c := DefaultTrainConfig()
	c.Out = out
	c.Threads = 2
	c.EvalEvery = 0
	c.CheckpointEvery = 0
	return c
}

// The bar: 30 steps of tiny on the Go corpus lower the training loss
// from about ln(256) = 5.55 by at least 1.5 (averaged over the last 5 steps,
// so one noisy batch cannot pass or fail it).
func TestTrainTinyLowersLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("trains 30 steps")
	}
	c := testConfig(t, t.TempDir())
	c.Steps = 30
	c.EvalEvery = 30
	c.EvalBatches = 2
	res, err := Train(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Losses) != 30 {
		t.Fatalf("%d losses, want 30", len(res.Losses))
	}
	first := res.Losses[0]
	if math.Abs(float64(first)-math.Log(256)) > 0.3 {
		t.Errorf("initial loss %.3f, want about ln(256) = 5.55", first)
	}
	var last float64
	for _, l := range res.Losses[25:] {
		last += float64(l) / 5
	}
	t.Logf("loss %.3f -> %.3f (mean of last 5), val %.3f, %.0f tokens/s", first, last, res.ValLosses[30], res.TokensPerSec)
	if float64(first)-last < 1.5 {
		t.Errorf("loss fell by %.3f, want >= 1.5", float64(first)-last)
	}
	if _, err := os.Stat(filepath.Join(c.Out, CheckpointFile)); err != nil {
		t.Errorf("no checkpoint at exit: %v", err)
	}
}

func shortRun(t *testing.T, out string, steps int) TrainConfig {
	c := testConfig(t, out)
	c.Steps = steps
	c.Batch = 4
	c.SeqLen = 64
	c.AdamW.Warmup = 3
	return c
}

func equalLosses(t *testing.T, name string, a, b []float32) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d vs %d losses", name, len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("%s: step %d loss %v vs %v (not bit-identical)", name, i, a[i], b[i])
		}
	}
}

func TestTrainDeterministic(t *testing.T) {
	a, err := Train(context.Background(), shortRun(t, "", 6))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Train(context.Background(), shortRun(t, "", 6))
	if err != nil {
		t.Fatal(err)
	}
	equalLosses(t, "same seed", a.Losses, b.Losses)
	c := shortRun(t, "", 6)
	c.Seed = 2
	d, err := Train(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if math.Float32bits(d.Losses[5]) == math.Float32bits(a.Losses[5]) {
		t.Errorf("a different seed gave the same loss %v", d.Losses[5])
	}
}

// Interrupt at step k (as Ctrl-C does), resume, and compare with an
// uninterrupted run: the losses must be bit-identical.
func TestTrainInterruptResumeMatchesUninterrupted(t *testing.T) {
	const steps, stopAfter = 10, 4
	full, err := Train(context.Background(), shortRun(t, t.TempDir(), steps))
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	c := shortRun(t, out, steps)
	c.OnStep = func(step int, _ float32) {
		if step == stopAfter-1 {
			cancel()
		}
	}
	first, err := Train(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if !first.Interrupted || first.EndStep != stopAfter {
		t.Fatalf("interrupted=%v at step %d, want true at %d", first.Interrupted, first.EndStep, stopAfter)
	}
	c = shortRun(t, out, steps)
	c.Resume = true
	second, err := Train(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if second.StartStep != stopAfter {
		t.Fatalf("resumed at step %d, want %d", second.StartStep, stopAfter)
	}
	equalLosses(t, "resumed", append(first.Losses, second.Losses...), full.Losses)
	raw, err := os.ReadFile(filepath.Join(out, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(raw, []byte("\n")); n != steps {
		t.Errorf("metrics.jsonl has %d records after a resume, want %d", n, steps)
	}
}

func TestTrainResumeRefusesOtherRun(t *testing.T) {
	out := t.TempDir()
	if _, err := Train(context.Background(), shortRun(t, out, 2)); err != nil {
		t.Fatal(err)
	}
	c := shortRun(t, out, 4)
	c.Seed = 7
	c.Resume = true
	if _, err := Train(context.Background(), c); !errors.Is(err, ErrResumeMismatch) {
		t.Fatalf("got %v, want ErrResumeMismatch", err)
	}
}

func TestTrainConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*TrainConfig)
	}{
		{"steps", func(c *TrainConfig) { c.Steps = 0 }},
		{"batch", func(c *TrainConfig) { c.Batch = -1 }},
		{"preset", func(c *TrainConfig) { c.Preset = "huge" }},
		{"lr", func(c *TrainConfig) { c.AdamW.LR = 0 }},
		{"resume without out", func(c *TrainConfig) { c.Resume = true; c.Out = "" }},
	}
	for _, tt := range tests {
		c := DefaultTrainConfig()
		tt.mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", tt.name)
		}
	}
	c := DefaultTrainConfig()
	c.SeqLen = 1000
	if _, err := Train(context.Background(), c); !errors.Is(err, ErrConfig) {
		t.Errorf("seq-len beyond context: %v", err)
	}
}

// After a crash, the steps since the last checkpoint run again: their old
// records are dropped so that each step appears once.
func TestTrimMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	var b bytes.Buffer
	for i := 0; i < 10; i++ {
		fmt.Fprintf(&b, "{\"step\":%d,\"loss\":1}\n", i)
	}
	b.WriteString("{\"step\":9") // torn last line
	os.WriteFile(path, b.Bytes(), 0o644)
	if err := trimMetrics(path, 4); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if n := bytes.Count(raw, []byte("\n")); n != 4 || !bytes.HasSuffix(raw, []byte("{\"step\":3,\"loss\":1}\n")) {
		t.Fatalf("kept:\n%s", raw)
	}
	if err := trimMetrics(filepath.Join(t.TempDir(), "absent.jsonl"), 3); err != nil {
		t.Fatalf("missing file: %v", err)
	}
}
