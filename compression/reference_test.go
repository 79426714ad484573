package compression

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// Reference implementations: the scalar codec loops the package used before
// its hot loops were restructured, kept so that tests can require the new
// loops to write identical bytes and values.

// encodeMinMax8Ref is the original encodeMinMax8.
func encodeMinMax8Ref(body []byte, x []float32, block, base int, key uint64, sr bool) error {
	nb := (len(x) + block - 1) / block
	codes := body[8*nb : 8*nb+len(x)]
	for b := 0; b < nb; b++ {
		lo := b * block
		hi := min(lo+block, len(x))
		xb := x[lo:hi]
		if m := absmaxBits(xb); m > maxBlockBits {
			return cmp.Or(tooLarge(MinMax8, m, base+lo), nonFinite(xb, base+lo))
		}
		mn, mx := xb[0], xb[0]
		for _, v := range xb[1:] {
			mn = min(mn, v)
			mx = max(mx, v)
		}
		d := mx - mn
		if math.Float32bits(d)&absMask >= expMask {
			return fmt.Errorf("%w: block at element %d: range %v..%v overflows float32", ErrNonFinite, base+lo, mn, mx)
		}
		var inv float32
		if d >= minScaleAbs {
			inv = 255 / d
		}
		binary.LittleEndian.PutUint32(body[8*b:], math.Float32bits(mn))
		binary.LittleEndian.PutUint32(body[8*b+4:], math.Float32bits(mx))
		cb := codes[lo:hi]
		cb = cb[:len(xb)]
		if !sr {
			for i, v := range xb {
				cb[i] = byte(math.Float32bits(float32(float32(v-mn)*inv) + roundMagic))
			}
			continue
		}
		p := uint64(base+lo) / 2
		for i := 0; i < len(xb); i += 2 {
			h := pairBits(key, p)
			p++
			cb[i] = byte(min(int32(float32(float32(float32(xb[i]-mn)*inv)+unit24(uint32(h)))), 255))
			if i+1 < len(xb) {
				cb[i+1] = byte(min(int32(float32(float32(float32(xb[i+1]-mn)*inv)+unit24(uint32(h>>32)))), 255))
			}
		}
	}
	return nil
}

// decodeMinMax8Ref is the original decodeMinMax8.
func decodeMinMax8Ref(dst []float32, body []byte, block, base int) error {
	nb := (len(dst) + block - 1) / block
	codes := body[8*nb : 8*nb+len(dst)]
	for b := 0; b < nb; b++ {
		mn := math.Float32frombits(binary.LittleEndian.Uint32(body[8*b:]))
		mx := math.Float32frombits(binary.LittleEndian.Uint32(body[8*b+4:]))
		d := mx - mn
		if math.Float32bits(mn)&absMask >= expMask || math.Float32bits(mx)&absMask >= expMask ||
			!(d >= 0) || math.Float32bits(d) >= expMask {
			return fmt.Errorf("%w: block at element %d: min %v max %v", ErrCorrupt, base+b*block, mn, mx)
		}
		var step float32
		if d >= minScaleAbs {
			step = d / 255
		}
		lo := b * block
		hi := min(lo+block, len(dst))
		db := dst[lo:hi]
		cb := codes[lo:hi]
		cb = cb[:len(db)]
		for i, c := range cb {
			db[i] = mn + float32(float32(c)*step)
		}
	}
	return nil
}

// f32ToF16Ref is the original scalar float32 -> binary16 conversion.
func f32ToF16Ref(f float32, noise uint32, sr bool) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	u &= absMask
	var o uint32
	switch {
	case u >= (127+16)<<23: // >= 65536
		return sign | 0x7bff
	case u < 113<<23: // below 2^-14: binary16 subnormal or zero
		if sr {
			y := math.Float32frombits(u) * (1 << 24) // exact: units of 2^-24
			o = uint32(float32(y + unit24(noise)))   // floor; 1024 is the smallest normal
		} else {
			const denormMagic = ((127 - 15) + (23 - 10) + 1) << 23
			o = math.Float32bits(math.Float32frombits(u)+math.Float32frombits(denormMagic)) - denormMagic
		}
	default:
		if sr {
			u = u - (127-15)<<23 + noise&0x1fff
		} else {
			u = u - (127-15)<<23 + 0xfff + (u>>13)&1
		}
		o = u >> 13
	}
	if o >= 0x7c00 {
		o = 0x7bff
	}
	return sign | uint16(o)
}

// f16ToF32Ref is the original binary16 -> float32 conversion; ok is false for Inf and NaN.
func f16ToF32Ref(h uint16) (f float32, ok bool) {
	const shiftedExp = 0x7c00 << 13
	o := uint32(h&0x7fff) << 13
	exp := o & shiftedExp
	if exp == shiftedExp {
		return 0, false
	}
	o += (127 - 15) << 23
	if exp == 0 {
		o += 1 << 23
		o = math.Float32bits(math.Float32frombits(o) - math.Float32frombits(113<<23))
	}
	return math.Float32frombits(o | uint32(h&0x8000)<<16), true
}

