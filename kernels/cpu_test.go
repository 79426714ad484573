package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// Tolerances.
//
// Forward: every output element satisfies |got - want| <= fwdTol * (1 + |want|)
// against the float64 reference (float32 rounding over sums of up to ~100
// terms of magnitude ~1 stays near 1e-6).
//
// Backward: the float32 analytic gradient of L = sum(out * R) is compared
// with central finite differences (h = 1e-5) of the float64 reference:
// max|analytic - numeric| / max(max|numeric|, 1e-3) <= gradTol, per tensor.
// Calling the backward twice must give 2x the gradient within accTol.
const (
	fwdTol  = 1e-5
	gradTol = 2e-5
	accTol  = 1e-6
	fdStep  = 1e-5
)

func randBuf(r *rand.Rand, n int, scale float64) HostBuffer {
	b := make(HostBuffer, n)
	for i := range b {
		b[i] = float32(r.NormFloat64() * scale)
	}
	return b
}

func randIDs(r *rand.Rand, n, limit int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(r.IntN(limit))
	}
	return ids
}

func to64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

// forEachLayerISA runs f once per instruction-set variant this CPU supports.
func forEachLayerISA(t *testing.T, f func(t *testing.T)) {
	orig := layersISA()
	defer setLayersISA(orig)
	for _, isa := range []string{"avx512", "avx2", "portable"} {
		if !setLayersISA(isa) {
			t.Logf("isa %s not supported here, skipped", isa)
			continue
		}
		t.Run(isa, f)
	}
}

// checkClose reports elements with |got-want| > tol*(1+|want|).
func checkClose(t *testing.T, name string, got []float32, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: len %d, want %d", name, len(got), len(want))
	}
	worst, at := 0.0, -1
	for i := range got {
		e := math.Abs(float64(got[i])-want[i]) / (1 + math.Abs(want[i]))
		if e > worst || math.IsNaN(e) {
			worst, at = e, i
		}
	}
	t.Logf("%s: worst scaled error %.3g (tolerance %g)", name, worst, tol)
	if worst > tol || math.IsNaN(worst) {
		t.Errorf("%s: worst scaled error %.3g at %d (got %g, want %g), tolerance %g",
			name, worst, at, got[at], want[at], tol)
	}
}

type fwdCase struct {
	name string
	// run executes the float32 kernel and returns its outputs together with
	// the float64 reference outputs, in the same order.
	run func(d *CPU) (got [][]float32, want [][]float64)
}

