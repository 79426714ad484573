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

// f32ToF16 converts finite f to binary16 with round to nearest even, or with
// stochastic rounding when sr; noise is a 32-bit random word. Magnitudes that
// round beyond 65504 saturate. After F. Giesen's float_to_half_fast3_rtne.
func f32ToF16(f float32, noise uint32, sr bool) uint16 {
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

// f16ToF32 converts binary16 bits to float32; ok is false for Inf and NaN.
func f16ToF32(h uint16) (f float32, ok bool) {
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

func encodeFP16(body []byte, x []float32, base int, key uint64, sr bool) error {
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
		binary.LittleEndian.PutUint16(body[2*i:], f32ToF16(v, uint32(h), sr))
	}
	return nil
}

func decodeFP16(dst []float32, body []byte, base int) error {
	body = body[:2*len(dst)]
	for i := range dst {
		f, ok := f16ToF32(binary.LittleEndian.Uint16(body[2*i:]))
		if !ok {
			return fmt.Errorf("%w: decoded element %d is Inf or NaN", ErrNonFinite, base+i)
		}
		dst[i] = f
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
	}
	return fmt.Errorf("%w: codec id %d", ErrCodec, uint8(c))
}
