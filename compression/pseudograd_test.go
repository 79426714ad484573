package compression_test

import (
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/model"
)

// TestPseudoGradientTable prints, per codec, the size and relative L2 error
// of a real pseudo-gradient: the parameter difference between two `skein
// train` checkpoints H steps apart. It skips unless both paths are set:
//
//	skein train --preset tiny --steps 50 --out run && cp run/checkpoint.safetensors a.safetensors
//	skein train --preset tiny --steps 100 --resume --out run
//	SKEIN_CKPT_A=a.safetensors SKEIN_CKPT_B=run/checkpoint.safetensors \
//	    go test -run TestPseudoGradientTable -v ./compression
func TestPseudoGradientTable(t *testing.T) {
	pa, pb := os.Getenv("SKEIN_CKPT_A"), os.Getenv("SKEIN_CKPT_B")
	if pa == "" || pb == "" {
		t.Skip("set SKEIN_CKPT_A and SKEIN_CKPT_B to two checkpoints of one run")
	}
	a, err := model.LoadCheckpoint(pa)
	if err != nil {
		t.Fatal(err)
	}
	b, err := model.LoadCheckpoint(pb)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Params) != len(b.Params) {
		t.Fatalf("checkpoints hold %d and %d parameters", len(a.Params), len(b.Params))
	}
	delta := make([]float32, len(a.Params))
	for i := range delta {
		delta[i] = a.Params[i] - b.Params[i] // old minus new
	}
	t.Logf("pseudo-gradient: %d parameters, steps %d -> %d", len(delta), a.Step, b.Step)
	fmt.Printf("| codec | block | x smaller (no zstd) | x smaller (zstd 1) | x smaller (zstd 3) | rel. L2 error |\n|---|---|---|---|---|---|\n")
	fp32 := float64(4 * len(delta))
	dec, _ := compression.NewDecoder(compression.DefaultConfig())
	for _, c := range compression.Codecs() {
		blocks := []int{compression.DefaultBlockSize}
		if c == compression.Int8 || c == compression.Int4 {
			blocks = []int{64, 256, 1024, 4096}
		}
		for _, block := range blocks {
			var sizes [3]float64
			var relErr float64
			for i, level := range []int{0, 1, 3} {
				cfg := compression.DefaultConfig()
				cfg.Codec, cfg.BlockSize, cfg.ZstdLevel = c, block, level
				enc, err := compression.NewEncoder(cfg)
				if err != nil {
					t.Fatal(err)
				}
				frame, err := enc.Append(nil, delta, 1)
				if err != nil {
					t.Fatal(err)
				}
				enc.Close()
				sizes[i] = fp32 / float64(len(frame))
				y, err := dec.DecodeBytes(frame, nil)
				if err != nil {
					t.Fatal(err)
				}
				relErr = relL2(delta, y)
			}
			fmt.Printf("| %v | %d | %.2f | %.2f | %.2f | %.4f%% |\n", c, block, sizes[0], sizes[1], sizes[2], 100*relErr)
			if c == compression.Int8 && block == compression.DefaultBlockSize && (sizes[0] < 3.9 || relErr > 0.01) {
				t.Errorf("int8: %.2fx smaller, relative error %.4f; targets >= 3.9x, <= 1%%", sizes[0], relErr)
			}
			if c == compression.Int4 && block == compression.DefaultBlockSize && sizes[0] < 7.5 {
				t.Errorf("int4: %.2fx smaller; target >= 7.5x", sizes[0])
			}
		}
	}
}

func relL2(x, y []float32) float64 {
	var num, den float64
	for i := range x {
		d := float64(y[i]) - float64(x[i])
		num += d * d
		den += float64(x[i]) * float64(x[i])
	}
	return math.Sqrt(num / den)
}
