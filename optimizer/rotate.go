package optimizer

import "math"

// A rotation of the shared support's basis (SupportConfig.Rotate, issue
// [3/4]): each whole chunk of n = Chunk coordinates (a power of two) is
// mapped by R = H D / sqrt(n), D a fixed diagonal of signs (the same on
// every member and in every round) and H the n-point Walsh-Hadamard
// matrix, so R is orthonormal and its inverse is R^T = D H / sqrt(n). A
// chunk's values, spread over all n rotated coordinates, come out nearly
// Gaussian and alike in size, whatever tensors the chunk holds: one sign
// scale then fits a block, and a support of K rotated coordinates carries
// a share of every coordinate of the chunk instead of all of K of them
// (BENCHMARKS.md, session 14). The transform adds and subtracts in a
// fixed order and scales by one constant, so every member gets the same
// bits from the same input. A last, partial chunk is not rotated.
type rotation struct {
	chunk int
	signs []float32
	scale float32
	// scaledSigns[i] = scale * signs[i], the factors of inverseChunk's
	// last loop (and of the fused step, nesterovStepScaled).
	scaledSigns []float32
}

// rotationKey keys the signs of D.
const rotationKey = 0x5ca1ab1e0ddba11

func newRotation(chunk int) *rotation {
	r := &rotation{chunk: chunk, signs: make([]float32, chunk), scale: float32(1 / math.Sqrt(float64(chunk))), scaledSigns: make([]float32, chunk)}
	for i := range r.signs {
		r.signs[i] = 1
		if splitmix(rotationKey^uint64(i))&1 == 1 {
			r.signs[i] = -1
		}
		r.scaledSigns[i] = r.scale * r.signs[i]
	}
	return r
}

// forward replaces every whole chunk x_c of x with R x_c.
func (r *rotation) forward(x []float32) {
	for lo := 0; lo+r.chunk <= len(x); lo += r.chunk {
		r.forwardChunk(x[lo : lo+r.chunk])
	}
}

// forwardChunk replaces c, one whole chunk, with R c.
func (r *rotation) forwardChunk(c []float32) {
	c = c[:len(r.signs)]
	for i, s := range r.signs {
		c[i] *= s
	}
	fwht(c)
	for i := range c {
		c[i] *= r.scale
	}
}

// inverse replaces every whole chunk x_c of x with R^T x_c.
func (r *rotation) inverse(x []float32) {
	for lo := 0; lo+r.chunk <= len(x); lo += r.chunk {
		r.inverseChunk(x[lo : lo+r.chunk])
	}
}

// inverseChunk replaces c, one whole chunk, with R^T c.
func (r *rotation) inverseChunk(c []float32) {
	c = c[:len(r.signs)]
	fwht(c)
	for i, s := range r.scaledSigns {
		c[i] *= s
	}
}

// fwht is the unnormalized Walsh-Hadamard transform of a (a power of two
// long) in place: fwhtAVX2 where the CPU has AVX2 (rotate_amd64.s),
// fwhtGeneric elsewhere. Both compute every stage of the textbook loop
// (a[j], a[j+h] = a[j]+a[j+h], a[j]-a[j+h] for h = 1, 2, 4, ...) with the
// same operations on the same values, so members on different CPUs get
// the same bits (TestFWHTMatchesTextbook).
func fwht(a []float32) {
	if len(a) >= 8 && hasFWHTAsm {
		fwhtAsm(a)
		return
	}
	fwhtGeneric(a)
}

// fwhtGeneric is fwht in Go, two stages a pass (h and 2h).
func fwhtGeneric(a []float32) {
	n := len(a)
	h := 1
	for ; 4*h <= n; h *= 4 {
		for i := 0; i < n; i += 4 * h {
			b0 := a[i : i+h : i+h]
			b1 := a[i+h : i+2*h : i+2*h]
			b2 := a[i+2*h : i+3*h : i+3*h]
			b3 := a[i+3*h : i+4*h : i+4*h]
			for j := range b0 {
				x0, x1, x2, x3 := b0[j], b1[j], b2[j], b3[j]
				s0, d0 := x0+x1, x0-x1
				s1, d1 := x2+x3, x2-x3
				b0[j], b1[j], b2[j], b3[j] = s0+s1, d0+d1, s0-s1, d0-d1
			}
		}
	}
	if h < n { // one stage left: n is 2 times a power of 4
		b0, b1 := a[:h], a[h:2*h]
		for j := range b0 {
			x, y := b0[j], b1[j]
			b0[j], b1[j] = x+y, x-y
		}
	}
}
