package compression

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Float codecs: FP32 (passthrough), BF16 and FP16. Values are little-endian.
// Finite inputs beyond a format's range saturate to its largest finite value
// (bf16 ±3.3895e38, fp16 ±65504) instead of becoming Inf.

func encodeFP32(body []byte, x []float32, base int) error {
	body = body[:4*len(x)]
	for i, v := range x {
		u := math.Float32bits(v)
		if u&expMask == expMask {
			return nonFinite(x[i:], base+i)
		}
		binary.LittleEndian.PutUint32(body[4*i:], u)
	}
	return nil
}

func decodeFP32(dst []float32, body []byte, base int) error {
	body = body[:4*len(dst)]
	for i := range dst {
		u := binary.LittleEndian.Uint32(body[4*i:])
		if u&expMask == expMask {
			return fmt.Errorf("%w: decoded element %d is %v", ErrNonFinite, base+i, math.Float32frombits(u))
		}
		dst[i] = math.Float32frombits(u)
	}
	return nil
}

// encodeBF16 rounds to nearest even, or stochastically by adding 16 random
// bits below the kept ones and truncating.
func encodeBF16(body []byte, x []float32, base int, key uint64, sr bool) error {
	body = body[:2*len(x)]
	var h uint64
	for i, v := range x {
		u := math.Float32bits(v)
		if u&expMask == expMask {
			return nonFinite(x[i:], base+i)
		}
		var r uint32
		if sr {
			if i&1 == 0 {
				h = pairBits(key, uint64(base+i)/2)
			} else {
				h >>= 32
			}
			r = u + uint32(h)&0xffff
		} else {
			r = u + 0x7fff + (u>>16)&1
		}
		if r&expMask == expMask || (r^u)&0x80000000 != 0 {
			r = u&0x80000000 | 0x7f7f0000 // saturate
		}
		binary.LittleEndian.PutUint16(body[2*i:], uint16(r>>16))
	}
	return nil
}

func decodeBF16(dst []float32, body []byte, base int) error {
	body = body[:2*len(dst)]
	for i := range dst {
		u := uint32(binary.LittleEndian.Uint16(body[2*i:])) << 16
		if u&expMask == expMask {
			return fmt.Errorf("%w: decoded element %d is %v", ErrNonFinite, base+i, math.Float32frombits(u))
		}
		dst[i] = math.Float32frombits(u)
	}
	return nil
}

// Float16 conversion, after F. Giesen's float_to_half_fast3_rtne and
// half_to_float_fast3. f16RNE, f16SR and f16Bits have no branches: they
// compute both the normal and the subnormal result and select one (a
// conditional move), so their speed does not depend on how many values are
// tiny. encodeFP16 and decodeFP16 take a shorter path for groups of 8
// values with no zero (decode), subnormal, Inf or NaN among them.

const (
	f16Rebias   = (127 - 15) << 23 // float32 minus binary16 exponent bias, in place
	f16MinExp   = 113 << 23        // 2^-14, the smallest normal binary16, as float32 bits
	f16MaxBits  = 0x7bff           // 65504
	denormMagic = ((127 - 15) + (23 - 10) + 1) << 23
)

// f16RNE converts the float32 bits u of a finite value to binary16 with round
// to nearest even. Magnitudes that round beyond 65504 saturate to it.
func f16RNE(u uint32) uint16 {
	a := u & absMask
	// Normal: rebias the exponent and round away the low 13 mantissa bits,
	// ties to even; a carry into the exponent is the right result, and
	// anything at or beyond 0x7c00 (Inf) saturates. Wraps for a < f16Rebias,
	// where the subnormal result is taken instead.
	n := min((a-f16Rebias+0xfff+(a>>13)&1)>>13, f16MaxBits)
	// Subnormal (|x| < 2^-14): adding 0.5 rounds x to a multiple of 2^-24
	// (the ulp of 0.5) in hardware, leaving the multiple in the low bits.
	s := math.Float32bits(math.Float32frombits(a)+math.Float32frombits(denormMagic)) - denormMagic
	if a < f16MinExp {
		n = s
	}
	return uint16(u>>16&0x8000 | n)
}

