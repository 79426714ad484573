package compression

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
)

// Blockwise codecs: Int8 and Int4 (absmax) and MinMax8 (min-max uint8).
//
// All arithmetic is float32 with explicit conversions after every product, so
// that no compiler may fuse a multiply and an add: the bytes and the decoded
// values are the same on every architecture.
//
// Round to nearest even uses the 1.5*2^23 trick: for |y| < 2^22, the float32
// sum y + roundMagic has the integer round(y) in its low mantissa bits, so its
// low 8 (or 4) bits are the two's complement code.

const (
	roundMagic = 12582912.0 // 1.5 * 2^23
	// minScaleAbs: blocks whose absmax (or max-min range) is below this are
	// sent as all-zero codes with scale 0, so 127/absmax never overflows.
	minScaleAbs = 0x1p-100
	absMask     = 0x7fffffff
	expMask     = 0x7f800000
	// maxBlockBits (2^126 as float32 bits) bounds the magnitudes blockwise
	// codecs accept, so that code*scale can never round up to Inf.
	maxBlockBits = 253 << 23
)

// absmaxBits returns the largest |x| as float32 bits; a value >= expMask means
// the block holds a NaN or an Inf.
func absmaxBits(x []float32) uint32 {
	var m0, m1, m2, m3 uint32
	for len(x) >= 4 {
		m0 = max(m0, math.Float32bits(x[0])&absMask)
		m1 = max(m1, math.Float32bits(x[1])&absMask)
		m2 = max(m2, math.Float32bits(x[2])&absMask)
		m3 = max(m3, math.Float32bits(x[3])&absMask)
		x = x[4:]
	}
	for _, v := range x {
		m0 = max(m0, math.Float32bits(v)&absMask)
	}
	return max(m0, m1, m2, m3)
}

// nonFinite returns the ErrNonFinite error for the first NaN/Inf in x, whose
// first element has tensor index base.
func nonFinite(x []float32, base int) error {
	for i, v := range x {
		if math.Float32bits(v)&expMask == expMask {
			return fmt.Errorf("%w: element %d is %v", ErrNonFinite, base+i, v)
		}
	}
	return fmt.Errorf("%w: near element %d", ErrNonFinite, base)
}

// tooLarge returns the error for a block whose absmax bits m exceed maxBlockBits.
func tooLarge(c Codec, m uint32, at int) error {
	if m >= expMask {
		return nil
	}
	return fmt.Errorf("%w: %v block at element %d has magnitude %v beyond 2^126", ErrNonFinite, c, at, math.Float32frombits(m))
}

// absmaxScale returns the scale stored for a block and the multiplier used to
// quantize it, for codes in [-qmax, qmax].
func absmaxScale(amax, qmax float32) (scale, inv float32) {
	if amax < minScaleAbs {
		return 0, 0
	}
	return amax / qmax, qmax / amax
}

// encodeInt8 writes nb float32 scales then len(x) int8 codes to body.
func encodeInt8(body []byte, x []float32, block, base int, key uint64, sr bool) error {
	nb := (len(x) + block - 1) / block
	codes := body[4*nb : 4*nb+len(x)]
	for b := 0; b < nb; b++ {
		lo := b * block
		hi := min(lo+block, len(x))
		xb := x[lo:hi]
		m := absmaxBits(xb)
		if m > maxBlockBits {
			return cmp.Or(tooLarge(Int8, m, base+lo), nonFinite(xb, base+lo))
		}
		scale, inv := absmaxScale(math.Float32frombits(m), 127)
		binary.LittleEndian.PutUint32(body[4*b:], math.Float32bits(scale))
		cb := codes[lo:hi]
		cb = cb[:len(xb)]
		if !sr {
			quantRNE8(cb, xb, inv)
			continue
		}
		p := uint64(base+lo) / 2
		for i := 0; i < len(xb); i += 2 {
			h := pairBits(key, p)
			p++
			cb[i] = byte(floorClamp(float32(xb[i]*inv), unit24(uint32(h)), 127))
			if i+1 < len(xb) {
				cb[i+1] = byte(floorClamp(float32(xb[i+1]*inv), unit24(uint32(h>>32)), 127))
			}
		}
	}
	return nil
}

