package compression

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// float16Inputs returns float32 bit patterns that exercise every rounding
// case of the binary16 conversion, positive and negative: each finite
// binary16 value, the exact midpoint between each pair of neighbours (a tie)
// and the float32 values on either side of it and of each value, the
// saturation threshold, zeros, float32 subnormals, the largest float32, and
// n random patterns (half uniform over all finite float32, half in and around
// the binary16 range, where the rounding happens).
func float16Inputs(n int, seed uint64) []uint32 {
	var out []uint32
	add := func(f float64) {
		v := float32(f)
		if float64(v) != f {
			panic(fmt.Sprintf("%v is not a float32", f))
		}
		u := math.Float32bits(v)
		for _, w := range []uint32{u, u + 1, u - 1} {
			if w&expMask != expMask {
				out = append(out, w, w^0x80000000)
			}
		}
	}
	for h := uint16(1); h <= 0x7bff; h++ {
		add(f16Value(h))
		add((f16Value(h-1) + f16Value(h)) / 2)
	}
	add(65512) // above 65504, below the tie: rounds to 65504
	add(65520) // the tie between 65504 and 65536: to even is 65536, so saturates
	add(65536)
	add(0x1p-24) // the smallest binary16
	add(0x1p-25) // the tie between 0 and 2^-24: to even is 0
	add(3 * 0x1p-26)
	add(0x1p-14) // the smallest normal binary16
	add(math.MaxFloat32)
	add(math.SmallestNonzeroFloat32)
	add(0x1p-126) // the smallest normal float32
	out = append(out, 0, 0x80000000, 1, 0x80000001, 0x007fffff, 0x807fffff, 0x7f7fffff, 0xff7fffff)
	r := rand.New(rand.NewPCG(seed, 2))
	for ; n > 0; n-- {
		u := r.Uint32()
		if n%2 == 1 {
			// exponents 98..145: from below 2^-25 to beyond 65504, random
			// mantissa and sign
			u = u&0x807fffff | (98+r.Uint32N(48))<<23
		}
		if u&expMask != expMask {
			out = append(out, u)
		}
	}
	return out
}

// The fast conversion agrees with an independent nearest-even reference and
// with the original scalar code, for nearest and stochastic rounding.
func TestFloat16AgainstReference(t *testing.T) {
	n := 1 << 20
	if testing.Short() {
		n = 1 << 16
	}
	r := rand.New(rand.NewPCG(7, 7))
	for _, u := range float16Inputs(n, 1) {
		f := math.Float32frombits(u)
		want := f16NearestRef(f)
		if got := f16RNE(u); got != want {
			t.Fatalf("f16RNE(%#08x = %v) = %#04x (%v), want %#04x (%v)", u, f, got, f16Value(got), want, f16Value(want))
		}
		if a := u & absMask; a >= f16MinExp {
			if got := f16Normal(u, a); got != want {
				t.Fatalf("f16Normal(%#08x = %v) = %#04x, want %#04x", u, f, got, want)
			}
		}
		if old := f32ToF16Ref(f, 0, false); old != want {
			t.Fatalf("original conversion of %#08x = %v gives %#04x, reference %#04x", u, f, old, want)
		}
		// Stochastic: the same bits as the original code, and one of the two
		// binary16 values around f.
		for range 2 {
			w := r.Uint32()
			got := f16SR(u, w)
			if old := f32ToF16Ref(f, w, true); got != old {
				t.Fatalf("f16SR(%#08x = %v, %#08x) = %#04x, original %#04x", u, f, w, got, old)
			}
			if !brackets(got, f) {
				t.Fatalf("f16SR(%#08x = %v, %#08x) = %#04x (%v) is not next to it", u, f, w, got, f16Value(got))
			}
		}
	}
	// Noise at the extremes: 0 rounds down, all ones rounds up.
	for _, c := range []struct {
		f    float32
		w    uint32
		want uint16
	}{
		{1 + 0x1p-11, 0, 0x3c00}, {1 + 0x1p-11, math.MaxUint32, 0x3c01},
		{0x1p-25, 0, 0}, {0x1p-25, math.MaxUint32, 1},
		{-0x1p-25, math.MaxUint32, 0x8001},
		{65504 + 16, math.MaxUint32, 0x7bff}, {1e30, math.MaxUint32, 0x7bff}, {-1e30, 0, 0xfbff},
	} {
		if got := f16SR(math.Float32bits(c.f), c.w); got != c.want {
			t.Errorf("f16SR(%v, %#x) = %#04x, want %#04x", c.f, c.w, got, c.want)
		}
	}
}

// brackets reports whether binary16 h has the sign of f and is |f| or one of
// the two binary16 magnitudes next to it (65504 for |f| beyond it).
func brackets(h uint16, f float32) bool {
	x, mag := math.Abs(float64(f)), h&0x7fff
	if (h&0x8000 != 0) != math.Signbit(float64(f)) || mag > 0x7bff {
		return false
	}
	if x > 65504 {
		return mag == 0x7bff
	}
	v := f16Value(mag)
	return v == x || v > x && (mag == 0 || f16Value(mag-1) < x) || v < x && f16Value(mag+1) > x
}