// f16SR converts the float32 bits u of a finite value to binary16 with
// stochastic rounding by the random word noise: its low 13 bits are added
// below the kept mantissa bits of a normal result, its top 24 bits (as u in
// [0, 1)) to a subnormal one in units of 2^-24; then the result is
// truncated. Results beyond 65504 saturate.
func f16SR(u, noise uint32) uint16 {
	a := u & absMask
	n := min((a-f16Rebias+noise&0x1fff)>>13, f16MaxBits)
	// Exact: units of 2^-24; the conversion truncates, i.e. floors, and 1024
	// (2^-14) is the smallest normal's bits. For normal a the product may be
	// huge, and the conversion's result is then discarded.
	s := uint32(float32(float32(math.Float32frombits(a)*(1<<24)) + unit24(noise)))
	if a < f16MinExp {
		n = s
	}
	return uint16(u>>16&0x8000 | n)
}

// f16Bits converts binary16 bits h to float32 bits. Inf and NaN (exponent
// 31) give garbage; callers check for them on h.
func f16Bits(h uint16) uint32 {
	o := uint32(h&0x7fff) << 13
	n := o + f16Rebias
	// Subnormal (exponent 0): o is the mantissa; o + 2^-14's bits is the
	// normal float32 2^-14 * (1 + m/1024), and subtracting 2^-14 leaves
	// m * 2^-24 exactly.
	s := math.Float32bits(math.Float32frombits(o+f16MinExp) - math.Float32frombits(f16MinExp))
	if o < 0x400<<13 {
		n = s
	}
	return n | uint32(h&0x8000)<<16
}

// f16Normal is f16RNE for the float32 bits u, of magnitude bits a, of a
// finite value with |x| >= 2^-14, which needs no subnormal handling.
func f16Normal(u, a uint32) uint16 {
	return uint16(u>>16&0x8000 | min((a-f16Rebias+0xfff+(u>>13)&1)>>13, f16MaxBits))
}