func fwdCases(seed uint64) []fwdCase {
	r := rand.New(rand.NewPCG(seed, 1))
	return []fwdCase{
		{"encoder", func(d *CPU) ([][]float32, [][]float64) {
			B, T, C, V, maxT := 3, 9, 40, 7, 12
			tok := randIDs(r, B*T, V)
			wte, wpe := randBuf(r, V*C, 1), randBuf(r, maxT*C, 1)
			out := make(HostBuffer, B*T*C)
			d.EncoderForward(out, tok, wte, wpe, B, T, C)
			return [][]float32{out}, [][]float64{refEncoder(tok, to64(wte), to64(wpe), B, T, C)}
		}},
		{"layernorm", func(d *CPU) ([][]float32, [][]float64) {
			N, C := 37, 72
			inp := randBuf(r, N*C, 2)
			for i := range inp {
				inp[i] += 3 // a mean far from 0
			}
			w, b := randBuf(r, C, 1), randBuf(r, C, 1)
			out, mean, rstd := make(HostBuffer, N*C), make(HostBuffer, N), make(HostBuffer, N)
			d.LayerNormForward(out, mean, rstd, inp, w, b, N, C)
			ro, rm, rr := refLayerNorm(to64(inp), to64(w), to64(b), N, C)
			return [][]float32{out, mean, rstd}, [][]float64{ro, rm, rr}
		}},
		{"matmul", func(d *CPU) ([][]float32, [][]float64) {
			N, C, OC := 45, 70, 33
			inp, w, b := randBuf(r, N*C, 1), randBuf(r, OC*C, 0.2), randBuf(r, OC, 1)
			out := make(HostBuffer, N*OC)
			d.MatmulForward(out, inp, w, b, N, C, OC)
			return [][]float32{out}, [][]float64{refMatmul(to64(inp), to64(w), to64(b), N, C, OC)}
		}},
		{"matmul_nobias", func(d *CPU) ([][]float32, [][]float64) {
			N, C, OC := 20, 16, 48
			inp, w := randBuf(r, N*C, 1), randBuf(r, OC*C, 0.3)
			out := make(HostBuffer, N*OC)
			for i := range out {
				out[i] = float32(math.NaN()) // must be ignored
			}
			d.MatmulForward(out, inp, w, nil, N, C, OC)
			return [][]float32{out}, [][]float64{refMatmul(to64(inp), to64(w), nil, N, C, OC)}
		}},
		{"attention", func(d *CPU) ([][]float32, [][]float64) {
			B, T, C, NH := 2, 70, 48, 3 // T spans three row blocks
			inp := randBuf(r, B*T*3*C, 1)
			out := make(HostBuffer, B*T*C)
			pre, att := make(HostBuffer, B*NH*T*T), make(HostBuffer, B*NH*T*T)
			for i := range pre {
				pre[i], att[i] = 7, 7 // stale values must be overwritten
			}
			d.AttentionForward(out, pre, att, inp, B, T, C, NH)
			ro, rp, ra := refAttention(to64(inp), B, T, C, NH)
			return [][]float32{out, pre, att}, [][]float64{ro, rp, ra}
		}},
		{"attention_T64", func(d *CPU) ([][]float32, [][]float64) {
			B, T, C, NH := 2, 64, 32, 2 // T a multiple of 16: the blocked softmax path
			inp := randBuf(r, B*T*3*C, 2)
			out := make(HostBuffer, B*T*C)
			pre, att := make(HostBuffer, B*NH*T*T), make(HostBuffer, B*NH*T*T)
			for i := range pre {
				pre[i], att[i] = 7, 7
			}
			d.AttentionForward(out, pre, att, inp, B, T, C, NH)
			ro, rp, ra := refAttention(to64(inp), B, T, C, NH)
			return [][]float32{out, pre, att}, [][]float64{ro, rp, ra}
		}},
		{"gelu", func(d *CPU) ([][]float32, [][]float64) {
			inp := randBuf(r, 40000, 3)
			inp[0], inp[1], inp[2] = -30, 30, 0
			out := make(HostBuffer, len(inp))
			d.GeluForward(out, inp, len(inp))
			return [][]float32{out}, [][]float64{refGelu(to64(inp))}
		}},
		{"residual", func(d *CPU) ([][]float32, [][]float64) {
			a, b := randBuf(r, 33333, 1), randBuf(r, 33333, 1)
			out := make(HostBuffer, len(a))
			d.ResidualForward(out, a, b, len(a))
			return [][]float32{out}, [][]float64{refResidual(to64(a), to64(b))}
		}},
		{"softmax_xent", func(d *CPU) ([][]float32, [][]float64) {
			N, V, Vp := 19, 100, 128
			logits := randBuf(r, N*Vp, 3)
			for n := 0; n < N; n++ {
				for i := V; i < Vp; i++ {
					logits[n*Vp+i] = 1e30 // padding must be ignored
				}
			}
			tg := randIDs(r, N, V)
			losses, probs := make(HostBuffer, N), make(HostBuffer, N*Vp)
			d.SoftmaxCrossEntropyForward(losses, probs, logits, tg, N, V, Vp)
			rl, rp := refSoftmaxCE(to64(logits), tg, N, V, Vp)
			return [][]float32{losses, probs}, [][]float64{rl, rp}
		}},
	}
}

func TestForwardMatchesReference(t *testing.T) {
	forEachLayerISA(t, func(t *testing.T) {
		for _, threads := range []int{1, 2} {
			d := NewCPU(threads)
			for _, tc := range fwdCases(1) {
				t.Run(fmt.Sprintf("%s/threads=%d", tc.name, threads), func(t *testing.T) {
					got, want := tc.run(d)
					for i := range got {
						checkClose(t, fmt.Sprintf("output %d", i), got[i], want[i], fwdTol)
					}
				})
			}
		}
	})
}

type gradCase struct {
	name   string
	inputs []HostBuffer // the differentiated inputs
	nout   int
	// dloss, when non-zero, makes R constant (the loss kernel takes a scalar).
	dloss float32
	// ref is the float64 forward: inputs -> out (nout).
	ref func(in [][]float64) []float64
	// bwd runs the float32 forward as needed, then the backward once with
	// dout, accumulating into grads (one per input, same lengths).
	bwd func(d *CPU, in []HostBuffer, dout HostBuffer, grads []HostBuffer)
}