// encodeFP16Ref is the original encodeFP16.
func encodeFP16Ref(body []byte, x []float32, base int, key uint64, sr bool) error {
	body = body[:2*len(x)]
	var h uint64
	for i, v := range x {
		if math.Float32bits(v)&expMask == expMask {
			return nonFinite(x[i:], base+i)
		}
		if sr {
			if i&1 == 0 {
				h = pairBits(key, uint64(base+i)/2)
			} else {
				h >>= 32
			}
		}
		binary.LittleEndian.PutUint16(body[2*i:], f32ToF16Ref(v, uint32(h), sr))
	}
	return nil
}

// decodeFP16Ref is the original decodeFP16.
func decodeFP16Ref(dst []float32, body []byte, base int) error {
	body = body[:2*len(dst)]
	for i := range dst {
		f, ok := f16ToF32Ref(binary.LittleEndian.Uint16(body[2*i:]))
		if !ok {
			return fmt.Errorf("%w: decoded element %d is Inf or NaN", ErrNonFinite, base+i)
		}
		dst[i] = f
	}
	return nil
}

// f16Value is the value of finite binary16 bits h, from the definition of
// the format: (-1)^s * m * 2^-24 for exponent 0, else (-1)^s * (1024+m) * 2^(e-25).
func f16Value(h uint16) float64 {
	e, m := int(h>>10&0x1f), float64(h&0x3ff)
	v := math.Ldexp(m, -24)
	if e != 0 {
		v = math.Ldexp(1024+m, e-25)
	}
	if h&0x8000 != 0 {
		v = -v
	}
	return v
}

// f16NearestRef is the binary16 nearest to f, ties to the even code, found by
// a search over the ordered finite codes; beyond 65504 it saturates. It
// shares no code or tricks with f16RNE. Differences below are exact in
// float64 (both operands have few significant bits and lie close together).
func f16NearestRef(f float32) uint16 {
	x := math.Abs(float64(f))
	var sign uint16
	if math.Signbit(float64(f)) {
		sign = 0x8000
	}
	if x >= 65504 {
		return sign | 0x7bff
	}
	k := sort.Search(0x7c00, func(h int) bool { return f16Value(uint16(h)) >= x })
	if k == 0 || f16Value(uint16(k)) == x {
		return sign | uint16(k)
	}
	down, up := x-f16Value(uint16(k-1)), f16Value(uint16(k))-x
	if down < up || down == up && (k-1)&1 == 0 {
		k--
	}
	return sign | uint16(k)
}

// The sign codec's deterministic bytes are those of the format's text, computed
// plainly: per block the float64 sums of x^2 and |x| in index order, their
// quotient as the scale (0 below 2^-100, with every bit set), then the
// signs, 1 for + (and +0).
// Blocks of 1024 and a short last one; a tiny block and a -0.
func TestSignMatchesReference(t *testing.T) {
	const block = 1024
	x := gaussian(5*block+200, 9)
	for i := block; i < 2*block; i++ {
		x[i] *= 1e-35 // scale below 2^-100: 0
	}
	x[7] = float32(math.Copysign(0, -1))
	body := make([]byte, bodyLen(Sign, len(x), block))
	if err := encodeSign(body, x, block, 0, 0, false); err != nil {
		t.Fatal(err)
	}
	nb := (len(x) + block - 1) / block
	want := make([]byte, len(body))
	bits := want[4*nb:]
	for b := range nb {
		xb := x[b*block : min((b+1)*block, len(x))]
		var sum, sq float64
		for _, v := range xb {
			sum += math.Abs(float64(v))
			sq += float64(v) * float64(v)
		}
		scale := float32(sq / sum)
		if scale < minScaleAbs {
			scale = 0
		}
		binary.LittleEndian.PutUint32(want[4*b:], math.Float32bits(scale))
		for i, v := range xb {
			if scale == 0 || !math.Signbit(float64(v)) {
				bits[(b*block+i)/8] |= 1 << ((b*block + i) % 8)
			}
		}
	}
	if !bytes.Equal(body, want) {
		t.Fatal("sign bytes differ from the reference")
	}
}

// Sign bodies decode as the format's text says, computed plainly: bit j
// of byte k is element 8k+j, 1 decoding to +scale and 0 to -scale (a zero
// scale to -0 for a 0 bit). Whole blocks go through signBlocksAVX2 where
// the CPU has it; a short last block, a last partial byte and blocks of 8
// take the Go loop's paths too.
func TestSignDecodeMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, tc := range []struct{ n, block int }{{8, 8}, {61, 8}, {1024, 256}, {5*256 + 77, 256}, {3*1024 + 1, 1024}, {100, 1024}} {
		nb := (tc.n + tc.block - 1) / tc.block
		body := make([]byte, 4*nb+(tc.n+7)/8)
		for i := range body[4*nb:] {
			body[4*nb+i] = byte(r.Uint32())
		}
		for b := range nb {
			scale := float32(r.ExpFloat64())
			if b == 1 {
				scale = 0
			}
			binary.LittleEndian.PutUint32(body[4*b:], math.Float32bits(scale))
		}
		got := make([]float32, tc.n)
		if err := decodeSign(got, body, tc.block, 0); err != nil {
			t.Fatal(err)
		}
		for i, v := range got {
			scale := math.Float32frombits(binary.LittleEndian.Uint32(body[4*(i/tc.block):]))
			want := -scale
			if body[4*nb+i/8]>>(i%8)&1 == 1 {
				want = scale
			}
			if math.Float32bits(v) != math.Float32bits(want) {
				t.Fatalf("n %d block %d element %d: %v, want %v", tc.n, tc.block, i, v, want)
			}
		}
	}
}