// encodeFP16 converts groups of 8 elements. With nearest rounding a group is
// first converted by f16Normal alone while or-ing together a - 2^-14 over
// its magnitude bits a. Each term wraps to at least 0xc7800000 for a tiny
// value, is at least 0x47000000 for Inf and NaN, and is below 0x40000000 for
// 2^-14 <= |x| < 2^114, so the or reaches 0x47000000 whenever the group holds
// a value f16Normal does not handle (and, harmlessly, maybe for |x| >= 2^114).
// Such a group is converted again by f16RNE, and so are later groups until
// one holds no tiny or non-finite value: data with many tiny values costs
// little more than f16RNE alone. (Or-ing rather than taking the maximum keeps
// the compiler from deferring compares and spilling registers.) A NaN or Inf
// is reported after the loop (body then holds garbage the caller discards)
// by nonFinite, which finds the first one.
func encodeFP16(body []byte, x []float32, base int, key uint64, sr bool) error {
	body = body[:2*len(x)]
	// bad gets bit 31 set by a magnitude >= expMask (Inf or NaN).
	var bad uint32
	xs, bs := x, body
	if !sr {
		const limit = expMask - f16MinExp
		fast := true
		for len(xs) >= 8 {
			s := (*[8]float32)(xs)
			d := (*[16]byte)(bs)
			if fast {
				var w uint32
				u := math.Float32bits(s[0])
				a := u & absMask
				w |= a - f16MinExp
				binary.LittleEndian.PutUint16(d[0:], f16Normal(u, a))
				u = math.Float32bits(s[1])
				a = u & absMask
				w |= a - f16MinExp
				binary.LittleEndian.PutUint16(d[2:], f16Normal(u, a))
				u = math.Float32bits(s[2])
				a = u & absMask
				w |= a - f16MinExp
				binary.LittleEndian.PutUint16(d[4:], f16Normal(u, a))
				u = math.Float32bits(s[3])
				a = u & absMask
				w |= a - f16MinExp
				binary.LittleEndian.PutUint16(d[6:], f16Normal(u, a))
				u = math.Float32bits(s[4])
				a = u & absMask
				w |= a - f16MinExp
				binary.LittleEndian.PutUint16(d[8:], f16Normal(u, a))
				u = math.Float32bits(s[5])
				a = u & absMask
				w |= a - f16MinExp
				binary.LittleEndian.PutUint16(d[10:], f16Normal(u, a))
				u = math.Float32bits(s[6])
				a = u & absMask
				w |= a - f16MinExp
				binary.LittleEndian.PutUint16(d[12:], f16Normal(u, a))
				u = math.Float32bits(s[7])
				a = u & absMask
				w |= a - f16MinExp
				binary.LittleEndian.PutUint16(d[14:], f16Normal(u, a))
				fast = w < limit
			}
			if !fast {
				var w uint32 // as above, and bad collects Inf and NaN
				for k, v := range s {
					u := math.Float32bits(v)
					a := u & absMask
					w |= a - f16MinExp
					bad |= a + 0x800000
					binary.LittleEndian.PutUint16(d[2*k:], f16RNE(u))
				}
				fast = w < limit
			}
			xs, bs = xs[8:], bs[16:]
		}
		for i, v := range xs {
			u := math.Float32bits(v)
			bad |= u&absMask + 0x800000
			binary.LittleEndian.PutUint16(bs[2*i:], f16RNE(u))
		}
	} else {
		// Pairs (2p, 2p+1) share one noise word; x[0] is an even element.
		p := uint64(base) / 2
		for len(xs) >= 2 {
			s := (*[2]float32)(xs)
			d := (*[4]byte)(bs)
			h := pairBits(key, p)
			p++
			u0, u1 := math.Float32bits(s[0]), math.Float32bits(s[1])
			bad |= (u0&absMask + 0x800000) | (u1&absMask + 0x800000)
			binary.LittleEndian.PutUint16(d[0:], f16SR(u0, uint32(h)))
			binary.LittleEndian.PutUint16(d[2:], f16SR(u1, uint32(h>>32)))
			xs, bs = xs[2:], bs[4:]
		}
		if len(xs) == 1 {
			u := math.Float32bits(xs[0])
			bad |= u&absMask + 0x800000
			binary.LittleEndian.PutUint16(bs, f16SR(u, uint32(pairBits(key, p))))
		}
	}
	if bad&0x80000000 != 0 {
		return nonFinite(x, base)
	}
	return nil
}

// f16Abnormal is non-zero if one of the four binary16 values in the 16-bit
// lanes of v has exponent 0 (zero or subnormal) or 31 (Inf or NaN). With e a
// lane's exponent bits, e + 0x400 sets bit 15 only for exponent 31, and
// (e | 0x8000) - 0x400 clears it only for exponent 0; neither carries or
// borrows across lanes.
func f16Abnormal(v uint64) uint64 {
	const lanes = 0x0001_0001_0001_0001
	e := v & (0x7c00 * lanes)
	return (e + 0x0400*lanes | ^((e | 0x8000*lanes) - 0x0400*lanes)) & (0x8000 * lanes)
}

// f16Normal32 is f16Bits for a normal binary16 h (exponent 1 to 30): the
// sign-extended h gives the sign bit, the magnitude is rebiased in place.
func f16Normal32(h uint16) float32 {
	s := uint32(int32(int16(h)))
	return math.Float32frombits((s&0x7fff)<<13 + f16Rebias | s&0x80000000)
}