func gradCases(seed uint64) []gradCase {
	r := rand.New(rand.NewPCG(seed, 2))
	var cases []gradCase
	{
		B, T, C, V, maxT := 2, 5, 12, 4, 7 // tokens repeat; wpe rows >= T get 0
		tok := randIDs(r, B*T, V)
		cases = append(cases, gradCase{
			name: "encoder", inputs: []HostBuffer{randBuf(r, V*C, 1), randBuf(r, maxT*C, 1)}, nout: B * T * C,
			ref: func(in [][]float64) []float64 { return refEncoder(tok, in[0], in[1], B, T, C) },
			bwd: func(d *CPU, in []HostBuffer, dout HostBuffer, g []HostBuffer) {
				d.EncoderBackward(g[0], g[1], dout, tok, B, T, C)
			},
		})
	}
	{
		N, C := 6, 40
		cases = append(cases, gradCase{
			name: "layernorm", inputs: []HostBuffer{randBuf(r, N*C, 1.5), randBuf(r, C, 1), randBuf(r, C, 1)}, nout: N * C,
			ref: func(in [][]float64) []float64 { o, _, _ := refLayerNorm(in[0], in[1], in[2], N, C); return o },
			bwd: func(d *CPU, in []HostBuffer, dout HostBuffer, g []HostBuffer) {
				out, mean, rstd := make(HostBuffer, N*C), make(HostBuffer, N), make(HostBuffer, N)
				d.LayerNormForward(out, mean, rstd, in[0], in[1], in[2], N, C)
				d.LayerNormBackward(g[0], g[1], g[2], dout, in[0], in[1], mean, rstd, N, C)
			},
		})
	}
	{
		N, C, OC := 7, 11, 36
		cases = append(cases, gradCase{
			name: "matmul", inputs: []HostBuffer{randBuf(r, N*C, 1), randBuf(r, OC*C, 1), randBuf(r, OC, 1)}, nout: N * OC,
			ref: func(in [][]float64) []float64 { return refMatmul(in[0], in[1], in[2], N, C, OC) },
			bwd: func(d *CPU, in []HostBuffer, dout HostBuffer, g []HostBuffer) {
				d.MatmulBackward(g[0], g[1], g[2], dout, in[0], in[1], N, C, OC)
			},
		})
		cases = append(cases, gradCase{
			name: "matmul_nobias", inputs: []HostBuffer{randBuf(r, N*C, 1), randBuf(r, OC*C, 1)}, nout: N * OC,
			ref: func(in [][]float64) []float64 { return refMatmul(in[0], in[1], nil, N, C, OC) },
			bwd: func(d *CPU, in []HostBuffer, dout HostBuffer, g []HostBuffer) {
				d.MatmulBackward(g[0], g[1], nil, dout, in[0], in[1], N, C, OC)
			},
		})
	}
	for _, sh := range [][4]int{{2, 37, 16, 2}, {1, 48, 16, 2}} {
		// T = 37 spans two row blocks; T = 48 also takes the blocked softmax.
		B, T, C, NH := sh[0], sh[1], sh[2], sh[3]
		cases = append(cases, gradCase{
			name: fmt.Sprintf("attention_T%d", T), inputs: []HostBuffer{randBuf(r, B*T*3*C, 1)}, nout: B * T * C,
			ref: func(in [][]float64) []float64 { o, _, _ := refAttention(in[0], B, T, C, NH); return o },
			bwd: func(d *CPU, in []HostBuffer, dout HostBuffer, g []HostBuffer) {
				n := B * NH * T * T
				out, pre, att := make(HostBuffer, B*T*C), make(HostBuffer, n), make(HostBuffer, n)
				d.AttentionForward(out, pre, att, in[0], B, T, C, NH)
				dpre, datt := make(HostBuffer, n), make(HostBuffer, n)
				for i := range dpre {
					dpre[i], datt[i] = 5, 5 // scratch: stale values must not matter
				}
				d.AttentionBackward(g[0], dpre, datt, dout, in[0], att, B, T, C, NH)
			},
		})
	}
	for _, sh := range [][4]int{{2, 37, 16, 2}, {1, 9, 24, 3}} {
		B, T, C, NH := sh[0], sh[1], sh[2], sh[3]
		cases = append(cases, gradCase{
			name: fmt.Sprintf("flash_attention_T%d", T), inputs: []HostBuffer{randBuf(r, B*T*3*C, 1)}, nout: B * T * C,
			ref: func(in [][]float64) []float64 { o, _, _ := refAttention(in[0], B, T, C, NH); return o },
			bwd: func(d *CPU, in []HostBuffer, dout HostBuffer, g []HostBuffer) {
				out, lse, delta := make(HostBuffer, B*T*C), make(HostBuffer, B*NH*T), make(HostBuffer, B*NH*T)
				d.FlashAttentionForward(out, lse, in[0], B, T, C, NH)
				d.FlashAttentionBackward(g[0], delta, dout, out, in[0], lse, B, T, C, NH)
			},
		})
	}
	{
		n := 3000
		x := randBuf(r, n, 2.5)
		cases = append(cases, gradCase{
			name: "gelu", inputs: []HostBuffer{x}, nout: n,
			ref: func(in [][]float64) []float64 { return refGelu(in[0]) },
			bwd: func(d *CPU, in []HostBuffer, dout HostBuffer, g []HostBuffer) {
				d.GeluBackward(g[0], in[0], dout, n)
			},
		})
	}
	{
		n := 300
		cases = append(cases, gradCase{
			name: "residual", inputs: []HostBuffer{randBuf(r, n, 1), randBuf(r, n, 1)}, nout: n,
			ref: func(in [][]float64) []float64 { return refResidual(in[0], in[1]) },
			bwd: func(d *CPU, in []HostBuffer, dout HostBuffer, g []HostBuffer) {
				d.ResidualBackward(g[0], g[1], dout, n)
			},
		})
	}
	{
		N, V, Vp := 5, 30, 40
		tg := randIDs(r, N, V)
		cases = append(cases, gradCase{
			name: "softmax_xent", inputs: []HostBuffer{randBuf(r, N*Vp, 2)}, nout: N, dloss: 0.37,
			ref: func(in [][]float64) []float64 { l, _ := refSoftmaxCE(in[0], tg, N, V, Vp); return l },
			bwd: func(d *CPU, in []HostBuffer, dout HostBuffer, g []HostBuffer) {
				losses, probs := make(HostBuffer, N), make(HostBuffer, N*Vp)
				d.SoftmaxCrossEntropyForward(losses, probs, in[0], tg, N, V, Vp)
				d.SoftmaxCrossEntropyBackward(g[0], probs, tg, dout[0], N, V, Vp)
			},
		})
	}
	return cases
}

