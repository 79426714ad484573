package pipeline

import (
	"math"
	"slices"
	"testing"
)

// The weights a node serves to a neighbour's replacement: what is encoded
// decodes to the same bits; a wrong size, a norm that is not a finite
// non-negative number, or a weight that is not finite is refused.
func TestStageWeights(t *testing.T) {
	params := []float32{1, -2.5, 3.39e38, 0}
	b := EncodeStageWeights(0.75, params)
	norm, got, err := DecodeStageWeights(b, len(params))
	if err != nil || norm != 0.75 || !slices.Equal(got, params) {
		t.Fatalf("round trip: %v %v %v", norm, got, err)
	}
	for name, c := range map[string]struct {
		b []byte
		n int
	}{
		"short":         {b[:len(b)-1], len(params)},
		"long":          {append(slices.Clone(b), 0), len(params)},
		"other n":       {b, len(params) + 1},
		"negative n":    {b, -1},
		"NaN norm":      {EncodeStageWeights(math.NaN(), params), len(params)},
		"negative norm": {EncodeStageWeights(-1, params), len(params)},
		"NaN weight":    {EncodeStageWeights(0.75, []float32{1, float32(math.NaN())}), 2},
		"Inf weight":    {EncodeStageWeights(0.75, []float32{float32(math.Inf(-1)), 1}), 2},
	} {
		if _, _, err := DecodeStageWeights(c.b, c.n); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzStageWeights: any bytes, any claimed size: an error or a decode whose
// re-encoding is the input, never a panic.
func FuzzStageWeights(f *testing.F) {
	f.Add(EncodeStageWeights(1.5, []float32{1, 2, 3}), 3)
	f.Add([]byte{}, 0)
	f.Add(make([]byte, 7), 0)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		norm, w, err := DecodeStageWeights(b, n)
		if err != nil {
			return
		}
		if again := EncodeStageWeights(norm, w); !slices.Equal(again, b) {
			t.Fatalf("decode of %x re-encodes to %x", b, again)
		}
	})
}