// decodeFP16 converts groups of 8 elements: a group of normal binary16
// values, the common case, by f16Normal32, any other by f16Bits. The first
// Inf or NaN is reported after the loop (dst then holds garbage).
func decodeFP16(dst []float32, body []byte, base int) error {
	body = body[:2*len(dst)]
	var hmax uint16
	ds, bs := dst, body
	for len(ds) >= 8 {
		d := (*[8]float32)(ds)
		s := (*[16]byte)(bs)
		if f16Abnormal(binary.LittleEndian.Uint64(s[0:]))|f16Abnormal(binary.LittleEndian.Uint64(s[8:])) == 0 {
			// Four at a time from a reloaded word, shifted in place, keeps
			// few values live.
			v := binary.LittleEndian.Uint64(s[0:])
			d[0] = f16Normal32(uint16(v))
			v >>= 16
			d[1] = f16Normal32(uint16(v))
			v >>= 16
			d[2] = f16Normal32(uint16(v))
			v >>= 16
			d[3] = f16Normal32(uint16(v))
			v = binary.LittleEndian.Uint64(s[8:])
			d[4] = f16Normal32(uint16(v))
			v >>= 16
			d[5] = f16Normal32(uint16(v))
			v >>= 16
			d[6] = f16Normal32(uint16(v))
			v >>= 16
			d[7] = f16Normal32(uint16(v))
		} else {
			for k := range d {
				h := binary.LittleEndian.Uint16(s[2*k:])
				hmax = max(hmax, h&0x7fff)
				d[k] = math.Float32frombits(f16Bits(h))
			}
		}
		ds, bs = ds[8:], bs[16:]
	}
	for i := range ds {
		h := binary.LittleEndian.Uint16(bs[2*i:])
		hmax = max(hmax, h&0x7fff)
		ds[i] = math.Float32frombits(f16Bits(h))
	}
	if hmax >= 0x7c00 {
		for i := range dst {
			if binary.LittleEndian.Uint16(body[2*i:])&0x7c00 == 0x7c00 {
				return fmt.Errorf("%w: decoded element %d is Inf or NaN", ErrNonFinite, base+i)
			}
		}
	}
	return nil
}

// encodeBody quantizes x (tensor elements base..base+len(x)) into body, which
// must have length bodyLen(c, len(x), block).
func encodeBody(c Codec, body []byte, x []float32, block, base int, key uint64, sr bool) error {
	switch c {
	case FP32:
		return encodeFP32(body, x, base)
	case BF16:
		return encodeBF16(body, x, base, key, sr)
	case FP16:
		return encodeFP16(body, x, base, key, sr)
	case Int8:
		return encodeInt8(body, x, block, base, key, sr)
	case Int4:
		return encodeInt4(body, x, block, base, key, sr)
	case MinMax8:
		return encodeMinMax8(body, x, block, base, key, sr)
	case Int2:
		return encodeInt2(body, x, block, base, key, sr)
	case Sign:
		return encodeSign(body, x, block, base, key, sr)
	}
	return fmt.Errorf("%w: codec id %d", ErrCodec, uint8(c))
}

// decodeBody is the inverse of encodeBody; body must have length
// bodyLen(c, len(dst), block).
func decodeBody(c Codec, dst []float32, body []byte, block, base int) error {
	switch c {
	case FP32:
		return decodeFP32(dst, body, base)
	case BF16:
		return decodeBF16(dst, body, base)
	case FP16:
		return decodeFP16(dst, body, base)
	case Int8:
		return decodeInt8(dst, body, block, base)
	case Int4:
		return decodeInt4(dst, body, block, base)
	case MinMax8:
		return decodeMinMax8(dst, body, block, base)
	case Int2:
		return decodeInt2(dst, body, block, base)
	case Sign:
		return decodeSign(dst, body, block, base)
	}
	return fmt.Errorf("%w: codec id %d", ErrCodec, uint8(c))
}
