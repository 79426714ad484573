package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ml/skein/trainer"
	"github.com/urfave/cli/v2"
)

// TestTrainConfigPrecedence checks flags > SKEIN_* environment > --config
// file > defaults, one setting per layer.
func TestTrainConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "run.toml")
	os.WriteFile(file, []byte("steps = 111\nbatch = 3\nlr = 0.005\npreset = \"small\"\n"), 0o644)
	t.Setenv("SKEIN_BATCH", "5")
	t.Setenv("SKEIN_LR", "0.002")

	var got trainer.TrainConfig
	app := newApp()
	for _, cmd := range app.Commands {
		if cmd.Name == "train" {
			cmd.Action = func(c *cli.Context) error {
				var err error
				got, err = trainConfig(c)
				return err
			}
		}
	}
	if err := app.Run([]string{"skein", "train", "--config", file, "--lr", "0.003"}); err != nil {
		t.Fatal(err)
	}
	def := trainer.DefaultTrainConfig()
	tests := []struct {
		name      string
		got, want any
	}{
		{"flag beats env and file", got.AdamW.LR, 0.003},
		{"env beats file", got.Batch, 5},
		{"file beats default", got.Steps, 111},
		{"file string", got.Preset, "small"},
		{"default", got.EvalEvery, def.EvalEvery},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

func TestTrainRejectsBadSettings(t *testing.T) {
	for _, args := range [][]string{
		{"skein", "train", "--steps", "0"},
		{"skein", "train", "--preset", "huge"},
		{"skein", "train", "stray-argument"},
		{"skein", "--log-level", "loud", "train"},
	} {
		app := newApp()
		for _, cmd := range app.Commands {
			if cmd.Name == "train" {
				cmd.Action = func(c *cli.Context) error { _, err := trainConfig(c); return err }
			}
		}
		if err := app.Run(args); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}

// `skein train` on a directory holding a checkpoint is refused unless
// --resume or --force says what to do with it; the error names the file and
// both flags, and nothing is trained.
func TestTrainRefusesToOverwriteCheckpoint(t *testing.T) {
	out := t.TempDir()
	ck := filepath.Join(out, trainer.CheckpointFile)
	if err := os.WriteFile(ck, []byte("an earlier run"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := newApp().Run([]string{"skein", "train", "--quiet", "--out", out, "--steps", "1"})
	if err == nil {
		t.Fatal("existing checkpoint overwritten")
	}
	for _, want := range []string{ck, "--resume", "--force"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if b, _ := os.ReadFile(ck); string(b) != "an earlier run" {
		t.Fatalf("checkpoint changed to %q", b)
	}
	if err := newApp().Run([]string{"skein", "train", "--out", out, "--resume", "--force"}); err == nil {
		t.Fatal("--resume with --force accepted")
	}
	var got trainer.TrainConfig
	app := newApp()
	for _, cmd := range app.Commands {
		if cmd.Name == "train" {
			cmd.Action = func(c *cli.Context) error { got, err = trainConfig(c); return err }
		}
	}
	if err := app.Run([]string{"skein", "train", "--out", out, "--force"}); err != nil || !got.Force {
		t.Fatalf("--force: err %v, Force %v", err, got.Force)
	}
}
