package compression

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// minMaxBits agrees with the builtin min and max, signed zeros included.
func TestMinMaxBits(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	vals := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 0x1p-149, -0x1p-149, math.MaxFloat32, -math.MaxFloat32, 0x1p-126, -0x1p-126, 3.5, -3.5}
	for iter := range 20000 {
		n := 1 + r.IntN(40)
		x := make([]float32, n)
		for i := range x {
			if iter%2 == 0 {
				x[i] = vals[r.IntN(len(vals))]
			} else {
				x[i] = math.Float32frombits(r.Uint32() &^ (1 << 30)) // finite
			}
		}
		mn, mx := x[0], x[0]
		for _, v := range x {
			mn, mx = min(mn, v), max(mx, v)
		}
		gmn, gmx := minMaxBits(x)
		if gmn != math.Float32bits(mn) || gmx != math.Float32bits(mx) {
			t.Fatalf("%v: minMaxBits gives %#08x %#08x, want %#08x %#08x", x, gmn, gmx, math.Float32bits(mn), math.Float32bits(mx))
		}
	}
}

// minMax8Inputs returns tensors that exercise encodeMinMax8: Gaussian data at
// many scales, one-sided blocks, constant blocks, blocks of signed zeros,
// tiny ranges around 2^-100, float32 subnormals, magnitudes up to 2^126,
// outliers, and blocks ending in an unpaired element.
func minMax8Inputs(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	negZero := float32(math.Copysign(0, -1))
	kind := r.IntN(10)
	for i := range x {
		g := float32(r.NormFloat64())
		switch kind {
		case 0:
			x[i] = g
		case 1:
			x[i] = g * float32(math.Pow(2, float64(r.IntN(250)-125)))
		case 2:
			x[i] = float32(math.Abs(float64(g))) + 1 // all positive
		case 3:
			x[i] = -float32(math.Abs(float64(g))) - 1e-3 // all negative
		case 4:
			x[i] = []float32{0, negZero}[r.IntN(2)] // signed zeros only
		case 5:
			x[i] = []float32{0, negZero, 0x1p-149, -0x1p-149, 1, -1}[r.IntN(6)]
		case 6:
			x[i] = 3.25 + []float32{0, 0x1p-100 * 3.25, 0x1p-22}[r.IntN(3)] // constant or almost
		case 7:
			x[i] = g * 0x1p-101 // ranges around the 2^-100 threshold
		case 8:
			x[i] = g * 0x1p125 // near the 2^126 limit
			if r.IntN(64) == 0 {
				x[i] = []float32{0x1p126, -0x1p126}[r.IntN(2)]
			}
		default:
			x[i] = g
			if r.IntN(50) == 0 {
				x[i] *= 1e4 // outliers
			}
		}
	}
	return x
}

// encodeMinMax8 writes the same bytes as the original loop, and returns the
// same error, for nearest and stochastic rounding; decodeMinMax8 gives the
// same values as the original on those bodies and on random ones.
func TestMinMax8MatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	iters := 3000
	if testing.Short() {
		iters = 500
	}
	encoded, rejected, decoded := 0, 0, 0
	for iter := range iters {
		block := []int{64, 256, 72}[iter%3]
		n := r.IntN(4 * block)
		if iter%7 == 0 {
			n = block*r.IntN(3) + []int{1, 7, 8, 9, 63}[r.IntN(5)]
		}
		x := minMax8Inputs(r, n)
		bad := ""
		if n > 0 && iter%5 == 0 {
			// a NaN, an Inf or a magnitude beyond 2^126 somewhere
			v := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0x1.000002p126, -3e38}[r.IntN(5)]
			x[r.IntN(n)] = v
			bad = fmt.Sprint(v)
		}
		base := 8 * r.IntN(1000)
		for _, sr := range []bool{false, true} {
			key := rngKey(uint64(iter))
			got, want := make([]byte, bodyLen(MinMax8, n, block)), make([]byte, bodyLen(MinMax8, n, block))
			gerr := encodeMinMax8(got, x, block, base, key, sr)
			werr := encodeMinMax8Ref(want, x, block, base, key, sr)
			if fmt.Sprint(gerr) != fmt.Sprint(werr) {
				t.Fatalf("iter %d (bad %s): error %v, original %v", iter, bad, gerr, werr)
			}
			if werr != nil {
				rejected++
				continue
			}
			encoded++
			if string(got) != string(want) {
				t.Fatalf("iter %d n=%d block=%d sr=%v: bytes differ from the original", iter, n, block, sr)
			}
			checkMinMax8Decode(t, got, n, block, base)
		}
		// A random body with ordered finite (min, max) pairs.
		body := make([]byte, bodyLen(MinMax8, n, block))
		for i := range body {
			body[i] = byte(r.Uint32())
		}
		for b := 0; b < (n+block-1)/block; b++ {
			p := minMax8Inputs(r, 2)
			binary.LittleEndian.PutUint32(body[8*b:], math.Float32bits(min(p[0], p[1])))
			binary.LittleEndian.PutUint32(body[8*b+4:], math.Float32bits(max(p[0], p[1])))
		}
		if checkMinMax8Decode(t, body, n, block, base) {
			decoded++
		}
	}
	if encoded < iters || rejected < iters/20 || decoded < iters/2 {
		t.Errorf("weak coverage: %d encoded, %d rejected, %d random bodies decoded", encoded, rejected, decoded)
	}
}

// checkMinMax8Decode compares decodeMinMax8 with the original on body and
// reports whether the body was valid.
func checkMinMax8Decode(t *testing.T, body []byte, n, block, base int) bool {
	t.Helper()
	y, z := make([]float32, n), make([]float32, n)
	gerr := decodeMinMax8(y, body, block, base)
	werr := decodeMinMax8Ref(z, body, block, base)
	if fmt.Sprint(gerr) != fmt.Sprint(werr) {
		t.Fatalf("decode error %v, original %v", gerr, werr)
	}
	if werr != nil {
		return false
	}
	for i := range y {
		if math.Float32bits(y[i]) != math.Float32bits(z[i]) {
			t.Fatalf("n=%d block=%d: element %d decodes to %v, original %v", n, block, i, y[i], z[i])
		}
	}
	return true
}
