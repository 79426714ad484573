package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// Benchmarks of each layer kernel, forward + backward, at the tiny model's
// shapes. Matmul and attention report GFLOPS (attention counts only the
// causal half); the others report GB/s of the minimal memory traffic.
//
//	go test ./kernels -run '^$' -bench 'Layer' -benchtime 2s
const (
	bB, bT, bC, bNH, bV = 16, 128, 128, 4, 256
	bN                  = bB * bT
)

func benchThreads(b *testing.B, f func(b *testing.B, d *CPU)) {
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) { f(b, NewCPU(threads)) })
	}
}

func reportGBs(b *testing.B, bytesPerOp float64) {
	b.ReportMetric(bytesPerOp*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

func reportGFLOPS(b *testing.B, flopsPerOp float64) {
	b.ReportMetric(flopsPerOp*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOPS")
}

func BenchmarkLayerEncoder(b *testing.B) {
	benchThreads(b, func(b *testing.B, d *CPU) {
		r := rand.New(rand.NewPCG(1, 1))
		tok := randIDs(r, bN, bV)
		wte, wpe, out := randBuf(r, bV*bC, 1), randBuf(r, bT*bC, 1), d.Alloc(bN*bC)
		dwte, dwpe := d.Alloc(bV*bC), d.Alloc(bT*bC)
		for b.Loop() {
			d.EncoderForward(out, tok, wte, wpe, bB, bT, bC)
			d.EncoderBackward(dwte, dwpe, out, tok, bB, bT, bC)
		}
		reportGBs(b, 4*bN*bC*(3+5))
	})
}

func BenchmarkLayerLayerNorm(b *testing.B) {
	benchThreads(b, func(b *testing.B, d *CPU) {
		r := rand.New(rand.NewPCG(1, 2))
		inp, w, bias := randBuf(r, bN*bC, 1), randBuf(r, bC, 1), randBuf(r, bC, 1)
		out, mean, rstd := d.Alloc(bN*bC), d.Alloc(bN), d.Alloc(bN)
		dinp, dw, db := d.Alloc(bN*bC), d.Alloc(bC), d.Alloc(bC)
		for b.Loop() {
			d.LayerNormForward(out, mean, rstd, inp, w, bias, bN, bC)
			d.LayerNormBackward(dinp, dw, db, out, inp, w, mean, rstd, bN, bC)
		}
		reportGBs(b, 4*bN*bC*(2+4))
	})
}

func BenchmarkLayerMatmul(b *testing.B) {
	for _, s := range []struct {
		name  string
		C, OC int
	}{{"qkv", bC, 3 * bC}, {"attproj", bC, bC}, {"fc", bC, 4 * bC}, {"fcproj", 4 * bC, bC}, {"lmhead", bC, bV}} {
		b.Run(s.name, func(b *testing.B) {
			benchThreads(b, func(b *testing.B, d *CPU) {
				r := rand.New(rand.NewPCG(1, 3))
				inp, w, bias := randBuf(r, bN*s.C, 1), randBuf(r, s.OC*s.C, 0.1), randBuf(r, s.OC, 1)
				out, dinp := d.Alloc(bN*s.OC), d.Alloc(bN*s.C)
				dw, db := d.Alloc(s.OC*s.C), d.Alloc(s.OC)
				for b.Loop() {
					d.MatmulForward(out, inp, w, bias, bN, s.C, s.OC)
					d.MatmulBackward(dinp, dw, db, out, inp, w, bN, s.C, s.OC)
				}
				reportGFLOPS(b, 6*bN*float64(s.C*s.OC))
			})
		})
	}
}

func BenchmarkLayerAttention(b *testing.B) {
	benchThreads(b, func(b *testing.B, d *CPU) {
		r := rand.New(rand.NewPCG(1, 4))
		nA := bB * bNH * bT * bT
		inp, out := randBuf(r, bN*3*bC, 1), d.Alloc(bN*bC)
		pre, att, dpre, datt := d.Alloc(nA), d.Alloc(nA), d.Alloc(nA), d.Alloc(nA)
		dinp := d.Alloc(bN * 3 * bC)
		for b.Loop() {
			d.AttentionForward(out, pre, att, inp, bB, bT, bC, bNH)
			d.AttentionBackward(dinp, dpre, datt, out, inp, att, bB, bT, bC, bNH)
		}
		// Causal: T(T+1)/2 scores per head, each 2*hs flops, in two GEMMs
		// forward and four backward.
		pairs := float64(bB*bNH*bT*(bT+1)) / 2
		reportGFLOPS(b, pairs*2*float64(bC/bNH)*6)
	})
}

func BenchmarkLayerGelu(b *testing.B) {
	benchThreads(b, func(b *testing.B, d *CPU) {
		r := rand.New(rand.NewPCG(1, 5))
		n := bN * 4 * bC
		inp, out, dinp := randBuf(r, n, 1), d.Alloc(n), d.Alloc(n)
		for b.Loop() {
			d.GeluForward(out, inp, n)
			d.GeluBackward(dinp, inp, out, n)
		}
		reportGBs(b, 4*float64(n)*(2+4))
	})
}

func BenchmarkLayerResidual(b *testing.B) {
	benchThreads(b, func(b *testing.B, d *CPU) {
		r := rand.New(rand.NewPCG(1, 6))
		n := bN * bC
		x, y, out := randBuf(r, n, 1), randBuf(r, n, 1), d.Alloc(n)
		dx, dy := d.Alloc(n), d.Alloc(n)
		for b.Loop() {
			d.ResidualForward(out, x, y, n)
			d.ResidualBackward(dx, dy, out, n)
		}
		reportGBs(b, 4*float64(n)*(3+5))
	})
}

func BenchmarkLayerSoftmaxCrossEntropy(b *testing.B) {
	benchThreads(b, func(b *testing.B, d *CPU) {
		r := rand.New(rand.NewPCG(1, 7))
		logits, tg := randBuf(r, bN*bV, 2), randIDs(r, bN, bV)
		losses, probs, dlogits := d.Alloc(bN), d.Alloc(bN*bV), d.Alloc(bN*bV)
		for b.Loop() {
			d.SoftmaxCrossEntropyForward(losses, probs, logits, tg, bN, bV, bV)
			d.SoftmaxCrossEntropyBackward(dlogits, probs, tg, 1.0/bN, bN, bV, bV)
		}
		reportGBs(b, 4*bN*bV*(2+3))
	})
}

// BenchmarkLayerAdamW updates a tiny model's worth of parameters (~1M).
func BenchmarkLayerAdamW(b *testing.B) {
	benchThreads(b, func(b *testing.B, d *CPU) {
		r := rand.New(rand.NewPCG(1, 8))
		n := 1 << 20
		p, g, m, v := randBuf(r, n, 1), randBuf(r, n, 0.01), d.Alloc(n), d.Alloc(n)
		for b.Loop() {
			d.AdamW(p, g, m, v, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1)
		}
		reportGBs(b, 4*float64(n)*7)
	})
}

func BenchmarkLayerSumSquaresScale(b *testing.B) {
	benchThreads(b, func(b *testing.B, d *CPU) {
		r := rand.New(rand.NewPCG(1, 9))
		n := 1 << 20
		g := randBuf(r, n, 1)
		for b.Loop() {
			d.Scale(g, 1/float32(d.SumSquares(g)))
		}
		reportGBs(b, 4*float64(n)*3)
	})
}

// BenchmarkLayerBlock runs one transformer block forward and backward (the
// matmuls included) and reports tokens/s for that block.
func BenchmarkLayerBlock(b *testing.B) {
	benchThreads(b, func(b *testing.B, d *CPU) {
		r := rand.New(rand.NewPCG(1, 10))
		C, N, nA := bC, bN, bB*bNH*bT*bT
		rb := func(n int) Buffer { return randBuf(r, n, 0.1) }
		x := rb(N * C)
		ln1w, ln1b, ln2w, ln2b := rb(C), rb(C), rb(C), rb(C)
		qkvw, qkvb, projw, projb := rb(3*C*C), rb(3*C), rb(C*C), rb(C)
		fcw, fcb, fcpw, fcpb := rb(4*C*C), rb(4*C), rb(C*4*C), rb(C)
		a := func(n int) Buffer { return d.Alloc(n) }
		ln1, m1, r1, qkv, pre, att, ao, proj, x2 := a(N*C), a(N), a(N), a(3*N*C), a(nA), a(nA), a(N*C), a(N*C), a(N*C)
		ln2, m2, r2, fc, g, fcp, x3 := a(N*C), a(N), a(N), a(4*N*C), a(4*N*C), a(N*C), a(N*C)
		dW := []Buffer{a(C), a(C), a(C), a(C), a(3 * C * C), a(3 * C), a(C * C), a(C), a(4 * C * C), a(4 * C), a(C * 4 * C), a(C)}
		dx, dln1, dqkv, dpre, datt, dao, dx2, dln2, dfc, dg := a(N*C), a(N*C), a(3*N*C), a(nA), a(nA), a(N*C), a(N*C), a(N*C), a(4*N*C), a(4*N*C)
		dproj, dfcp, dx3 := a(N*C), a(N*C), rb(N*C)
		for b.Loop() {
			d.LayerNormForward(ln1, m1, r1, x, ln1w, ln1b, N, C)
			d.MatmulForward(qkv, ln1, qkvw, qkvb, N, C, 3*C)
			d.AttentionForward(ao, pre, att, qkv, bB, bT, C, bNH)
			d.MatmulForward(proj, ao, projw, projb, N, C, C)
			d.ResidualForward(x2, x, proj, N*C)
			d.LayerNormForward(ln2, m2, r2, x2, ln2w, ln2b, N, C)
			d.MatmulForward(fc, ln2, fcw, fcb, N, C, 4*C)
			d.GeluForward(g, fc, 4*N*C)
			d.MatmulForward(fcp, g, fcpw, fcpb, N, 4*C, C)
			d.ResidualForward(x3, x2, fcp, N*C)

			for _, z := range []Buffer{dx, dln1, dqkv, dao, dx2, dln2, dfc, dg, dproj, dfcp} {
				d.Zero(z)
			}
			d.ResidualBackward(dx2, dfcp, dx3, N*C)
			d.MatmulBackward(dg, dW[10], dW[11], dfcp, g, fcpw, N, 4*C, C)
			d.GeluBackward(dfc, fc, dg, 4*N*C)
			d.MatmulBackward(dln2, dW[8], dW[9], dfc, ln2, fcw, N, C, 4*C)
			d.LayerNormBackward(dx2, dW[2], dW[3], dln2, x2, ln2w, m2, r2, N, C)
			d.ResidualBackward(dx, dproj, dx2, N*C)
			d.MatmulBackward(dao, dW[6], dW[7], dproj, ao, projw, N, C, C)
			d.AttentionBackward(dqkv, dpre, datt, dao, qkv, att, bB, bT, C, bNH)
			d.MatmulBackward(dln1, dW[4], dW[5], dqkv, ln1, qkvw, N, C, 3*C)
			d.LayerNormBackward(dx, dW[0], dW[1], dln1, x, ln1w, m1, r1, N, C)
		}
		b.ReportMetric(float64(N)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
	})
}
