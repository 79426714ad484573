package model

import (
	"errors"
	"testing"
)

func TestPresetParamCounts(t *testing.T) {
	tests := []struct {
		preset   string
		min, max int
	}{
		{"tiny", 840_000, 845_000},              // issue: ~0.84M
		{"small", 10_800_000, 11_000_000},       // ~11M
		{"gpt2-124m", 124_000_000, 124_600_000}, // GPT-2 small, padded vocab
	}
	// The GPT-2 family: Hugging Face's parameter counts (tied embeddings)
	// plus the padding rows of wte (50304 - 50257 = 47 per channel).
	for _, tt := range []struct {
		preset string
		hf, c  int
	}{
		{"gpt2", 124_439_808, 768},
		{"gpt2-medium", 354_823_168, 1024},
		{"gpt2-large", 774_030_080, 1280},
		{"gpt2-xl", 1_557_611_200, 1600},
	} {
		c, err := Preset(tt.preset)
		if err != nil {
			t.Fatal(err)
		}
		if n, want := c.NumParams(), tt.hf+47*tt.c; n != want {
			t.Errorf("%s: %d parameters, want %d (Hugging Face's %d plus the padding)", tt.preset, n, want, tt.hf)
		}
	}
	if c, err := Preset("gpt2-124m"); err != nil || c.Name != "gpt2" {
		t.Errorf("the gpt2-124m alias: %+v, %v", c, err)
	}
	for _, tt := range tests {
		c, err := Preset(tt.preset)
		if err != nil {
			t.Fatal(err)
		}
		if n := c.NumParams(); n < tt.min || n > tt.max {
			t.Errorf("%s: %d parameters, want in [%d, %d]", tt.preset, n, tt.min, tt.max)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	good, _ := Preset("tiny")
	tests := []struct {
		name   string
		mutate func(*Config)
	}{
		{"zero vocab", func(c *Config) { c.Vocab = 0 }},
		{"padded smaller", func(c *Config) { c.PaddedVocab = c.Vocab - 1 }},
		{"heads do not divide", func(c *Config) { c.Heads = 3 }},
		{"no layers", func(c *Config) { c.Layers = 0 }},
		{"no context", func(c *Config) { c.MaxT = 0 }},
		{"huge", func(c *Config) { c.C = 1 << 20; c.Heads = 1 }},
	}
	if err := good.Validate(); err != nil {
		t.Fatalf("tiny: %v", err)
	}
	for _, tt := range tests {
		c := good
		tt.mutate(&c)
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: got %v, want ErrConfig", tt.name, err)
		}
	}
	if _, err := Preset("huge"); !errors.Is(err, ErrConfig) {
		t.Errorf("unknown preset: got %v", err)
	}
}

func TestStageLayoutsPartitionTheModel(t *testing.T) {
	c, _ := Preset("tiny")
	full := map[string]int{}
	for _, ts := range Layout(c, FullSpec(c)) {
		full[ts.Name] = ts.Size()
	}
	specs := []StageSpec{
		{FirstLayer: 0, LastLayer: 2, Embedding: true},
		{FirstLayer: 2, LastLayer: 3},
		{FirstLayer: 3, LastLayer: 4, Head: true},
	}
	seen := map[string]int{}
	for _, s := range specs {
		if err := s.Validate(c); err != nil {
			t.Fatal(err)
		}
		prev := -1
		for _, ts := range Layout(c, s) {
			if ts.Offset <= prev {
				t.Fatalf("offsets not increasing at %s", ts.Name)
			}
			prev = ts.Offset
			seen[ts.Name]++
		}
	}
	for name, size := range full {
		want := 1
		if name == "wte" {
			want = 2 // tied: the head stage keeps a copy
		}
		if seen[name] != want {
			t.Errorf("%s (%d) held by %d stages, want %d", name, size, seen[name], want)
		}
	}
	if err := (StageSpec{FirstLayer: 3, LastLayer: 5}).Validate(c); !errors.Is(err, ErrConfig) {
		t.Errorf("out-of-range stage accepted: %v", err)
	}
}