// quantRNE8 sets dst[i] = round_half_even(x[i]*inv) as int8. |x[i]*inv| <= 127.00002.
func quantRNE8(dst []byte, x []float32, inv float32) {
	dst = dst[:len(x)]
	for len(x) >= 8 {
		d := (*[8]byte)(dst)
		s := (*[8]float32)(x)
		d[0] = byte(math.Float32bits(float32(s[0]*inv) + roundMagic))
		d[1] = byte(math.Float32bits(float32(s[1]*inv) + roundMagic))
		d[2] = byte(math.Float32bits(float32(s[2]*inv) + roundMagic))
		d[3] = byte(math.Float32bits(float32(s[3]*inv) + roundMagic))
		d[4] = byte(math.Float32bits(float32(s[4]*inv) + roundMagic))
		d[5] = byte(math.Float32bits(float32(s[5]*inv) + roundMagic))
		d[6] = byte(math.Float32bits(float32(s[6]*inv) + roundMagic))
		d[7] = byte(math.Float32bits(float32(s[7]*inv) + roundMagic))
		x, dst = x[8:], dst[8:]
	}
	for i, v := range x {
		dst[i] = byte(math.Float32bits(float32(v*inv) + roundMagic))
	}
}

// floorClamp returns floor(y+u) clamped to [-q, q], for |y| <= q+1 and u in [0, 1).
// The sum is computed in float32, then shifted by 256 so that truncation is floor.
func floorClamp(y, u float32, q int32) int32 {
	r := int32(float32(float32(y+u)+256)) - 256
	return min(max(r, -q), q)
}

func decodeInt8(dst []float32, body []byte, block, base int) error {
	nb := (len(dst) + block - 1) / block
	codes := body[4*nb : 4*nb+len(dst)]
	for b := 0; b < nb; b++ {
		scale := math.Float32frombits(binary.LittleEndian.Uint32(body[4*b:]))
		if err := checkScale(scale, 127, base+b*block); err != nil {
			return err
		}
		lo := b * block
		hi := min(lo+block, len(dst))
		dequant8(dst[lo:hi], codes[lo:hi], scale)
	}
	return nil
}

// checkScale accepts scales in [0, MaxFloat32/(qmax+1)], so that any code
// times the scale is finite.
func checkScale(scale float32, qmax float64, at int) error {
	if !(scale >= 0) || float64(scale)*(qmax+1) > math.MaxFloat32 {
		return fmt.Errorf("%w: scale %v of block at element %d not in [0, MaxFloat32/%g]", ErrCorrupt, scale, at, qmax+1)
	}
	return nil
}

func dequant8(dst []float32, codes []byte, scale float32) {
	codes = codes[:len(dst)]
	for len(dst) >= 8 {
		d := (*[8]float32)(dst)
		c := (*[8]byte)(codes)
		d[0] = float32(int8(c[0])) * scale
		d[1] = float32(int8(c[1])) * scale
		d[2] = float32(int8(c[2])) * scale
		d[3] = float32(int8(c[3])) * scale
		d[4] = float32(int8(c[4])) * scale
		d[5] = float32(int8(c[5])) * scale
		d[6] = float32(int8(c[6])) * scale
		d[7] = float32(int8(c[7])) * scale
		dst, codes = dst[8:], codes[8:]
	}
	for i, c := range codes {
		dst[i] = float32(int8(c)) * scale
	}
}

// encodeInt4 writes nb float32 scales then ceil(len(x)/2) bytes of codes:
// element 2k in the low nibble of byte k, element 2k+1 in the high nibble,
// each a 4-bit two's complement value in [-7, 7]. An odd final high nibble is 0.
func encodeInt4(body []byte, x []float32, block, base int, key uint64, sr bool) error {
	nb := (len(x) + block - 1) / block
	codes := body[4*nb : 4*nb+(len(x)+1)/2]
	for b := 0; b < nb; b++ {
		lo := b * block
		hi := min(lo+block, len(x))
		xb := x[lo:hi]
		m := absmaxBits(xb)
		if m > maxBlockBits {
			return cmp.Or(tooLarge(Int4, m, base+lo), nonFinite(xb, base+lo))
		}
		scale, inv := absmaxScale(math.Float32frombits(m), 7)
		binary.LittleEndian.PutUint32(body[4*b:], math.Float32bits(scale))
		cb := codes[lo/2 : (hi+1)/2]
		if !sr {
			n := len(xb) &^ 1
			cb := cb[:n/2]
			for i := range cb {
				l := math.Float32bits(float32(xb[2*i]*inv)+roundMagic) & 0xf
				h := math.Float32bits(float32(xb[2*i+1]*inv)+roundMagic) & 0xf
				cb[i] = byte(l | h<<4)
			}
			if n < len(xb) {
				codes[len(codes)-1] = byte(math.Float32bits(float32(xb[n]*inv)+roundMagic) & 0xf)
			}
			continue
		}
		p := uint64(base+lo) / 2
		for i := 0; i < len(xb); i += 2 {
			h := pairBits(key, p)
			p++
			l := floorClamp(float32(xb[i]*inv), unit24(uint32(h)), 7) & 0xf
			var hn int32
			if i+1 < len(xb) {
				hn = floorClamp(float32(xb[i+1]*inv), unit24(uint32(h>>32)), 7) & 0xf
			}
			cb[i/2] = byte(l | hn<<4)
		}
	}
	return nil
}