// numericGrad differentiates L = sum(ref(in) * R) by central differences.
func numericGrad(tc gradCase, R []float64) [][]float64 {
	in := make([][]float64, len(tc.inputs))
	for i, x := range tc.inputs {
		in[i] = to64(x)
	}
	loss := func() float64 {
		out := tc.ref(in)
		s := 0.0
		for i, o := range out {
			s += o * R[i]
		}
		return s
	}
	grads := make([][]float64, len(in))
	for k := range in {
		grads[k] = make([]float64, len(in[k]))
		for i := range in[k] {
			x := in[k][i]
			in[k][i] = x + fdStep
			lp := loss()
			in[k][i] = x - fdStep
			lm := loss()
			in[k][i] = x
			grads[k][i] = (lp - lm) / (2 * fdStep)
		}
	}
	return grads
}

func TestBackwardMatchesFiniteDifferences(t *testing.T) {
	type want struct {
		R     HostBuffer
		grads [][]float64
	}
	cases := gradCases(3)
	r := rand.New(rand.NewPCG(4, 4))
	numeric := make([]want, len(cases))
	for i, tc := range cases {
		R := randBuf(r, tc.nout, 1)
		if tc.dloss != 0 {
			for j := range R {
				R[j] = tc.dloss
			}
		}
		numeric[i] = want{R, numericGrad(tc, to64(R))}
	}
	forEachLayerISA(t, func(t *testing.T) {
		for _, threads := range []int{1, 2} {
			d := NewCPU(threads)
			for i, tc := range cases {
				t.Run(fmt.Sprintf("%s/threads=%d", tc.name, threads), func(t *testing.T) {
					grads := make([]HostBuffer, len(tc.inputs))
					for k, x := range tc.inputs {
						grads[k] = make(HostBuffer, len(x))
					}
					tc.bwd(d, tc.inputs, numeric[i].R, grads)
					once := make([]HostBuffer, len(grads))
					for k, g := range grads {
						once[k] = append(HostBuffer(nil), g...)
						num := numeric[i].grads[k]
						maxN, maxD := 0.0, 0.0
						for j := range num {
							maxN = math.Max(maxN, math.Abs(num[j]))
							maxD = math.Max(maxD, math.Abs(float64(g[j])-num[j]))
						}
						rel := maxD / math.Max(maxN, 1e-3)
						t.Logf("grad %d: relative error %.3g (tolerance %g)", k, rel, gradTol)
						if !(rel <= gradTol) {
							t.Errorf("grad %d: max|analytic-numeric| = %.3g, max|numeric| = %.3g, relative %.3g > %g",
								k, maxD, maxN, rel, gradTol)
						}
					}
					tc.bwd(d, tc.inputs, numeric[i].R, grads)
					for k, g := range grads {
						for j := range g {
							w := 2 * float64(once[k][j])
							if math.Abs(float64(g[j])-w) > accTol*(1+math.Abs(w)) {
								t.Fatalf("grad %d[%d]: two backward calls give %g, want 2 x %g (accumulate)",
									k, j, g[j], once[k][j])
							}
						}
					}
				})
			}
		}
	})
}

