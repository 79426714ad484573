package compression

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

func randTensor(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * math.Exp(r.NormFloat64()))
	}
	return x
}

// The frame decodes to exactly what the encoder says it sent: at each
// chunk's K largest magnitudes (the lower index between equals), the
// element's sign times its half's mean magnitude; zero elsewhere.
func TestSparseRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		n, c, k int
	}{
		{4096, 4096, 64}, {10000, 4096, 64}, {100, 64, 1}, {65, 64, 64}, {1, 64, 8}, {5000, 256, 255}, {70000, 65536, 3},
	} {
		x := randTensor(tt.n, uint64(tt.n))
		if tt.n == 5000 {
			for i := range x[:300] {
				x[i] = 1 // ties
			}
		}
		enc, err := NewSparseEncoder(SparseConfig{Chunk: tt.c, K: tt.k, Level: 1})
		if err != nil {
			t.Fatal(err)
		}
		sent := make([]float32, tt.n)
		b, err := enc.Append(nil, x, sent)
		if err != nil {
			t.Fatal(err)
		}
		dec, _ := NewSparseDecoder()
		got := make([]float32, tt.n)
		if err := dec.Decode(b, got); err != nil {
			t.Fatalf("%+v: %v", tt, err)
		}
		if !slices.Equal(got, sent) {
			t.Fatalf("%+v: decode differs from what was sent", tt)
		}
		// Which elements: the k largest per chunk.
		for base := 0; base < tt.n; base += tt.c {
			m := min(tt.c, tt.n-base)
			k := min(tt.k, m)
			idx := make([]int, m)
			for i := range idx {
				idx[i] = i
			}
			sort.SliceStable(idx, func(a, b int) bool {
				return math.Abs(float64(x[base+idx[a]])) > math.Abs(float64(x[base+idx[b]]))
			})
			want := map[int]bool{}
			for _, i := range idx[:k] {
				want[i] = true
			}
			for i := range m {
				v, in := got[base+i], want[i]
				if in && x[base+i] != 0 && math.Signbit(float64(v)) != math.Signbit(float64(x[base+i])) {
					t.Fatalf("%+v: element %d sent with the wrong sign", tt, base+i)
				}
				if !in && v != 0 {
					t.Fatalf("%+v: element %d (|x| %v) sent, not among the %d largest", tt, base+i, x[base+i], k)
				}
			}
		}
		// Deterministic.
		b2, _ := enc.Append(nil, x, nil)
		if !bytes.Equal(b, b2) {
			t.Fatalf("%+v: two encodings differ", tt)
		}
	}
}

// Error feedback telescopes: with beta = 1, what was sent over many rounds
// sums to what was meant, up to the residual left, and the residual stays
// bounded.
func TestSparseFeedbackTelescopes(t *testing.T) {
	const n = 8192
	enc, _ := NewSparseEncoder(DefaultSparseConfig())
	dec, _ := NewSparseDecoder()
	f, err := NewSparseFeedback(n, 1)
	if err != nil {
		t.Fatal(err)
	}
	meant, sentSum := make([]float64, n), make([]float64, n)
	got := make([]float32, n)
	var maxRes float64
	for round := range 200 {
		delta := randTensor(n, uint64(round))
		b, err := f.Encode(enc, nil, delta)
		if err != nil {
			t.Fatal(err)
		}
		if err := dec.Decode(b, got); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			meant[i] += float64(delta[i])
			sentSum[i] += float64(got[i])
		}
		for _, e := range f.Residual() {
			maxRes = max(maxRes, math.Abs(float64(e)))
		}
	}
	var worst float64
	for i := range n {
		worst = max(worst, math.Abs(meant[i]-sentSum[i]-float64(f.Residual()[i])))
	}
	if worst > 1e-2 {
		t.Fatalf("sum sent + residual differs from sum meant by %v", worst)
	}
	if maxRes > 200 {
		t.Fatalf("residual grew to %v", maxRes)
	}
}

func TestSparseBadInput(t *testing.T) {
	enc, _ := NewSparseEncoder(DefaultSparseConfig())
	x := randTensor(5000, 1)
	b, _ := enc.Append(nil, x, nil)
	dec, _ := NewSparseDecoder()
	got := make([]float32, 5000)
	if err := dec.Decode(b, make([]float32, 4999)); !errors.Is(err, ErrSparseFormat) {
		t.Fatalf("wrong length: %v", err)
	}
	for i := range b {
		c := slices.Clone(b)
		c[i] ^= 0x10
		if err := dec.Decode(c, got); !errors.Is(err, ErrSparseFormat) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
	if err := dec.Decode(b[:len(b)-1], got); !errors.Is(err, ErrSparseFormat) {
		t.Fatalf("truncated: %v", err)
	}
	x[7] = float32(math.NaN())
	if _, err := enc.Append(nil, x, nil); !errors.Is(err, ErrNonFinite) {
		t.Fatalf("NaN: %v", err)
	}
	if _, err := NewSparseEncoder(SparseConfig{Chunk: 4096, K: 0, Level: 1}); !errors.Is(err, ErrConfig) {
		t.Fatalf("K 0: %v", err)
	}
}

// The decoder is bounded and never panics; a frame that decodes has
// strictly increasing positions and finite values.
func FuzzSparseDecode(f *testing.F) {
	enc, _ := NewSparseEncoder(SparseConfig{Chunk: 64, K: 5, Level: 1})
	for _, n := range []int{1, 64, 200} {
		b, _ := enc.Append(nil, randTensor(n, uint64(n)), nil)
		f.Add(b, uint16(n))
	}
	dec, _ := NewSparseDecoder()
	f.Fuzz(func(t *testing.T, b []byte, n uint16) {
		dst := make([]float32, int(n)+1)
		if err := dec.Decode(b, dst); err != nil {
			if !errors.Is(err, ErrSparseFormat) {
				t.Fatalf("error not ErrSparseFormat: %v", err)
			}
			return
		}
		for i, v := range dst {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("element %d is %v", i, v)
			}
		}
	})
}

// A chunk's body, past the frame's checksum, decodes or is refused: never
// a panic, a position out of order or a non-finite value.
func FuzzSparseChunk(f *testing.F) {
	enc, _ := NewSparseEncoder(SparseConfig{Chunk: 64, K: 5, Level: 1})
	enc.Append(nil, randTensor(64, 3), nil)
	f.Add(enc.body, uint16(64), uint16(5))
	f.Add(make([]byte, 40), uint16(100), uint16(7))
	f.Fuzz(func(t *testing.T, b []byte, m, k uint16) {
		if m == 0 || k == 0 || k > m {
			return
		}
		if len(b) != chunkBodyLen(int(m), int(k)) {
			b = append(b, make([]byte, max(0, chunkBodyLen(int(m), int(k))-len(b)))...)[:chunkBodyLen(int(m), int(k))]
		}
		dst := make([]float32, m)
		if err := decodeSparseChunk(b, dst, int(k), 0, false); err != nil {
			if !errors.Is(err, ErrSparseFormat) {
				t.Fatal(err)
			}
			return
		}
		nz := 0
		for i, v := range dst {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("element %d is %v", i, v)
			}
			if v != 0 {
				nz++
			}
		}
		if nz > int(k) {
			t.Fatalf("%d elements set, k %d", nz, k)
		}
	})
}
