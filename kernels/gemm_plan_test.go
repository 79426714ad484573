package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// hostGemm runs a planned GEMM in Go, in float64, on host buffers: the
// reference for the plans' strides and batches.
func hostGemm(g gemmOp) {
	at := func(o operand, z1, z2, r, c int) *float32 {
		return &Host(o.buf)[o.off+z1*o.s1+z2*o.s2+r*o.rs+c*o.cs]
	}
	for z1 := 0; z1 < g.nb1; z1++ {
		for z2 := 0; z2 < g.nb2; z2++ {
			for i := 0; i < g.M; i++ {
				for j := 0; j < g.N; j++ {
					var s float64
					for k := 0; k < g.K; k++ {
						s += float64(*at(g.a, z1, z2, i, k)) * float64(*at(g.b, z1, z2, k, j))
					}
					c := at(g.c, z1, z2, i, j)
					v := float64(g.alpha) * s
					if g.beta != 0 {
						v += float64(g.beta) * float64(*c)
					}
					*c = float32(v)
				}
			}
		}
	}
}

func clone(x []float32) HostBuffer { return append(HostBuffer(nil), x...) }

// The GPU's decomposition of the matmuls and of attention (gemm_plan.go:
// the same plans, with the CPU build of the GPU's row kernels and a
// float64 GEMM in place of cuBLAS) agrees with the CPU backend. This runs
// on every machine: of the CUDA backend, only the GEMM executor itself is
// left for the GPU tests.
func TestGemmPlansMatchCPU(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	cpu := NewCPU(0)
	check := func(what string, got, want []float32) {
		t.Helper()
		if e := relErr(got, want); !(e < 2e-6) {
			t.Errorf("%s: relative error %.3g", what, e)
		} else {
			t.Logf("%-36s relative error %.2g", what, e)
		}
	}
	for _, sh := range [][3]int{{67, 96, 130}, {5, 16, 3}, {64, 1, 16}, {64, 16, 1}} {
		N, Ch, OC := sh[0], sh[1], sh[2]
		tag := fmt.Sprintf(" %dx%dx%d", N, Ch, OC)
		inp, w, bias := randomVec(rng, N*Ch, 1), randomVec(rng, OC*Ch, 0.1), randomVec(rng, OC, 1)
		want := make(HostBuffer, N*OC)
		cpu.MatmulForward(want, clone(inp), clone(w), clone(bias), N, Ch, OC)
		got := make(HostBuffer, N*OC)
		hostGemm(matmulForwardPlan(got, clone(inp), clone(w), N, Ch, OC))
		ewiseBiasAdd(got, bias)
		check("matmul forward"+tag, got, want)

		dout, dx0, dw0, db0 := randomVec(rng, N*OC, 1), randomVec(rng, N*Ch, 1), randomVec(rng, OC*Ch, 1), randomVec(rng, OC, 1)
		wdx, wdw, wdb := clone(dx0), clone(dw0), clone(db0)
		cpu.MatmulBackward(wdx, wdw, wdb, clone(dout), clone(inp), clone(w), N, Ch, OC)
		gdx, gdw, gdb := clone(dx0), clone(dw0), clone(db0)
		for _, g := range matmulBackwardPlan(gdx, gdw, clone(dout), clone(inp), clone(w), N, Ch, OC) {
			hostGemm(g)
		}
		ewiseBiasBackward(gdb, dout, N)
		check("matmul dinp"+tag, gdx, wdx)
		check("matmul dweight"+tag, gdw, wdw)
		check("matmul dbias"+tag, gdb, wdb)
	}
	for _, sh := range [][4]int{{2, 33, 96, 4}, {2, 64, 128, 4}, {1, 1, 8, 2}} {
		B, T, Ch, NH := sh[0], sh[1], sh[2], sh[3]
		tag := fmt.Sprintf(" B%d T%d C%d NH%d", B, T, Ch, NH)
		qkv := randomVec(rng, B*T*3*Ch, 1)
		sq := B * NH * T * T
		wo, wpre, watt := make(HostBuffer, B*T*Ch), make(HostBuffer, sq), make(HostBuffer, sq)
		cpu.AttentionForward(wo, wpre, watt, clone(qkv), B, T, Ch, NH)
		p := newAttentionPlan(B, T, Ch, NH)
		// Poisoned outputs: the plan must write every element.
		poison := func(n int) HostBuffer { return clone(randomVec(rng, n, 100)) }
		gout, gpre, gatt := poison(B*T*Ch), poison(sq), poison(sq)
		scores, values := p.forward(gout, gpre, clone(qkv), gatt)
		hostGemm(scores)
		ewiseAttentionSoftmax(gpre, gatt, p.rows, T)
		hostGemm(values)
		check("attention out"+tag, gout, wo)
		check("attention preatt"+tag, gpre, wpre)
		check("attention att"+tag, gatt, watt)

		dout, dx0 := randomVec(rng, B*T*Ch, 1), randomVec(rng, B*T*3*Ch, 1)
		wdx := clone(dx0)
		cpu.AttentionBackward(wdx, make(HostBuffer, sq), make(HostBuffer, sq), clone(dout), clone(qkv), clone(watt), B, T, Ch, NH)
		gdx, gdpre, gdatt := clone(dx0), poison(sq), poison(sq)
		before, after := p.backward(gdx, gdpre, gdatt, clone(dout), clone(qkv), clone(watt))
		for _, g := range before {
			hostGemm(g)
		}
		ewiseAttentionSoftmaxBackward(gdpre, watt, gdatt, p.rows, T)
		for _, g := range after {
			hostGemm(g)
		}
		check("attention dinp"+tag, gdx, wdx)
	}
	for _, n := range []int{1, 4095, 4096, 1000003} {
		x := randomVec(rng, n, 1)
		want := cpu.SumSquares(clone(x))
		got := ewiseSumSquares(x, min(n, sumsqParts))
		if d := (got - want) / want; d > 1e-12 || d < -1e-12 {
			t.Errorf("sum of squares of %d: %v, want %v", n, got, want)
		}
	}
}
