package compression

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

func gaussian(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func testConfig(c Codec, sr bool, level int) Config {
	cfg := DefaultConfig()
	cfg.Codec = c
	cfg.Stochastic = sr
	cfg.ZstdLevel = level
	return cfg
}

func roundTrip(t testing.TB, cfg Config, x []float32, seed uint64) ([]float32, []byte) {
	t.Helper()
	enc, err := NewEncoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()
	frame, err := enc.Append(nil, x, seed)
	if err != nil {
		t.Fatalf("encode %v: %v", cfg.Codec, err)
	}
	dec, err := NewDecoder(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	y, err := dec.DecodeBytes(frame, nil)
	if err != nil {
		t.Fatalf("decode %v: %v", cfg.Codec, err)
	}
	if len(y) != len(x) {
		t.Fatalf("decoded %d elements, want %d", len(y), len(x))
	}
	return y, frame
}

func relL2(x, y []float32) float64 {
	var num, den float64
	for i := range x {
		d := float64(y[i]) - float64(x[i])
		num += d * d
		den += float64(x[i]) * float64(x[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// elementBound returns the largest |decoded - x| a codec may produce for
// element i, given its whole block (blockwise codecs) or the value alone.
// The largest finite values of the 16-bit formats, where encoding saturates.
const (
	maxFP16 = 65504
	maxBF16 = 0x1.fep127
)

func elementBound(c Codec, sr bool, x []float32, i, block int) float64 {
	k := 0.5 // round to nearest: half a step
	if sr {
		k = 1 // stochastic: less than one step
	}
	v := math.Abs(float64(x[i]))
	lo := i / block * block
	xb := x[lo:min(lo+block, len(x))]
	var amax, mn, mx float64 = 0, math.Inf(1), math.Inf(-1)
	for _, u := range xb {
		amax = max(amax, math.Abs(float64(u)))
		mn = min(mn, float64(u))
		mx = max(mx, float64(u))
	}
	const slack = 1e-6
	switch c {
	case FP32:
		return 0
	case BF16:
		if v > maxBF16 { // saturates (documented policy)
			return v - maxBF16
		}
		return 2*k*v*0x1p-8 + 1e-38
	case FP16:
		if v > maxFP16 { // saturates (documented policy)
			return v - maxFP16
		}
		return 2*k*max(v*0x1p-11, 0x1p-25) + 1e-12
	case Int8:
		if amax < minScaleAbs { // flushed to zero
			return amax
		}
		return k*amax/127 + slack*amax
	case Int4:
		if amax < minScaleAbs {
			return amax
		}
		return k*amax/7 + slack*amax
	case Int2:
		if amax < minScaleAbs {
			return amax
		}
		return k*amax/1.5 + slack*amax
	case Sign: // ±scale, scale <= absmax
		return v + amax + slack*amax
	case MinMax8:
		if mx-mn < minScaleAbs { // decodes to min
			return mx - mn
		}
		return k*(mx-mn)/255 + slack*(mx-mn+math.Abs(mn))
	}
	return 0
}

// Relative L2 error bounds on N(0,1) data with the default block size (256).
var gaussianRelL2 = map[Codec]float64{
	FP32: 0, BF16: 0.003, FP16: 0.0004, Int8: 0.008, Int4: 0.14, MinMax8: 0.008, Int2: 0.6, Sign: 0.77, // Sign: sqrt(pi/2 - 1), its scale keeps the projection
}

func TestRoundTrip(t *testing.T) {
	sizes := []int{0, 1, 7, 64, 255, 256, 1000, 4097, 20000}
	for _, c := range Codecs() {
		for _, sr := range []bool{false, true} {
			for _, level := range []int{0, 1} {
				cfg := testConfig(c, sr, level)
				cfg.ChunkElems = 1024 // several chunks, last one partial
				for _, n := range sizes {
					x := gaussian(n, uint64(n))
					if n > 10 {
						x[3] *= 40 // an outlier
						x[n-1] = 0
					}
					y, _ := roundTrip(t, cfg, x, 7)
					for i := range x {
						if d := math.Abs(float64(y[i]) - float64(x[i])); d > elementBound(c, sr, x, i, cfg.BlockSize) {
							t.Fatalf("%v sr=%v n=%d: element %d = %v decoded %v, error %g > bound %g",
								c, sr, n, i, x[i], y[i], d, elementBound(c, sr, x, i, cfg.BlockSize))
						}
					}
				}
				x := gaussian(1<<16, 99)
				y, _ := roundTrip(t, cfg, x, 3)
				bound := gaussianRelL2[c]
				if sr {
					bound *= 1.5 // stochastic rounding has sqrt(2) the RMS error of nearest
					if c == Sign {
						bound = 3 // ±absmax: about sqrt(absmax^2 - x^2), absmax near 3 sigma
					}
				}
				if e := relL2(x, y); e > bound {
					t.Errorf("%v sr=%v zstd=%d: relative L2 error %.5f > %.5f", c, sr, level, e, bound)
				}
			}
		}
	}
}

func TestSpecialValues(t *testing.T) {
	x := make([]float32, 512)
	x[0], x[1], x[2] = 65504, -70000, 1e-7 // fp16 max, beyond fp16 range, fp16 subnormal
	x[3], x[4] = 1e37, -math.SmallestNonzeroFloat32
	x[300] = 1e-35 // a block that is all tiny values
	for _, c := range Codecs() {
		y, _ := roundTrip(t, testConfig(c, false, 0), x, 0)
		for i, v := range y {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%v: element %d decoded to %v", c, i, v)
			}
		}
		if c == FP16 && (y[0] != 65504 || y[1] != -65504) {
			t.Errorf("fp16 saturation: got %v %v", y[0], y[1])
		}
	}
	// A constant block for MinMax8 decodes exactly.
	for i := range x {
		x[i] = 3.25
	}
	y, _ := roundTrip(t, testConfig(MinMax8, true, 1), x, 0)
	for i, v := range y {
		if v != 3.25 {
			t.Fatalf("minmax8 constant block: element %d = %v", i, v)
		}
	}
}

func TestFP16Exhaustive(t *testing.T) {
	// Every finite binary16 value survives float32 -> fp16 -> float32, and
	// decodes to the value the format defines.
	for h := 0; h < 1<<16; h++ {
		if h&0x7c00 == 0x7c00 {
			continue // Inf and NaN: see TestFP16DecodeNonFinite
		}
		f := math.Float32frombits(f16Bits(uint16(h)))
		if float64(f) != f16Value(uint16(h)) || math.Signbit(float64(f)) != (h&0x8000 != 0) {
			t.Fatalf("%#04x decodes to %v, want %v", h, f, f16Value(uint16(h)))
		}
		if g := f16RNE(math.Float32bits(f)); g != uint16(h) {
			t.Fatalf("%#04x -> %v -> %#04x", h, f, g)
		}
	}
	// decodeFP16, whose groups of 8 normal values take a shorter path, agrees.
	var hs []uint16
	for h := 0; h < 1<<16; h++ {
		if h&0x7c00 != 0x7c00 {
			hs = append(hs, uint16(h))
		}
	}
	body := make([]byte, 2*len(hs))
	for i, h := range hs {
		binary.LittleEndian.PutUint16(body[2*i:], h)
	}
	y := make([]float32, len(hs))
	if err := decodeFP16(y, body, 0); err != nil {
		t.Fatal(err)
	}
	for i, h := range hs {
		if math.Float32bits(y[i]) != f16Bits(h) {
			t.Fatalf("decodeFP16: %#04x decodes to %v, want %v", h, y[i], f16Value(h))
		}
	}
}

// The decode of the first error feedback round equals a plain round trip.
func TestAppendMatchesEncode(t *testing.T) {
	x := gaussian(5000, 1)
	cfg := testConfig(Int8, true, 1)
	cfg.ChunkElems = 1024
	enc, _ := NewEncoder(cfg)
	var buf bytes.Buffer
	if err := enc.Encode(&buf, x, 5); err != nil {
		t.Fatal(err)
	}
	b, _ := enc.Append([]byte("prefix"), x, 5)
	if !bytes.Equal(b[6:], buf.Bytes()) {
		t.Fatal("Append and Encode differ")
	}
	// Streaming Writer, fed in odd pieces, gives the same bytes too.
	var sbuf bytes.Buffer
	sw, err := enc.NewWriter(&sbuf, int64(len(x)), 5)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(x); i += 333 {
		if _, err := sw.Write(x[i:min(i+333, len(x))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := sw.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(sbuf.Bytes(), buf.Bytes()) {
		t.Fatal("Writer and Encode differ")
	}
}
