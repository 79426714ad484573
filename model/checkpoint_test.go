package model

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ml/skein/kernels"
)

func TestCheckpointRoundTripBitExact(t *testing.T) {
	dev := kernels.NewCPU(1)
	s, err := NewStage(dev, micro, FullSpec(micro), 1, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	randomize(s, 8)
	// Give the moments distinct contents too.
	m := make([]float32, s.NumParams())
	for i := range m {
		m[i] = float32(i) * 1e-3
	}
	dev.CopyIn(s.M, m)
	dev.CopyIn(s.V, m)
	ck := s.Snapshot(42, map[string]string{"skein.run": `{"x":1}`})
	path := filepath.Join(t.TempDir(), "ck.safetensors")
	if err := SaveCheckpoint(path, ck); err != nil {
		t.Fatal(err)
	}
	got, err := LoadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Step != 42 || got.Meta["skein.run"] != `{"x":1}` || got.Config != micro || got.Spec != FullSpec(micro) {
		t.Fatalf("metadata: step %d meta %v config %+v", got.Step, got.Meta, got.Config)
	}
	for name, pair := range map[string][2][]float32{"params": {ck.Params, got.Params}, "m": {ck.M, got.M}, "v": {ck.V, got.V}} {
		for i := range pair[0] {
			if math.Float32bits(pair[0][i]) != math.Float32bits(pair[1][i]) {
				t.Fatalf("%s[%d]: %v != %v", name, i, pair[0][i], pair[1][i])
			}
		}
	}
	s2, _ := NewStage(dev, micro, FullSpec(micro), 1, 4, 99)
	if err := s2.Restore(got); err != nil {
		t.Fatal(err)
	}
	other := micro
	other.Layers = 1
	s3, _ := NewStage(dev, other, FullSpec(other), 1, 4, 1)
	if err := s3.Restore(got); !errors.Is(err, ErrCheckpoint) {
		t.Errorf("restoring into another config: %v", err)
	}

	raw, _ := os.ReadFile(path)
	// A flipped bit in the data (same size, valid structure) is caught by the checksum.
	flipped := append([]byte(nil), raw...)
	flipped[len(flipped)-3] ^= 0x10
	fp := filepath.Join(t.TempDir(), "flip.safetensors")
	os.WriteFile(fp, flipped, 0o644)
	if _, err := LoadCheckpoint(fp); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("bit flip: got %v, want a checksum error", err)
	}
	for _, cut := range []int{0, 7, 100, len(raw) / 2, len(raw) - 4} {
		p := filepath.Join(t.TempDir(), "cut.safetensors")
		os.WriteFile(p, raw[:cut], 0o644)
		_, err := LoadCheckpoint(p)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("truncated to %d bytes: got %v, want ErrMalformed", cut, err)
		} else if !strings.Contains(err.Error(), p) {
			t.Errorf("error does not name the file: %v", err)
		}
	}
}
