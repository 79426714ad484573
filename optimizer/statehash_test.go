package optimizer

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"math"
	"slices"
	"testing"
)

// body encodes phi then mom as the state's body (float32 LE).
func body(phi, mom []float32) []byte {
	var b []byte
	for _, v := range [][]float32{phi, mom} {
		for _, x := range v {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(x))
		}
	}
	return b
}

// The streamed chunk hashes are the hashes of the encoded body's slices,
// for sizes around the chunk boundary, and every element, the round and the
// size change the root.
func TestStateChunkHashes(t *testing.T) {
	per := StateChunkBytes / 8 // parameters per chunk (phi and mom both)
	for _, n := range []int{0, 1, 3, per - 1, per, per + 1, 2*per + 5, 3*per/2 + 7} {
		phi, mom := make([]float32, n), make([]float32, n)
		for i := range phi {
			phi[i], mom[i] = float32(i)*0.5, -float32(i)-1 // no -0: mom[i]++ then -- must give the same bits
		}
		got := StateChunkHashes(phi, mom)
		if len(got) != StateChunks(n) {
			t.Fatalf("n=%d: %d chunks, StateChunks says %d", n, len(got), StateChunks(n))
		}
		if p := stateChunkHashesPortable(phi, mom); !slices.Equal(p, got) {
			t.Fatalf("n=%d: the in-place hashes differ from the portable ones", n)
		}
		b := body(phi, mom)
		for c := range got {
			want := sha256.Sum256(b[c*StateChunkBytes : min((c+1)*StateChunkBytes, len(b))])
			if got[c] != want {
				t.Fatalf("n=%d: chunk %d differs from the body's slice", n, c)
			}
		}
		if n == 0 {
			continue
		}
		root := StateHashOf(7, phi, mom)
		if StateHashOf(8, phi, mom) == root {
			t.Fatalf("n=%d: the round does not change the root", n)
		}
		for _, i := range []int{0, n - 1} {
			mom[i]++
			if StateHashOf(7, phi, mom) == root {
				t.Fatalf("n=%d: mom[%d] does not change the root", n, i)
			}
			mom[i]--
		}
		if StateHashOf(7, phi, mom) != root {
			t.Fatalf("n=%d: the root is not a function of the state", n)
		}
		if StateRoot(7, n+1, got) == root {
			t.Fatalf("n=%d: the size does not change the root", n)
		}
	}
}

// TestAppendFloats: the bulk copy writes the bytes the portable loop
// does, little-endian fp32, ±0, NaN and infinities included.
func TestAppendFloats(t *testing.T) {
	v := []float32{0, float32(math.Copysign(0, -1)), 1.5, -2.25e-30, float32(math.Inf(1)), float32(math.NaN()), math.MaxFloat32}
	var want []byte
	for _, x := range v {
		want = binary.LittleEndian.AppendUint32(want, math.Float32bits(x))
	}
	if got := AppendFloats([]byte("head"), v); !bytes.Equal(got, append([]byte("head"), want...)) {
		t.Fatalf("got % x\nwant head % x", got, want)
	}
}
