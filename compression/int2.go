package compression

import (
	"cmp"
	"encoding/binary"
	"math"
)

// Int2: blockwise absmax with four levels and no zero, for the shared
// support's compacted pseudo-gradients (issue [3/4]), where error feedback
// keeps what a round's rounding loses. A block's step is absmax/1.5, so
// its largest magnitude is a level and nothing is clipped; code q in 0..3
// decodes to (q - 1.5)*step. Round to nearest takes q = round(x/step +
// 1.5) (half to even), stochastic min(floor(x/step + 1.5 + u), 3), whose
// expectation is x. Four codes a byte, element 4k+j in bits 2j, 2j+1 of
// byte k; the unused bits of a last partial byte are 0. Every code is
// valid, so a decoder checks only the scales.

// encodeInt2 writes nb float32 steps then ceil(len(x)/4) bytes of codes.
func encodeInt2(body []byte, x []float32, block, base int, key uint64, sr bool) error {
	nb := (len(x) + block - 1) / block
	codes := body[4*nb : 4*nb+(len(x)+3)/4]
	for b := 0; b < nb; b++ {
		lo := b * block
		hi := min(lo+block, len(x))
		xb := x[lo:hi]
		m := absmaxBits(xb)
		if m > maxBlockBits {
			return cmp.Or(tooLarge(Int2, m, base+lo), nonFinite(xb, base+lo))
		}
		step, inv := absmaxScale(math.Float32frombits(m), 1.5)
		binary.LittleEndian.PutUint32(body[4*b:], math.Float32bits(step))
		// block is a multiple of 8, so a block starts on a byte
		cb := codes[lo/4 : (hi+3)/4]
		clear(cb)
		if step == 0 { // a block of zeros (or nearly): code 2 decodes to +0
			for i := range xb {
				cb[i/4] |= byte(2 << (2 * (i % 4)))
			}
			continue
		}
		for i, v := range xb {
			y := float32(float32(v*inv) + 1.5) // in [0, 3]
			var q uint32
			if sr {
				q = uint32(min(max(floorClamp(y, unit24(uint32(pairBits(key, uint64(base+lo+i)))), 3), 0), 3))
			} else {
				q = math.Float32bits(float32(y+roundMagic)) & 3
			}
			cb[i/4] |= byte(q << (2 * (i % 4)))
		}
	}
	return nil
}

// int2Quads[b] holds the four levels (q - 1.5) of byte b.
var int2Quads = func() (t [256][4]float32) {
	for b := range t {
		for j := range 4 {
			t[b][j] = float32(b>>(2*j)&3) - 1.5
		}
	}
	return t
}()

func decodeInt2(dst []float32, body []byte, block, base int) error {
	nb := (len(dst) + block - 1) / block
	codes := body[4*nb : 4*nb+(len(dst)+3)/4]
	for b := 0; b < nb; b++ {
		step := math.Float32frombits(binary.LittleEndian.Uint32(body[4*b:]))
		if err := checkScale(step, 1.5, base+b*block); err != nil {
			return err
		}
		lo := b * block
		hi := min(lo+block, len(dst))
		d := dst[lo:hi]
		n := len(d) &^ 3
		for i, c := range codes[lo/4 : lo/4+n/4] {
			q := &int2Quads[c]
			d[4*i] = q[0] * step
			d[4*i+1] = q[1] * step
			d[4*i+2] = q[2] * step
			d[4*i+3] = q[3] * step
		}
		for i := n; i < len(d); i++ {
			d[i] = int2Quads[codes[(lo+i)/4]][i%4] * step
		}
	}
	return nil
}

// Sign: one bit an element and a float32 scale a block, for the same use
// as Int2 at half its bits. Nearest: the bit is x's sign (+ for +0) and the
// scale is sum x^2 / sum |x|, the one whose decoded block d keeps x's
// projection (<d, x> = |x|^2): rounding adds error across x and takes
// nothing along it. The mean |x| would minimize |d - x|^2 instead, by
// shrinking every block by (sum |x|)^2 / (n sum x^2) along x (2/pi for
// Gaussian values), and a pseudo-gradient's shrinkage is progress lost
// wherever nothing feeds it back: the butterfly's aggregates, and the part
// of a residual its decay drops (BENCHMARKS.md, session 13). The scale lies
// between the mean |x| and absmax. Stochastic: the scale is absmax and
// the bit is 1 with probability (1 + x/absmax)/2, so the expectation is
// x. Element 8k+j is bit j of byte k, 1 decoding to +scale and 0 to
// -scale; the unused bits of a last partial byte are 0. A block whose
// scale would be below 2^-100 has scale 0 and bits 1, and decodes to +0.

