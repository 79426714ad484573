package node

import (
	"errors"
	"math"
	"testing"

	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/optimizer"
)

func TestResidualRoundTripAndErrors(t *testing.T) {
	r := []float32{1, -2, 3.5, 0}
	b := encodeResidual(7, r)
	round, got, err := decodeResidual(b, 4)
	if err != nil || round != 7 || got[2] != 3.5 || got[1] != -2 {
		t.Fatalf("round trip: %d %v %v", round, got, err)
	}
	flip := func(i int) []byte { c := append([]byte(nil), b...); c[i] ^= 1; return c }
	for name, bad := range map[string][]byte{
		"empty": nil, "truncated": b[:len(b)-1], "magic": flip(0), "version": flip(4),
		"count": flip(16), "payload": flip(30), "checksum": flip(len(b) - 1),
		"nan":      encodeResidual(1, []float32{0, float32(math.NaN()), 0, 0}),
		"infinity": encodeResidual(1, []float32{0, 0, float32(math.Inf(-1)), 0}),
	} {
		if _, _, err := decodeResidual(bad, 4); !errors.Is(err, ErrBadState) {
			t.Errorf("%s: got %v, want ErrBadState", name, err)
		}
	}
	if _, _, err := decodeResidual(b, 3); !errors.Is(err, ErrBadState) {
		t.Errorf("other model size accepted: %v", err)
	}
}

// FuzzResidual: the residual decoder (bytes from the disk) never panics
// and allocates only for the caller's model size.
func FuzzResidual(f *testing.F) {
	f.Add(encodeResidual(3, []float32{1, 2}), 2)
	f.Add([]byte("SKRS"), 0)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1<<12 {
			return
		}
		if _, r, err := decodeResidual(b, n); err == nil && len(r) != n {
			t.Fatalf("decoded %d values for a model of %d", len(r), n)
		}
	})
}

// The manifest's wire becomes the optimizer's support: half by the
// momentum for a plain support with an outer momentum, all by the hash
// when rotated, one draw tiled over the chunks when tiled; every one
// valid.
func TestOuterSupportFromWire(t *testing.T) {
	for _, tc := range []struct {
		name     string
		wire     manifest.Wire
		momentum float64
		want     *optimizer.SupportConfig
	}{
		{"dense", manifest.Wire{Codec: "minmax8"}, 0.9, nil},
		{"plain", manifest.Wire{Codec: "sign", Outer: manifest.OuterSupport, SupportK: 64, ResidualDecay: 0.5}, 0.9,
			&optimizer.SupportConfig{Chunk: manifest.SupportChunk, K: 64, FromMomentum: 32, Decay: 0.5, FeedRounding: true}},
		{"plain, no momentum", manifest.Wire{Codec: "sign", Outer: manifest.OuterSupport, SupportK: 64, ResidualDecay: 0.5}, 0,
			&optimizer.SupportConfig{Chunk: manifest.SupportChunk, K: 64, Decay: 0.5, FeedRounding: true}},
		{"rotated", manifest.Wire{Codec: "sign", Outer: manifest.OuterSupport, SupportK: 1536, Rotate: true}, 0.9,
			&optimizer.SupportConfig{Chunk: manifest.SupportChunk, K: 1536, Rotate: true}},
		{"tiled", manifest.Wire{Codec: "sign", Outer: manifest.OuterSupport, SupportK: 1536, Rotate: true, Tiled: true}, 0.9,
			&optimizer.SupportConfig{Chunk: manifest.SupportChunk, K: 1536, Rotate: true, Tiled: true}},
	} {
		got := outerSupport(tc.wire, tc.momentum)
		if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
			continue
		}
		if got != nil {
			if err := got.Validate(); err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
		}
	}
}