// With SKEIN_FP16_EXHAUSTIVE=1, every finite float32 bit pattern converts as
// the original scalar code did, by f16RNE, by f16Normal where encodeFP16 may
// use it, and by f16SR with one noise word per input (about 4.3e9 cases,
// some 20 s on 2 cores).
func TestFloat16AllFloat32(t *testing.T) {
	if os.Getenv("SKEIN_FP16_EXHAUSTIVE") == "" {
		t.Skip("set SKEIN_FP16_EXHAUSTIVE=1 to compare all 2^32 float32 inputs with the original conversion")
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad []string
	nw := runtime.GOMAXPROCS(0)
	for w := range nw {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for hi := uint32(w); hi < 1<<16; hi += uint32(nw) {
				for lo := uint32(0); lo < 1<<16; lo++ {
					u := hi<<16 | lo
					if u&expMask == expMask {
						continue
					}
					f := math.Float32frombits(u)
					want := f32ToF16Ref(f, 0, false)
					a := u & absMask
					if f16RNE(u) != want || a >= f16MinExp && f16Normal(u, a) != want ||
						f16SR(u, u*0x9E3779B9) != f32ToF16Ref(f, u*0x9E3779B9, true) {
						mu.Lock()
						bad = append(bad, fmt.Sprintf("%#08x", u))
						mu.Unlock()
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("conversions differ from the original at %v", bad)
	}
}

// encodeFP16 and decodeFP16 write the same bytes and values as the original
// loops, for lengths around the 8-element unrolling and odd pair offsets.
func TestFP16MatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	pool := float16Inputs(0, 3)
	for _, n := range []int{0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 100, 1001, 5000} {
		for _, base := range []int{0, 8, 1 << 20} {
			for _, sr := range []bool{false, true} {
				// Runs of one kind of value, so that encodeFP16 switches
				// between its paths for groups of 8 at various places.
				x := make([]float32, n)
				kind := 0
				for i := range x {
					if r.IntN(12) == 0 {
						kind = r.IntN(5)
					}
					switch kind {
					case 0:
						x[i] = math.Float32frombits(pool[r.IntN(len(pool))])
					case 1:
						x[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(12)-8)))
					case 2:
						x[i] = float32(r.NormFloat64() * 1e-6) // binary16 subnormals
					case 3:
						x[i] = float32(r.NormFloat64() * 5e4) // some saturate
					default:
						x[i] = float32(r.NormFloat64())
					}
				}
				key := rngKey(uint64(n))
				got, want := make([]byte, 2*n), make([]byte, 2*n)
				if err := encodeFP16(got, x, base, key, sr); err != nil {
					t.Fatal(err)
				}
				if err := encodeFP16Ref(want, x, base, key, sr); err != nil {
					t.Fatal(err)
				}
				if string(got) != string(want) {
					t.Fatalf("n=%d base=%d sr=%v: bytes differ from the original", n, base, sr)
				}
				// Random bodies, without Inf and NaN, decode to the same values.
				for i := range n {
					h := uint16(r.Uint32())
					if h&0x7c00 == 0x7c00 {
						h &^= 0x4000
					}
					binary.LittleEndian.PutUint16(got[2*i:], h)
				}
				y, z := make([]float32, n), make([]float32, n)
				if err := decodeFP16(y, got, base); err != nil {
					t.Fatal(err)
				}
				if err := decodeFP16Ref(z, got, base); err != nil {
					t.Fatal(err)
				}
				for i := range y {
					if math.Float32bits(y[i]) != math.Float32bits(z[i]) {
						t.Fatalf("n=%d: element %d (%#04x) decodes to %v, original %v", n, i, binary.LittleEndian.Uint16(got[2*i:]), y[i], z[i])
					}
				}
			}
		}
	}
}

// A NaN or Inf anywhere, inside the unrolled loop or in the tail, is reported
// at its element, and the first one is named.
func TestFP16NonFinite(t *testing.T) {
	bads := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0xff800001)}
	for _, sr := range []bool{false, true} {
		for _, n := range []int{1, 8, 13, 40, 41} {
			for at := range n {
				for j, bad := range bads {
					x := gaussian(n, 1)
					if j%2 == 1 {
						for i := range min(n, 8) {
							x[i] *= 1e-6 // a first group with tiny values
						}
					}
					x[at] = bad
					if at+3 < n {
						x[at+3] = float32(math.NaN())
					}
					err := encodeFP16(make([]byte, 2*n), x, 64, 1, sr)
					want := fmt.Sprintf("element %d is", 64+at)
					if !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), want) {
						t.Fatalf("sr=%v n=%d: %v at %d gives %v, want %q", sr, n, bad, at, err, want)
					}
				}
			}
		}
	}
}

func TestFP16DecodeNonFinite(t *testing.T) {
	for _, n := range []int{1, 8, 13, 40} {
		for at := range n {
			for _, h := range []uint16{0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xffff} {
				body := make([]byte, 2*n)
				for i := range n {
					binary.LittleEndian.PutUint16(body[2*i:], uint16(0x3c00+i))
				}
				binary.LittleEndian.PutUint16(body[2*at:], h)
				if at+2 < n {
					binary.LittleEndian.PutUint16(body[2*(at+2):], 0x7c00)
				}
				err := decodeFP16(make([]float32, n), body, 64)
				want := fmt.Sprintf("element %d is Inf or NaN", 64+at)
				if !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), want) {
					t.Fatalf("n=%d: %#04x at %d gives %v, want %q", n, h, at, err, want)
				}
			}
		}
	}
}
