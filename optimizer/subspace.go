package optimizer

import (
	"fmt"
	"math"
)

// A shared subspace (issue [3/4]; ALGORITHMS.md 7): the outer exchange
// sends, for every weight matrix M (rows x cols) of the model, only its
// coordinates in a rank-r basis every member of the round holds alike, and
// every other parameter (biases, layernorms: a few percent of a
// transformer) dense. Like the shared support (support.go) every
// contribution covers the same coordinates, so the collective's robust
// rule (norm clipping, trimmed mean, cross-checks, audits) applies to the
// compacted vector unchanged, with the collective's breakdown point, and
// no positions cross the wire. Unlike a support of single coordinates, a
// basis can follow where the averaged pseudo-gradient's energy is.
//
// The basis alternates sides, one exchange per round (PowerSGD's power
// iteration spread over rounds):
//
//   - side R: the basis Q is cols x r, orthonormal; a member sends
//     P = M Q (rows x r); the round's update is P̂ Qᵀ, where P̂ is the
//     collective's aggregate of the members' P;
//   - side L: the basis P is rows x r; a member sends C = Mᵀ P (cols x r);
//     the update is P Ĉᵀ.
//
// After a side R round the matrix's next basis is P̂ orthonormalised, after
// a side L round Ĉ orthonormalised: both come from the certified aggregate,
// so every member computes the same bits (modified Gram-Schmidt in float64
// with every product rounded explicitly, so no compiler fuses it). A basis
// vector that vanishes is replaced by a keyed random one. A matrix's side
// in round t is (its index + t) mod 2, which keeps the compacted vector's
// length about the same every round; the collective sees the longer of the
// two lengths (SubspaceConfig.Len), the shorter round padded with zeros.
//
// What the basis does not capture stays in the member's residual (error
// feedback, decayed by Decay): the update is an orthogonal projection of
// each member's matrix, so the residual is exactly what was not sent.

// Matrix is one weight matrix of the flat parameter vector: the row-major
// span [Off, Off+Rows*Cols).
type Matrix struct {
	Off, Rows, Cols int
}

// SubspaceConfig configures DiLoCoConfig.Subspace.
type SubspaceConfig struct {
	Rank     int      // basis vectors per matrix, >= 1
	Decay    float32  // residual decay per round, in (0, 1]
	Seed     uint64   // keys the first bases and any replacement vector
	Matrices []Matrix // disjoint, in increasing offset; the rest is sent dense
}

// Validate names the first invalid field; n is the parameter count.
func (c SubspaceConfig) Validate() error {
	switch {
	case c.Rank < 1 || c.Rank > 1024:
		return fmt.Errorf("%w: subspace rank %d out of range [1, 1024]", ErrConfig, c.Rank)
	case !(c.Decay > 0 && c.Decay <= 1):
		return fmt.Errorf("%w: residual decay %v out of range (0, 1]", ErrConfig, c.Decay)
	}
	end := 0
	for i, m := range c.Matrices {
		if m.Off < end || m.Rows < 1 || m.Cols < 1 || m.Rows > 1<<24 || m.Cols > 1<<24 {
			return fmt.Errorf("%w: subspace matrix %d (%+v) overlaps the previous one or has no rows or columns", ErrConfig, i, m)
		}
		if c.Rank > min(m.Rows, m.Cols) {
			return fmt.Errorf("%w: subspace rank %d exceeds matrix %d's %dx%d", ErrConfig, c.Rank, i, m.Rows, m.Cols)
		}
		end = m.Off + m.Rows*m.Cols
	}
	return nil
}

func (c SubspaceConfig) checkLen(n int) error {
	if k := len(c.Matrices); k > 0 {
		if m := c.Matrices[k-1]; m.Off+m.Rows*m.Cols > n {
			return fmt.Errorf("%w: subspace matrix %+v ends past the %d parameters", ErrConfig, m, n)
		}
	}
	return nil
}

// side reports whether matrix j is on side R (send M Q) in round t.
func sideR(j int, t uint64) bool { return (uint64(j)+t)%2 == 0 }