func TestAdamW(t *testing.T) {
	forEachLayerISA(t, func(t *testing.T) {
		d := NewCPU(2)
		// Step 1 by hand: m = 0.1 g, v = 0.001 g^2, mhat = g, vhat = g^2, so
		// p -= lr * (g/(|g|+eps) + wd p) = lr * (sign(g) + wd p) (eps tiny).
		p := HostBuffer{1, -2, 0.5, 0}
		g := HostBuffer{0.1, -0.2, 0.3, 0}
		m, v := make(HostBuffer, 4), make(HostBuffer, 4)
		d.AdamW(p, g, m, v, 0.01, 0.9, 0.999, 1e-8, 0.1, 1)
		wantP := []float64{1 - 0.01*(1+0.1), -2 - 0.01*(-1-0.2), 0.5 - 0.01*(1+0.05), 0}
		checkClose(t, "params step 1", p, wantP, 1e-6)
		checkClose(t, "m step 1", m, []float64{0.01, -0.02, 0.03, 0}, 1e-7)
		checkClose(t, "v step 1", v, []float64{1e-5, 4e-5, 9e-5, 0}, 1e-7)

		// Further steps against the float64 reference, long enough for
		// several chunks.
		r := rand.New(rand.NewPCG(5, 5))
		n := 50000
		p32, m32, v32 := randBuf(r, n, 1), make(HostBuffer, n), make(HostBuffer, n)
		p64, m64, v64 := to64(p32), make([]float64, n), make([]float64, n)
		for step := 1; step <= 3; step++ {
			g := randBuf(r, n, 0.1)
			d.AdamW(p32, g, m32, v32, 1e-3, 0.9, 0.95, 1e-8, 0.01, step)
			refAdamW(p64, to64(g), m64, v64, 1e-3, 0.9, 0.95, 1e-8, 0.01, step)
		}
		checkClose(t, "params step 3", p32, p64, 1e-6)
		checkClose(t, "m step 3", m32, m64, 1e-6)
		checkClose(t, "v step 3", v32, v64, 1e-6)
	})
}

func TestSumSquaresAndScale(t *testing.T) {
	forEachLayerISA(t, func(t *testing.T) {
		for _, n := range []int{0, 1, 17, 5000, 1 << 20, 3_000_001} {
			d := NewCPU(2)
			r := rand.New(rand.NewPCG(uint64(n), 6))
			b := randBuf(r, n, 1)
			want := 0.0
			for _, x := range b {
				want += float64(x) * float64(x)
			}
			if got := d.SumSquares(b); math.Abs(got-want) > 1e-12*math.Max(want, 1) {
				t.Errorf("n=%d: SumSquares = %.17g, want %.17g", n, got, want)
			}
			orig := append(HostBuffer(nil), b...)
			d.Scale(b, -0.75)
			for i := range b {
				if b[i] != orig[i]*-0.75 {
					t.Fatalf("n=%d: Scale [%d] = %g, want %g", n, i, b[i], orig[i]*-0.75)
				}
			}
		}
	})
}

