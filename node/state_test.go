package node

import (
	"errors"
	"math"
	"testing"
)

func TestStateRoundTripAndErrors(t *testing.T) {
	phi, mom := []float32{1, -2, 3.5}, []float32{0, 0.25, -1}
	b := encodeState(7, phi, mom)
	round, p, m, err := decodeState(b, 3)
	if err != nil || round != 7 || p[2] != 3.5 || m[1] != 0.25 {
		t.Fatalf("round trip: %d %v %v %v", round, p, m, err)
	}
	flip := func(i int) []byte { c := append([]byte(nil), b...); c[i] ^= 1; return c }
	nan := encodeState(1, []float32{float32(math.NaN()), 0, 0}, mom)
	for name, bad := range map[string][]byte{
		"empty": nil, "truncated": b[:len(b)-1], "magic": flip(0), "version": flip(4),
		"count": flip(16), "payload": flip(30), "checksum": flip(len(b) - 1), "nan": nan,
	} {
		if _, _, _, err := decodeState(bad, 3); !errors.Is(err, ErrBadState) {
			t.Errorf("%s: got %v, want ErrBadState", name, err)
		}
	}
	if _, _, _, err := decodeState(b, 4); !errors.Is(err, ErrBadState) {
		t.Errorf("other model size accepted: %v", err)
	}
}

// FuzzState: the state decoder (bytes from a peer or the disk) never
// panics and allocates only for the caller's model size.
func FuzzState(f *testing.F) {
	f.Add(encodeState(3, []float32{1, 2}, []float32{3, 4}), 2)
	f.Add([]byte("SKST"), 0)
	f.Fuzz(func(t *testing.T, b []byte, n int) {
		if n < 0 || n > 1<<12 {
			return
		}
		if _, p, _, err := decodeState(b, n); err == nil && len(p) != n {
			t.Fatalf("decoded %d parameters, want %d", len(p), n)
		}
	})
}