// int4Pairs[b] holds the two signed nibbles of byte b as float32.
var int4Pairs = func() (t [256][2]float32) {
	for b := range t {
		t[b][0] = float32(int8(byte(b)<<4) >> 4)
		t[b][1] = float32(int8(byte(b)) >> 4)
	}
	return t
}()

func decodeInt4(dst []float32, body []byte, block, base int) error {
	nb := (len(dst) + block - 1) / block
	codes := body[4*nb : 4*nb+(len(dst)+1)/2]
	for b := 0; b < nb; b++ {
		scale := math.Float32frombits(binary.LittleEndian.Uint32(body[4*b:]))
		if err := checkScale(scale, 7, base+b*block); err != nil {
			return err
		}
		lo := b * block
		hi := min(lo+block, len(dst))
		d := dst[lo:hi]
		n := len(d) &^ 1
		cb := codes[lo/2 : lo/2+n/2]
		for i, c := range cb {
			pr := &int4Pairs[c]
			d[2*i] = pr[0] * scale
			d[2*i+1] = pr[1] * scale
		}
		if n < len(d) {
			d[n] = int4Pairs[codes[(lo+n)/2]][0] * scale
		}
	}
	return nil
}

// encodeMinMax8 writes nb (min, max) float32 pairs then len(x) uint8 codes,
// q = round_half_even((x-min) * (255/(max-min))) or, stochastic,
// min(floor((x-min) * (255/(max-min)) + u), 255). A block with
// max-min < 2^-100 (including max == min) gets codes 0 and decodes to min.
//
// min and max are those of the builtins (-0 below +0), found on the float32
// bits by minMaxBits; one pass over the block finds them and rejects NaN, Inf
// and magnitudes beyond 2^126, a second one quantizes.
func encodeMinMax8(body []byte, x []float32, block, base int, key uint64, sr bool) error {
	nb := (len(x) + block - 1) / block
	codes := body[8*nb : 8*nb+len(x)]
	for b := 0; b < nb; b++ {
		lo := b * block
		hi := min(lo+block, len(x))
		xb := x[lo:hi]
		bmn, bmx := minMaxBits(xb)
		if max(bmn&absMask, bmx&absMask) > maxBlockBits {
			m := absmaxBits(xb)
			return cmp.Or(tooLarge(MinMax8, m, base+lo), nonFinite(xb, base+lo))
		}
		mn, mx := math.Float32frombits(bmn), math.Float32frombits(bmx)
		d := mx - mn
		if math.Float32bits(d)&absMask >= expMask {
			return fmt.Errorf("%w: block at element %d: range %v..%v overflows float32", ErrNonFinite, base+lo, mn, mx)
		}
		var inv float32
		if d >= minScaleAbs {
			inv = 255 / d
		}
		binary.LittleEndian.PutUint32(body[8*b:], bmn)
		binary.LittleEndian.PutUint32(body[8*b+4:], bmx)
		cb := codes[lo:hi]
		if !sr {
			quantMinMax8(cb, xb, mn, inv)
		} else {
			quantMinMax8SR(cb, xb, mn, inv, key, uint64(base+lo)/2)
		}
	}
	return nil
}

// minMaxBits returns the float32 bits of the smallest and the largest of x
// (len(x) > 0), ordered as the builtin min and max order floats: -0 < +0.
// It works on the bits: read as int32, non-negative floats order as their
// values and lie above all negative ones, and read as uint32 the negative
// floats order by magnitude above all non-negative ones. So the largest float
// is the largest int32 if that is >= 0, else the smallest uint32 (the
// negative closest to zero); the smallest float is the largest uint32 if it
// is negative, else the smallest uint32. A NaN or ±Inf in x makes one of the
// results NaN or ±Inf, so callers catch them by checking the magnitudes.
func minMaxBits(x []float32) (mn, mx uint32) {
	u := math.Float32bits(x[0])
	s0, s1 := int32(u), int32(u)
	lo0, lo1, hi0, hi1 := u, u, u, u
	for len(x) >= 8 {
		p := (*[8]float32)(x)
		a, b := math.Float32bits(p[0]), math.Float32bits(p[1])
		s0, lo0, hi0 = max(s0, int32(a)), min(lo0, a), max(hi0, a)
		s1, lo1, hi1 = max(s1, int32(b)), min(lo1, b), max(hi1, b)
		a, b = math.Float32bits(p[2]), math.Float32bits(p[3])
		s0, lo0, hi0 = max(s0, int32(a)), min(lo0, a), max(hi0, a)
		s1, lo1, hi1 = max(s1, int32(b)), min(lo1, b), max(hi1, b)
		a, b = math.Float32bits(p[4]), math.Float32bits(p[5])
		s0, lo0, hi0 = max(s0, int32(a)), min(lo0, a), max(hi0, a)
		s1, lo1, hi1 = max(s1, int32(b)), min(lo1, b), max(hi1, b)
		a, b = math.Float32bits(p[6]), math.Float32bits(p[7])
		s0, lo0, hi0 = max(s0, int32(a)), min(lo0, a), max(hi0, a)
		s1, lo1, hi1 = max(s1, int32(b)), min(lo1, b), max(hi1, b)
		x = x[8:]
	}
	for _, v := range x {
		a := math.Float32bits(v)
		s0, lo0, hi0 = max(s0, int32(a)), min(lo0, a), max(hi0, a)
	}
	s, lo, hi := max(s0, s1), min(lo0, lo1), max(hi0, hi1)
	mn, mx = lo, lo
	if s >= 0 {
		mx = uint32(s)
	}
	if hi&0x80000000 != 0 {
		mn = hi
	}
	return mn, mx
}