// runAll runs every kernel forward and backward on fixed inputs and returns
// all outputs, for determinism checks.
func runAll(d *CPU) map[string][]float32 {
	r := rand.New(rand.NewPCG(7, 7))
	B, T, C, NH, V, Vp := 4, 64, 64, 4, 100, 128
	N := B * T
	res := map[string][]float32{}
	keep := func(name string, b HostBuffer) { res[name] = append([]float32(nil), b...) }

	tok := randIDs(r, N, V)
	wte, wpe := randBuf(r, V*C, 1), randBuf(r, T*C, 1)
	x := make(HostBuffer, N*C)
	d.EncoderForward(x, tok, wte, wpe, B, T, C)
	keep("encoder", x)
	dwte, dwpe := make(HostBuffer, V*C), make(HostBuffer, T*C)
	d.EncoderBackward(dwte, dwpe, randBuf(r, N*C, 1), tok, B, T, C)
	keep("dwte", dwte)
	keep("dwpe", dwpe)

	lw, lb := randBuf(r, C, 1), randBuf(r, C, 1)
	ln, mean, rstd := make(HostBuffer, N*C), make(HostBuffer, N), make(HostBuffer, N)
	d.LayerNormForward(ln, mean, rstd, x, lw, lb, N, C)
	keep("ln", ln)
	dx, dlw, dlb := make(HostBuffer, N*C), make(HostBuffer, C), make(HostBuffer, C)
	d.LayerNormBackward(dx, dlw, dlb, randBuf(r, N*C, 1), x, lw, mean, rstd, N, C)
	keep("ln_dx", dx)
	keep("ln_dw", dlw)
	keep("ln_db", dlb)

	w, bias := randBuf(r, 3*C*C, 0.1), randBuf(r, 3*C, 0.1)
	qkv := make(HostBuffer, N*3*C)
	d.MatmulForward(qkv, ln, w, bias, N, C, 3*C)
	keep("qkv", qkv)
	dln, dw, db := make(HostBuffer, N*C), make(HostBuffer, 3*C*C), make(HostBuffer, 3*C)
	d.MatmulBackward(dln, dw, db, randBuf(r, N*3*C, 1), ln, w, N, C, 3*C)
	keep("mm_dinp", dln)
	keep("mm_dw", dw)
	keep("mm_db", db)

	nA := B * NH * T * T
	att, pre, ao := make(HostBuffer, nA), make(HostBuffer, nA), make(HostBuffer, N*C)
	d.AttentionForward(ao, pre, att, qkv, B, T, C, NH)
	keep("att_out", ao)
	keep("att", att)
	dqkv := make(HostBuffer, N*3*C)
	d.AttentionBackward(dqkv, make(HostBuffer, nA), make(HostBuffer, nA), randBuf(r, N*C, 1), qkv, att, B, T, C, NH)
	keep("att_dinp", dqkv)
	lse, fo := make(HostBuffer, B*NH*T), make(HostBuffer, N*C)
	d.FlashAttentionForward(fo, lse, qkv, B, T, C, NH)
	keep("flash_out", fo)
	keep("flash_lse", lse)
	fdqkv := make(HostBuffer, N*3*C)
	d.FlashAttentionBackward(fdqkv, make(HostBuffer, B*NH*T), randBuf(r, N*C, 1), fo, qkv, lse, B, T, C, NH)
	keep("flash_dinp", fdqkv)

	g := make(HostBuffer, N*3*C)
	d.GeluForward(g, qkv, N*3*C)
	keep("gelu", g)
	dg := make(HostBuffer, N*3*C)
	d.GeluBackward(dg, qkv, randBuf(r, N*3*C, 1), N*3*C)
	keep("gelu_d", dg)

	logits := randBuf(r, N*Vp, 2)
	losses, probs := make(HostBuffer, N), make(HostBuffer, N*Vp)
	d.SoftmaxCrossEntropyForward(losses, probs, logits, tok, N, V, Vp)
	keep("losses", losses)
	dlogits := make(HostBuffer, N*Vp)
	d.SoftmaxCrossEntropyBackward(dlogits, probs, tok, 1/float32(N), N, V, Vp)
	keep("dlogits", dlogits)

	ss := d.SumSquares(dqkv)
	res["sumsq"] = []float32{float32(ss), float32(ss - float64(float32(ss)))}
	pm, pv := make(HostBuffer, len(dw)), make(HostBuffer, len(dw))
	d.AdamW(w, dw, pm, pv, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1)
	keep("adamw", w)
	return res
}