// encodeSign writes nb float32 scales then ceil(len(x)/8) bytes of bits:
// without stochastic rounding encodeSignNearest, with it the scale is the
// block's absmax.
func encodeSign(body []byte, x []float32, block, base int, key uint64, sr bool) error {
	if !sr {
		return encodeSignNearest(body, x, block, base)
	}
	nb := (len(x) + block - 1) / block
	bits := body[4*nb : 4*nb+(len(x)+7)/8]
	for b := 0; b < nb; b++ {
		lo := b * block
		hi := min(lo+block, len(x))
		xb := x[lo:hi]
		m := absmaxBits(xb)
		if m > maxBlockBits {
			return cmp.Or(tooLarge(Sign, m, base+lo), nonFinite(xb, base+lo))
		}
		scale := math.Float32frombits(m)
		if scale < minScaleAbs {
			scale = 0
		}
		binary.LittleEndian.PutUint32(body[4*b:], math.Float32bits(scale))
		// block is a multiple of 8, so a block starts on a byte
		bb := bits[lo/8 : (hi+7)/8]
		clear(bb)
		if scale == 0 {
			for i := range xb {
				bb[i/8] |= 1 << (i % 8)
			}
			continue
		}
		for i, v := range xb {
			// 1 with probability (1 + v/absmax)/2: u < that, u in [0, 1)
			u := unit24(uint32(pairBits(key, uint64(base+lo+i))))
			if u < float32(float32(float32(v/scale)+1)*0.5) {
				bb[i/8] |= 1 << (i % 8)
			}
		}
	}
	return nil
}

func decodeSign(dst []float32, body []byte, block, base int) error {
	nb := (len(dst) + block - 1) / block
	bits := body[4*nb : 4*nb+(len(dst)+7)/8]
	for b := 0; b < nb; b++ {
		scale := math.Float32frombits(binary.LittleEndian.Uint32(body[4*b:]))
		if err := checkScale(scale, 1, base+b*block); err != nil {
			return err
		}
	}
	done := 0
	if hasSignAsm { // the whole blocks, 8 values an instruction
		done = signBlocksAsm(dst, body[:4*nb], bits, block)
	}
	for b := done; b < nb; b++ {
		scale := binary.LittleEndian.Uint32(body[4*b:])
		lo := b * block
		hi := min(lo+block, len(dst))
		d := dst[lo:hi]
		n := len(d) &^ 7
		for k, c := range bits[lo/8 : lo/8+n/8] {
			t, o := &signMasks[c], (*[8]float32)(d[8*k:])
			for j := range 8 {
				o[j] = math.Float32frombits(scale ^ t[j])
			}
		}
		for i := n; i < len(d); i++ {
			d[i] = math.Float32frombits(scale ^ signMasks[bits[(lo+i)/8]][i%8])
		}
	}
	return nil
}

// encodeSignNearest is encodeSign without stochastic rounding: the scale is
// the block's sum x^2 / sum |x| (both summed in float64 in index order)
// and the bits are the signs. One pass over each block computes the signs,
// the largest magnitude and the two sums together: the sums' chains of
// dependent adds bound it, and the rest fills their wait.
func encodeSignNearest(body []byte, x []float32, block, base int) error {
	nb := (len(x) + block - 1) / block
	bits := body[4*nb : 4*nb+(len(x)+7)/8]
	for b := 0; b < nb; b++ {
		lo := b * block
		hi := min(lo+block, len(x))
		xb := x[lo:hi]
		bb := bits[lo/8 : (hi+7)/8]
		var sum, sq float64
		var m uint32
		n := len(xb) &^ 7
		for k := 0; k < n; k += 8 {
			v := (*[8]float32)(xb[k:])
			var w uint32
			for j := range 8 {
				u := math.Float32bits(v[j])
				w |= (^u >> 31) << j
				m = max(m, u&absMask)
				f := float64(v[j])
				sum += math.Abs(f)
				sq += f * f
			}
			bb[k/8] = byte(w)
		}
		if n < len(xb) {
			bb[n/8] = 0
			for i := n; i < len(xb); i++ {
				u := math.Float32bits(xb[i])
				bb[i/8] |= byte((^u>>31)&1) << (i % 8)
				m = max(m, u&absMask)
				f := float64(xb[i])
				sum += math.Abs(f)
				sq += f * f
			}
		}
		if err := signScale(body[4*b:], bb, xb, m, sum, sq, base+lo); err != nil {
			return err
		}
	}
	return nil
}

// signScale ends encodeSignNearest's block xb (its bits bb, the largest
// magnitude's bits m, the sums of magnitudes sum and of squares sq): it
// checks the block, writes the scale at the start of dst and sets a zero
// block's bits. sq/sum is at most absmax (sq <= absmax*sum), so the scale
// is finite; below 2^-100 it is sent as 0.
func signScale(dst, bb []byte, xb []float32, m uint32, sum, sq float64, base int) error {
	if m > maxBlockBits {
		return cmp.Or(tooLarge(Sign, m, base), nonFinite(xb, base))
	}
	var scale float32
	if sum > 0 {
		scale = float32(sq / sum)
	}
	if scale < minScaleAbs {
		scale = 0
		for i := range xb {
			bb[i/8] |= 1 << (i % 8)
		}
	}
	binary.LittleEndian.PutUint32(dst, math.Float32bits(scale))
	return nil
}

// signMasks[b] holds the sign bits (as float32 bits) of byte b's eight
// values: 1<<31 where a bit is 0 (-scale), 0 where it is 1 (+scale). A
// scale is checked finite and >= 0, so scale XOR mask is the product of
// the scale and -1 or +1.
var signMasks = func() (t [256][8]uint32) {
	for b := range t {
		for j := range 8 {
			if b>>j&1 == 0 {
				t[b][j] = 1 << 31
			}
		}
	}
	return t
}()