// quantMinMax8 sets dst[i] = round_half_even((x[i]-mn)*inv), for
// 0 <= (x[i]-mn)*inv < 255.5 (at most 255*(1+2^-24)^2 as computed).
func quantMinMax8(dst []byte, x []float32, mn, inv float32) {
	dst = dst[:len(x)]
	for len(x) >= 8 {
		d := (*[8]byte)(dst)
		s := (*[8]float32)(x)
		d[0] = byte(math.Float32bits(float32(float32(s[0]-mn)*inv) + roundMagic))
		d[1] = byte(math.Float32bits(float32(float32(s[1]-mn)*inv) + roundMagic))
		d[2] = byte(math.Float32bits(float32(float32(s[2]-mn)*inv) + roundMagic))
		d[3] = byte(math.Float32bits(float32(float32(s[3]-mn)*inv) + roundMagic))
		d[4] = byte(math.Float32bits(float32(float32(s[4]-mn)*inv) + roundMagic))
		d[5] = byte(math.Float32bits(float32(float32(s[5]-mn)*inv) + roundMagic))
		d[6] = byte(math.Float32bits(float32(float32(s[6]-mn)*inv) + roundMagic))
		d[7] = byte(math.Float32bits(float32(float32(s[7]-mn)*inv) + roundMagic))
		x, dst = x[8:], dst[8:]
	}
	for i, v := range x {
		dst[i] = byte(math.Float32bits(float32(float32(v-mn)*inv) + roundMagic))
	}
}

// quantMinMax8SR sets dst[i] = min(floor((x[i]-mn)*inv + u_i), 255) with u_i
// from pair p+i/2 (x[0] is an even tensor element).
func quantMinMax8SR(dst []byte, x []float32, mn, inv float32, key, p uint64) {
	dst = dst[:len(x)]
	q := func(v float32, w uint32) byte {
		return byte(min(int32(float32(float32(float32(v-mn)*inv)+unit24(w))), 255))
	}
	for len(x) >= 2 {
		h := pairBits(key, p)
		p++
		d := (*[2]byte)(dst)
		s := (*[2]float32)(x)
		d[0] = q(s[0], uint32(h))
		d[1] = q(s[1], uint32(h>>32))
		x, dst = x[2:], dst[2:]
	}
	if len(x) == 1 {
		dst[0] = q(x[0], uint32(pairBits(key, p)))
	}
}

// decodeMinMax8 sets x = min + q*step with step = (max-min)/255 in float32;
// x = min when max-min < 2^-100.
func decodeMinMax8(dst []float32, body []byte, block, base int) error {
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
		dequantMinMax8(dst[lo:hi], codes[lo:hi], mn, step)
	}
	return nil
}

// dequantMinMax8 sets dst[i] = mn + codes[i]*step, rounding the product first.
func dequantMinMax8(dst []float32, codes []byte, mn, step float32) {
	codes = codes[:len(dst)]
	for len(dst) >= 8 {
		d := (*[8]float32)(dst)
		c := (*[8]byte)(codes)
		d[0] = mn + float32(float32(c[0])*step)
		d[1] = mn + float32(float32(c[1])*step)
		d[2] = mn + float32(float32(c[2])*step)
		d[3] = mn + float32(float32(c[3])*step)
		d[4] = mn + float32(float32(c[4])*step)
		d[5] = mn + float32(float32(c[5])*step)
		d[6] = mn + float32(float32(c[6])*step)
		d[7] = mn + float32(float32(c[7])*step)
		dst, codes = dst[8:], codes[8:]
	}
	for i, c := range codes {
		dst[i] = mn + float32(float32(c)*step)
	}
}