func TestDeterministic(t *testing.T) {
	forEachLayerISA(t, func(t *testing.T) {
		base := runAll(NewCPU(1))
		for _, threads := range []int{1, 2, 3} {
			got := runAll(NewCPU(threads))
			for name, want := range base {
				g := got[name]
				for i := range want {
					if math.Float32bits(g[i]) != math.Float32bits(want[i]) {
						t.Errorf("threads=%d: %s[%d] = %x, want %x (1 thread)", threads, name, i,
							math.Float32bits(g[i]), math.Float32bits(want[i]))
						break
					}
				}
			}
		}
	})
}

func TestShapeMismatchPanics(t *testing.T) {
	d := NewCPU(1)
	B, T, C, NH, V := 2, 4, 8, 2, 10
	N := B * T
	buf := func(n int) Buffer { return d.Alloc(n) }
	tok := make([]int32, N)
	nA := B * NH * T * T
	cases := []struct {
		op   string
		call func()
	}{
		{"EncoderForward", func() { d.EncoderForward(buf(N*C+1), tok, buf(V*C), buf(T*C), B, T, C) }},
		{"EncoderForward", func() { d.EncoderForward(buf(N*C), tok, buf(V*C), buf((T-1)*C), B, T, C) }},
		{"EncoderForward", func() { d.EncoderForward(buf(N*C), tok[1:], buf(V*C), buf(T*C), B, T, C) }},
		{"EncoderBackward", func() { d.EncoderBackward(buf(V*C+3), buf(T*C), buf(N*C), tok, B, T, C) }},
		{"LayerNormForward", func() { d.LayerNormForward(buf(N*C), buf(N), buf(N), buf(N*C), buf(C), buf(C-1), N, C) }},
		{"LayerNormBackward", func() {
			d.LayerNormBackward(buf(N*C), buf(C), buf(C), buf(N*C), buf(N*C), buf(C), buf(N+1), buf(N), N, C)
		}},
		{"MatmulForward", func() { d.MatmulForward(buf(N*3), buf(N*C), buf(3*C), buf(4), N, C, 3) }},
		{"MatmulForward", func() { d.MatmulForward(buf(N*3), buf(N*C), buf(3*C+1), nil, N, C, 3) }},
		{"MatmulBackward", func() { d.MatmulBackward(buf(N*C), buf(3*C), buf(2), buf(N*3), buf(N*C), buf(3*C), N, C, 3) }},
		{"AttentionForward", func() { d.AttentionForward(buf(N*C), buf(nA), buf(nA), buf(N*C), B, T, C, NH) }},
		{"AttentionForward", func() { d.AttentionForward(buf(N*C), buf(nA), buf(nA), buf(3*N*C), B, T, C, 3) }},
		{"AttentionBackward", func() {
			d.AttentionBackward(buf(3*N*C), buf(nA), buf(nA-1), buf(N*C), buf(3*N*C), buf(nA), B, T, C, NH)
		}},
		{"FlashAttentionForward", func() { d.FlashAttentionForward(buf(N*C), buf(B*NH*T+1), buf(3*N*C), B, T, C, NH) }},
		{"FlashAttentionBackward", func() {
			d.FlashAttentionBackward(buf(3*N*C), buf(B*NH*T), buf(N*C), buf(N*C), buf(N*C), buf(B*NH*T), B, T, C, NH)
		}},
		{"GeluForward", func() { d.GeluForward(buf(10), buf(9), 10) }},
		{"GeluBackward", func() { d.GeluBackward(buf(10), buf(10), buf(11), 10) }},
		{"ResidualForward", func() { d.ResidualForward(buf(10), buf(10), buf(9), 10) }},
		{"ResidualBackward", func() { d.ResidualBackward(buf(9), buf(10), buf(10), 10) }},
		{"SoftmaxCrossEntropyForward", func() {
			d.SoftmaxCrossEntropyForward(buf(N), buf(N*V), buf(N*V), tok, N, V+1, V)
		}},
		{"SoftmaxCrossEntropyBackward", func() { d.SoftmaxCrossEntropyBackward(buf(N*V), buf(N*V-1), tok, 1, N, V, V) }},
		{"AdamW", func() { d.AdamW(buf(5), buf(5), buf(4), buf(5), 1, 0.9, 0.9, 1e-8, 0, 1) }},
		{"CopyIn", func() { d.CopyIn(buf(5), make([]float32, 4)) }},
		{"CopyOut", func() { d.CopyOut(make([]float32, 4), buf(5)) }},
	}
	for i, tc := range cases {
		t.Run(fmt.Sprintf("%d_%s", i, tc.op), func(t *testing.T) {
			defer func() {
				r := recover()
				err, ok := r.(error)
				if !ok || !errors.Is(err, ErrShape) {
					t.Fatalf("recovered %v, want an error wrapping ErrShape", r)
				}
				if !strings.Contains(err.Error(), tc.op) {
					t.Errorf("message %q does not name %s", err, tc.op)
				}
			}()
			tc.call()
		})
	}
}

