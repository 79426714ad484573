package kernels

import "math"

// The matmuls and attention as a GPU runs them: a few strided, batched
// GEMMs and the row kernels of ewise_kernels.h between them. The plans
// below are plain data, so the same decomposition runs in two places: on
// the GPU (cuBLAS or sk_gemm_tiled, cuda.go) and, in the ordinary tests on
// every machine, on a reference GEMM in Go with the CPU build of the row
// kernels, checked against the CPU backend (gemm_plan_test.go). Only the
// GEMM executor itself needs a GPU to test.

// operand is a strided view of a row-major matrix inside a buffer: element
// (r,c) of batch (z1,z2) is at off + z1*s1 + z2*s2 + r*rs + c*cs. One of rs
// and cs is 1 (a plain or a transposed matrix).
type operand struct {
	buf            Buffer
	off            int
	rs, cs, s1, s2 int
}

// gemmOp is C = alpha op(A) op(B) + beta C over nb1 x nb2 batches, C (M,N);
// beta 0 never reads C. c.cs is always 1.
type gemmOp struct {
	M, N, K     int
	alpha, beta float32
	a, b, c     operand
	nb1, nb2    int
}

// rowMajor is a plain (r,c) matrix with row stride ld.
func rowMajor(buf Buffer, off, ld int) operand { return operand{buf: buf, off: off, rs: ld, cs: 1} }

// transposed is the transpose of a row-major matrix with row stride ld.
func transposed(buf Buffer, off, ld int) operand { return operand{buf: buf, off: off, rs: 1, cs: ld} }

func (o operand) batch(s1, s2 int) operand { o.s1, o.s2 = s1, s2; return o }

// matmulForwardPlan: out (N,OC) = inp (N,C) @ weight (OC,C)^T; the bias is
// added after (sk_bias_add).
func matmulForwardPlan(out, inp, weight Buffer, N, C, OC int) gemmOp {
	return gemmOp{M: N, N: OC, K: C, alpha: 1, a: rowMajor(inp, 0, C), b: transposed(weight, 0, C),
		c: rowMajor(out, 0, OC), nb1: 1, nb2: 1}
}

// matmulBackwardPlan: dinp (N,C) += dout (N,OC) @ weight (OC,C), and
// dweight (OC,C) += dout^T (OC,N) @ inp (N,C); dbias is a column sum after
// (sk_bias_backward).
func matmulBackwardPlan(dinp, dweight, dout, inp, weight Buffer, N, C, OC int) [2]gemmOp {
	return [2]gemmOp{
		{M: N, N: C, K: OC, alpha: 1, beta: 1, a: rowMajor(dout, 0, OC), b: rowMajor(weight, 0, C),
			c: rowMajor(dinp, 0, C), nb1: 1, nb2: 1},
		{M: OC, N: C, K: N, alpha: 1, beta: 1, a: transposed(dout, 0, OC), b: rowMajor(inp, 0, C),
			c: rowMajor(dweight, 0, C), nb1: 1, nb2: 1},
	}
}

// attentionPlan holds attention's GEMMs for shape (B,T,C,NH), batched over
// sequences (z1) and heads (z2). q, k and v of head h are the columns
// [h*hs, (h+1)*hs) of the thirds of inp (B,T,3C); out's head h is the same
// columns of out (B,T,C); the score matrices (B,NH,T,T) are dense.
type attentionPlan struct {
	scale           float32
	q, k, v         func(Buffer) operand // a head's (T,hs) slice of inp or dinp
	o               func(Buffer) operand // a head's (T,hs) slice of out or dout
	sq, sqT         func(Buffer) operand // a (T,T) score matrix, plain and transposed
	B, T, C, NH, hs int
	rows            int // B*NH*T softmax rows
	nb1, nb2        int
}

func newAttentionPlan(B, T, C, NH int) *attentionPlan {
	hs := C / NH
	C3 := 3 * C
	p := &attentionPlan{scale: float32(1 / math.Sqrt(float64(hs))), B: B, T: T, C: C, NH: NH, hs: hs,
		rows: B * NH * T, nb1: B, nb2: NH}
	third := func(i int) func(Buffer) operand {
		return func(b Buffer) operand { return rowMajor(b, i*C, C3).batch(T*C3, hs) }
	}
	p.q, p.k, p.v = third(0), third(1), third(2)
	p.o = func(b Buffer) operand { return rowMajor(b, 0, C).batch(T*C, hs) }
	p.sq = func(b Buffer) operand { return rowMajor(b, 0, T).batch(NH*T*T, T*T) }
	p.sqT = func(b Buffer) operand { return transposed(b, 0, T).batch(NH*T*T, T*T) }
	return p
}

func (p *attentionPlan) op(M, N, K int, alpha, beta float32, a, b, c operand) gemmOp {
	return gemmOp{M: M, N: N, K: K, alpha: alpha, beta: beta, a: a, b: b, c: c, nb1: p.nb1, nb2: p.nb2}
}

// forward: preatt = scale q k^T, then the causal softmax rows (att), then
// out = att v.
func (p *attentionPlan) forward(out, preatt, inp Buffer, att Buffer) (scores, values gemmOp) {
	T, hs := p.T, p.hs
	kT := p.k(inp)
	kT.rs, kT.cs = kT.cs, kT.rs
	return p.op(T, T, hs, p.scale, 0, p.q(inp), kT, p.sq(preatt)),
		p.op(T, hs, T, 1, 0, p.sq(att), p.v(inp), p.o(out))
}

// backward: datt = dout v^T and dv += att^T dout, then the softmax's
// backward rows (dpreatt), then dq += scale dpreatt k and dk += scale
// dpreatt^T q.
func (p *attentionPlan) backward(dinp, dpreatt, datt, dout, inp, att Buffer) (before, after [2]gemmOp) {
	T, hs := p.T, p.hs
	vT := p.v(inp)
	vT.rs, vT.cs = vT.cs, vT.rs
	before = [2]gemmOp{
		p.op(T, T, hs, 1, 0, p.o(dout), vT, p.sq(datt)),
		p.op(T, hs, T, 1, 1, p.sqT(att), p.o(dout), p.v(dinp)),
	}
	after = [2]gemmOp{
		p.op(T, hs, T, p.scale, 1, p.sq(dpreatt), p.k(inp), p.q(dinp)),
		p.op(T, hs, T, p.scale, 1, p.sqT(dpreatt), p.q(inp), p.k(dinp)),
	}
	return before, after
}