// roundLen is the compacted length in round t for n parameters.
func (c SubspaceConfig) roundLen(n int, t uint64) int {
	k := n
	for j, m := range c.Matrices {
		k -= m.Rows * m.Cols
		if sideR(j, t) {
			k += c.Rank * m.Rows
		} else {
			k += c.Rank * m.Cols
		}
	}
	return k
}

// Len is the length of the compacted vector the collective sees for n
// parameters: the longer of the two rounds' lengths.
func (c SubspaceConfig) Len(n int) int { return max(c.roundLen(n, 0), c.roundLen(n, 1)) }

// subspace is a member's bases, one per matrix (identical on every member).
type subspace struct {
	cfg   SubspaceConfig
	basis [][]float32 // per matrix: Rank vectors, contiguous, of length Rows (side L) or Cols (side R)
	round uint64      // the round the bases are for
	tmp   []float64
}

func newSubspace(cfg SubspaceConfig) *subspace {
	s := &subspace{cfg: cfg, basis: make([][]float32, len(cfg.Matrices))}
	for j, m := range cfg.Matrices {
		s.basis[j] = make([]float32, cfg.Rank*max(m.Rows, m.Cols))
		s.randomBasis(j, 0)
	}
	return s
}

// randomBasis sets matrix j's basis for round t to keyed random orthonormal vectors.
func (s *subspace) randomBasis(j int, t uint64) {
	m := s.cfg.Matrices[j]
	l := m.Cols
	if !sideR(j, t) {
		l = m.Rows
	}
	b := s.basis[j][:s.cfg.Rank*l]
	clear(b)
	s.orthonormalize(b, l, j, t)
}

// keyed is a uniform value in [-1, 1) keyed by (seed, matrix, round, i).
func (s *subspace) keyed(j int, t uint64, i int) float32 {
	x := splitmix(s.cfg.Seed ^ splitmix(uint64(j)<<40^t*0x9E3779B97F4A7C15^uint64(i)))
	return float32(int64(x>>40)-1<<23) / (1 << 23)
}

// orthonormalize turns the Rank vectors of length l in b into an
// orthonormal set by modified Gram-Schmidt in float64; a vector that
// (nearly) vanishes is replaced by a keyed random one first.
func (s *subspace) orthonormalize(b []float32, l, j int, t uint64) {
	r := s.cfg.Rank
	if cap(s.tmp) < r*l {
		s.tmp = make([]float64, r*l)
	}
	v := s.tmp[:r*l]
	for i, x := range b[:r*l] {
		v[i] = float64(x)
	}
	for k := 0; k < r; k++ {
		vk := v[k*l : (k+1)*l]
		for try := 0; ; try++ {
			in := dot64(vk, vk)
			for i := 0; i < k; i++ {
				vi := v[i*l : (i+1)*l]
				p := dot64(vk, vi)
				for e := range vk {
					vk[e] = vk[e] - float64(p*vi[e])
				}
			}
			out := dot64(vk, vk)
			// A vector whose norm is not finite, zero, or almost all in
			// the span of the previous ones gives no new direction.
			if out > 0 && out > 1e-12*in && !math.IsInf(out, 0) && !math.IsNaN(out) {
				inv := 1 / math.Sqrt(out)
				for e := range vk {
					vk[e] = float64(vk[e] * inv)
				}
				break
			}
			if try == 3 { // cannot happen with l >= Rank; keep a unit vector
				clear(vk)
				vk[k%l] = 1
				break
			}
			for e := range vk {
				vk[e] = float64(s.keyed(j, t, k*l+e+try*r*l))
			}
		}
	}
	for i, x := range v {
		b[i] = float32(x)
	}
}

func dot64(a, b []float64) float64 {
	var s float64
	for i, x := range a {
		s = s + float64(x*b[i])
	}
	return s
}