func TestOutOfRangeIDsPanic(t *testing.T) {
	d := NewCPU(1)
	for _, tc := range []struct {
		name string
		call func()
	}{
		{"token", func() { d.EncoderForward(d.Alloc(2*4), []int32{0, 3}, d.Alloc(3*4), d.Alloc(2*4), 1, 2, 4) }},
		{"negative token", func() { d.EncoderBackward(d.Alloc(3*4), d.Alloc(2*4), d.Alloc(2*4), []int32{-1, 0}, 1, 2, 4) }},
		{"target", func() { d.SoftmaxCrossEntropyForward(d.Alloc(1), d.Alloc(8), d.Alloc(8), []int32{6}, 1, 6, 8) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "out of range") {
					t.Fatalf("recovered %v, want an out of range panic", r)
				}
			}()
			tc.call()
		})
	}
}

func TestBuffersAndViews(t *testing.T) {
	d := NewCPU(0)
	if d.Threads() < 1 || !strings.HasPrefix(d.Name(), "cpu (") {
		t.Fatalf("NewCPU(0): threads %d, name %q", d.Threads(), d.Name())
	}
	b := d.Alloc(10)
	d.CopyIn(b, []float32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	v := b.Slice(2, 5)
	d.Scale(v, 10)
	out := make([]float32, 10)
	d.CopyOut(out, b)
	want := []float32{0, 1, 20, 30, 40, 50, 60, 7, 8, 9}
	for i := range want {
		if out[i] != want[i] {
			t.Fatalf("after scaling view [2,7): %v, want %v", out, want)
		}
	}
	d.Zero(v)
	if Host(b)[2] != 0 || Host(b)[7] != 7 || Host(nil) != nil {
		t.Fatalf("Zero of a view: %v", Host(b))
	}
}

func TestNoAllocations(t *testing.T) {
	d := NewCPU(2)
	B, T, C, NH := 2, 16, 32, 4
	N, nA := B*T, B*NH*T*T
	tok := make([]int32, N)
	x, w, bias := d.Alloc(N*3*C), d.Alloc(3*C*C), d.Alloc(3*C)
	out, ln := d.Alloc(N*C), d.Alloc(N*C)
	mean, rstd := d.Alloc(N), d.Alloc(N)
	pre, att := d.Alloc(nA), d.Alloc(nA)
	lse, delta := d.Alloc(B*NH*T), d.Alloc(B*NH*T)
	wpe, lw, lb := w.Slice(0, T*C), bias.Slice(0, C), bias.Slice(C, C) // views are made once
	allocs := testing.AllocsPerRun(20, func() {
		d.EncoderForward(out, tok, w, wpe, B, T, C)
		d.LayerNormForward(ln, mean, rstd, out, lw, lb, N, C)
		d.MatmulForward(x, ln, w, bias, N, C, 3*C)
		d.MatmulBackward(ln, w, nil, x, ln, w, N, C, 3*C)
		d.AttentionForward(out, pre, att, x, B, T, C, NH)
		d.AttentionBackward(x, pre, att, out, x, att, B, T, C, NH)
		d.FlashAttentionForward(out, lse, x, B, T, C, NH)
		d.FlashAttentionBackward(x, delta, out, out, x, lse, B, T, C, NH)
		d.GeluForward(x, x, N*3*C)
		d.SoftmaxCrossEntropyForward(mean, ln, out, tok, N, C, C)
		d.AdamW(w, w, w, w, 1e-3, 0.9, 0.95, 1e-8, 0, 1)
		_ = d.SumSquares(x)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per run, want 0", allocs)
	}
}
