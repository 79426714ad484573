package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// AdamWSegments gives, segment by segment, the bits of Scale then AdamW on
// that segment with its decay (the CPU backend's vectorized chunks, for
// several thread counts and segments that straddle its chunks, and the CPU
// build of the GPU source), and leaves the gradients as they are.
func TestAdamWSegments(t *testing.T) {
	for _, tc := range []struct {
		name string
		ends []int
	}{
		{"one", []int{1000}},
		{"tiny segments", []int{1, 2, 3, 7, 8, 100}},
		{"straddling chunks", []int{5000, 70000, 70001, 200003}},
		{"many", func() []int {
			var e []int
			for k := 1; k <= 150; k++ {
				e = append(e, k*k*7+k)
			}
			return e
		}()},
	} {
		n := tc.ends[len(tc.ends)-1]
		decay := make([]bool, len(tc.ends))
		for j := range decay {
			decay[j] = j%3 != 1
		}
		rng := rand.New(rand.NewPCG(uint64(n), 3))
		p0, g0, m0 := randomVec(rng, n, 1), randomVec(rng, n, 0.1), randomVec(rng, n, 0.01)
		v0 := randomVec(rng, n, 0.01)
		for i := range v0 {
			v0[i] = v0[i]*v0[i] + 1e-6
		}
		const lr, b1, b2, eps, wd, step = 3e-3, 0.9, 0.95, 1e-8, 0.1, 7
		for _, gscale := range []float32{1, 0.37} {
			// The reference: Scale, then AdamW on each segment.
			ref := NewCPU(1)
			in := func(d Device, x []float32) Buffer { b := d.Alloc(len(x)); d.CopyIn(b, x); return b }
			out := func(d Device, b Buffer) []float32 { x := make([]float32, b.Len()); d.CopyOut(x, b); return x }
			rp, rg, rm, rv := in(ref, p0), in(ref, g0), in(ref, m0), in(ref, v0)
			ref.Scale(rg, gscale)
			lo := 0
			for j, e := range tc.ends {
				w := float32(0)
				if decay[j] {
					w = wd
				}
				ref.AdamW(rp.Slice(lo, e-lo), rg.Slice(lo, e-lo), rm.Slice(lo, e-lo), rv.Slice(lo, e-lo), lr, b1, b2, eps, w, step)
				lo = e
			}
			want := [][]float32{out(ref, rp), out(ref, rm), out(ref, rv)}
			for _, threads := range []int{1, 2, 3} {
				d := NewCPU(threads)
				p, g, m, v := in(d, p0), in(d, g0), in(d, m0), in(d, v0)
				d.AdamWSegments(p, g, m, v, tc.ends, decay, gscale, lr, b1, b2, eps, wd, step)
				for k, got := range [][]float32{out(d, p), out(d, m), out(d, v)} {
					sameBits(t, fmt.Sprintf("%s gscale %v threads %d %s", tc.name, gscale, threads, "pmv"[k:k+1]), got, want[k])
				}
				sameBits(t, tc.name+" grads", out(d, g), g0)
			}
			// The GPU source's CPU build, against its own AdamW after its
			// own Scale, segment by segment (its arithmetic may differ from
			// the CPU backend's in the last bit: compared within rounding).
			seg := make([]int32, 2*len(tc.ends))
			for j, e := range tc.ends {
				seg[j] = int32(e)
				if decay[j] {
					seg[len(tc.ends)+j] = 1
				}
			}
			p, g, m, v := append([]float32(nil), p0...), append([]float32(nil), g0...), append([]float32(nil), m0...), append([]float32(nil), v0...)
			bc1 := float32(1 - math.Pow(b1, step))
			bc2 := float32(1 - math.Pow(b2, step))
			ewiseAdamWSegments(p, g, m, v, seg, gscale, lr, b1, b2, eps, wd, bc1, bc2)
			sameBits(t, tc.name+" ewise grads", g, g0)
			ep, eg, em, ev := append([]float32(nil), p0...), append([]float32(nil), g0...), append([]float32(nil), m0...), append([]float32(nil), v0...)
			ewiseScale(eg, gscale)
			lo = 0
			for j, e := range tc.ends {
				w := float32(0)
				if decay[j] {
					w = wd
				}
				ewiseAdamW(ep[lo:e], eg[lo:e], em[lo:e], ev[lo:e], lr, b1, b2, eps, w, bc1, bc2)
				lo = e
			}
			sameBits(t, tc.name+" ewise params", p, ep)
			sameBits(t, tc.name+" ewise m", m, em)
			sameBits(t, tc.name+" ewise v", v, ev)
			closeTo(t, tc.name+" ewise params vs the CPU backend", p, want[0], 1e-6)
		}
	}
}