// project writes the compacted vector of the full vector x for round t to
// dst (length cfg.Len(len(x)); the tail past this round's length is zero).
func (s *subspace) project(dst, x []float32, t uint64) {
	r, o, prev := s.cfg.Rank, 0, 0
	dense := func(a, b int) {
		o += copy(dst[o:], x[a:b])
	}
	for j, m := range s.cfg.Matrices {
		dense(prev, m.Off)
		prev = m.Off + m.Rows*m.Cols
		a := x[m.Off:prev]
		if sideR(j, t) { // P = M Q, stored k-major: dst[o + k*Rows + row]
			q := s.basis[j][:r*m.Cols]
			for row := 0; row < m.Rows; row++ {
				mr := a[row*m.Cols : (row+1)*m.Cols]
				for k := 0; k < r; k++ {
					dst[o+k*m.Rows+row] = float32(dot32(mr, q[k*m.Cols:(k+1)*m.Cols]))
				}
			}
			o += r * m.Rows
		} else { // C = Mᵀ P, stored k-major: dst[o + k*Cols + col]
			p := s.basis[j][:r*m.Rows]
			acc := s.acc(r * m.Cols)
			for row := 0; row < m.Rows; row++ {
				mr := a[row*m.Cols : (row+1)*m.Cols]
				for k := 0; k < r; k++ {
					w := float64(p[k*m.Rows+row])
					ak := acc[k*m.Cols : (k+1)*m.Cols]
					for col, v := range mr {
						ak[col] = ak[col] + float64(w*float64(v))
					}
				}
			}
			for i, v := range acc {
				dst[o+i] = float32(v)
			}
			o += r * m.Cols
		}
	}
	dense(prev, len(x))
	clear(dst[o:])
}

// acc returns a zeroed float64 scratch of length n.
func (s *subspace) acc(n int) []float64 {
	if cap(s.tmp) < n {
		s.tmp = make([]float64, n)
	}
	a := s.tmp[:n]
	clear(a)
	return a
}

func dot32(a, b []float32) float64 {
	var s float64
	for i, x := range a {
		s = s + float64(float64(x)*float64(b[i]))
	}
	return s
}

// expand writes to the full vector dst what the compacted vector c stands
// for in round t: each matrix's coefficients times its basis, the dense
// coordinates as they are.
func (s *subspace) expand(dst, c []float32, t uint64) {
	r, o, prev := s.cfg.Rank, 0, 0
	dense := func(a, b int) {
		o += copy(dst[a:b], c[o:])
	}
	for j, m := range s.cfg.Matrices {
		dense(prev, m.Off)
		prev = m.Off + m.Rows*m.Cols
		a := dst[m.Off:prev]
		if sideR(j, t) { // P Qᵀ
			q := s.basis[j][:r*m.Cols]
			for row := 0; row < m.Rows; row++ {
				ar := a[row*m.Cols : (row+1)*m.Cols]
				acc := s.acc(m.Cols)
				for k := 0; k < r; k++ {
					w := float64(c[o+k*m.Rows+row])
					qk := q[k*m.Cols : (k+1)*m.Cols]
					for col := range acc {
						acc[col] = acc[col] + float64(w*float64(qk[col]))
					}
				}
				for col, v := range acc {
					ar[col] = float32(v)
				}
			}
			o += r * m.Rows
		} else { // P Cᵀ
			p := s.basis[j][:r*m.Rows]
			for row := 0; row < m.Rows; row++ {
				ar := a[row*m.Cols : (row+1)*m.Cols]
				acc := s.acc(m.Cols)
				for k := 0; k < r; k++ {
					w := float64(p[k*m.Rows+row])
					ck := c[o+k*m.Cols : o+(k+1)*m.Cols]
					for col := range acc {
						acc[col] = acc[col] + float64(w*float64(ck[col]))
					}
				}
				for col, v := range acc {
					ar[col] = float32(v)
				}
			}
			o += r * m.Cols
		}
	}
	dense(prev, len(dst))
}

// advance sets the bases for round t+1 from round t's aggregate c.
func (s *subspace) advance(c []float32, t uint64) {
	r, o := s.cfg.Rank, 0
	prev := 0
	for j, m := range s.cfg.Matrices {
		o += m.Off - prev
		prev = m.Off + m.Rows*m.Cols
		l := m.Rows // side R sent P (Rows per vector): the next basis is for side L
		if !sideR(j, t) {
			l = m.Cols
		}
		copy(s.basis[j][:r*l], c[o:o+r*l])
		s.orthonormalize(s.basis[j], l, j, t+1)
		o += r * l
	}
	s.round = t + 1
}