// Segments that do not partition the buffers, or a flag short, are
// refused.
func TestAdamWSegmentsShapes(t *testing.T) {
	d := NewCPU(1)
	b := func() Buffer { return d.Alloc(10) }
	for _, tc := range []struct {
		name  string
		ends  []int
		decay []bool
		step  int
	}{
		{"short", []int{4, 9}, []bool{true, false}, 1},
		{"past", []int{4, 11}, []bool{true, false}, 1},
		{"not increasing", []int{4, 4, 10}, []bool{true, false, true}, 1},
		{"flags", []int{4, 10}, []bool{true}, 1},
		{"step 0", []int{10}, []bool{true}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if err, ok := r.(error); !(ok && errors.Is(err, ErrShape) || strings.Contains(fmt.Sprint(r), "step t")) {
					t.Fatalf("recovered %v, want an ErrShape or step panic", r)
				}
			}()
			d.AdamWSegments(b(), b(), b(), b(), tc.ends, tc.decay, 1, 1e-3, 0.9, 0.95, 1e-8, 0.1, tc.step)
		})
	}
}

// BenchmarkAdamWStep is an optimizer step over GPT-2 small's tensors (148
// of them, 124M parameters), clipped: Scale then one AdamW a tensor (as
// the optimizer ran it) against one AdamWSegments call, at the machine's
// threads:
//
//	go test ./kernels -run '^$' -bench AdamWStep -benchtime 5x
func BenchmarkAdamWStep(b *testing.B) {
	// GPT-2 small's layout: wte, wpe, then 12 blocks of 12 tensors, ln_f.
	const C, V, T, L = 768, 50304, 1024, 12
	sizes := []int{V * C, T * C}
	decays := []bool{true, true}
	for range L {
		for _, s := range []struct {
			n     int
			decay bool
		}{{C, false}, {C, false}, {3 * C * C, true}, {3 * C, false}, {C * C, true}, {C, false},
			{C, false}, {C, false}, {4 * C * C, true}, {4 * C, false}, {4 * C * C, true}, {C, false}} {
			sizes, decays = append(sizes, s.n), append(decays, s.decay)
		}
	}
	sizes, decays = append(sizes, C, C), append(decays, false, false)
	var ends []int
	n := 0
	for _, s := range sizes {
		n += s
		ends = append(ends, n)
	}
	d := NewCPU(0)
	r := rand.New(rand.NewPCG(1, 8))
	p, g, m, v := randBuf(r, n, 1), randBuf(r, n, 0.01), d.Alloc(n), d.Alloc(n)
	d.AdamWSegments(p, g, m, v, ends, decays, 1, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1) // the buffers' first touch
	b.Run("scale+per-tensor", func(b *testing.B) {
		for b.Loop() {
			d.Scale(g, 0.999)
			lo := 0
			for j, e := range ends {
				wd := float32(0)
				if decays[j] {
					wd = 0.1
				}
				d.AdamW(p.Slice(lo, e-lo), g.Slice(lo, e-lo), m.Slice(lo, e-lo), v.Slice(lo, e-lo), 1e-4, 0.9, 0.95, 1e-8, wd, 1)
				lo = e
			}
		}
	})
	b.Run("segments", func(b *testing.B) {
		for b.Loop() {
			d.AdamWSegments(p, g, m, v, ends, decays, 0.999, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1)
		}
	})
}
