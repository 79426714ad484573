package optimizer

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// fwhtTextbook is the Walsh-Hadamard transform one stage at a time.
func fwhtTextbook(a []float32) {
	for h := 1; h < len(a); h *= 2 {
		for i := 0; i < len(a); i += 2 * h {
			for j := i; j < i+h; j++ {
				x, y := a[j], a[j+h]
				a[j], a[j+h] = x+y, x-y
			}
		}
	}
}

// fwht's two stages a pass give the textbook's bits, at every power of
// two (an odd exponent ends with a single stage).
func TestFWHTMatchesTextbook(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 8192; n *= 2 {
		a := make([]float32, n)
		for i := range a {
			a[i] = float32(r.NormFloat64())
		}
		b, g := append([]float32(nil), a...), append([]float32(nil), a...)
		fwht(a)
		fwhtTextbook(b)
		fwhtGeneric(g)
		for i := range a {
			if math.Float32bits(a[i]) != math.Float32bits(b[i]) || math.Float32bits(g[i]) != math.Float32bits(b[i]) {
				t.Fatalf("n %d (asm %v): [%d] %v, in Go %v, textbook %v", n, hasFWHTAsm, i, a[i], g[i], b[i])
			}
		}
	}
}

// The rotation is orthonormal: it keeps every chunk's norm, its inverse
// undoes it, it leaves a partial last chunk alone, and it does move
// values (a spike spreads over the whole chunk).
func TestRotation(t *testing.T) {
	for _, chunk := range []int{2, 8, 512, 4096} {
		rot := newRotation(chunk)
		n := 3*chunk + chunk/2
		r := rand.New(rand.NewPCG(3, uint64(chunk)))
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64() * math.Exp(r.NormFloat64())) // heavy-tailed
		}
		y := append([]float32(nil), x...)
		rot.forward(y)
		for lo := 0; lo+chunk <= n; lo += chunk {
			nx, ny := norm2(x[lo:lo+chunk]), norm2(y[lo:lo+chunk])
			if math.Abs(nx-ny) > 1e-5*nx {
				t.Fatalf("chunk %d at %d: norm %v rotated to %v", chunk, lo, nx, ny)
			}
		}
		for i := n / chunk * chunk; i < n; i++ {
			if x[i] != y[i] {
				t.Fatalf("chunk %d: the partial last chunk moved at %d", chunk, i)
			}
		}
		rot.inverse(y)
		for i := range x {
			if math.Abs(float64(x[i]-y[i])) > 1e-5*(1+math.Abs(float64(x[i]))) {
				t.Fatalf("chunk %d: [%d] %v came back as %v", chunk, i, x[i], y[i])
			}
		}
		spike := make([]float32, chunk)
		spike[chunk/3] = 1
		rot.forward(spike)
		want := 1 / math.Sqrt(float64(chunk))
		for i, v := range spike {
			if math.Abs(math.Abs(float64(v))-want) > 1e-6 {
				t.Fatalf("chunk %d: a spike rotates to %v at %d, want +-%v everywhere", chunk, v, i, want)
			}
		}
	}
}

// BenchmarkFWHT4096 is one chunk's transform, the unit of a rotated
// support's work (two a round per chunk).
func BenchmarkFWHT4096(b *testing.B) {
	a := make([]float32, 4096)
	for i := range a {
		a[i] = float32(i%7) - 3
	}
	for _, impl := range []struct {
		name string
		f    func([]float32)
	}{{"dispatch", fwht}, {"go", fwhtGeneric}} {
		b.Run(impl.name, func(b *testing.B) {
			b.SetBytes(4 * int64(len(a)))
			for range b.N {
				impl.f(a)
			}
		})
	}
}

func norm2(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}

// With a rotated support, error feedback still telescopes, in the
// rotated basis: what phi moved plus the residual rotated back is the sum
// of every round's pseudo-gradient (outer SGD, lr 1, decay 1).
func TestDiLoCoRotatedSupportTelescopes(t *testing.T) {
	const n, chunk = 3000, 256 // a short last chunk stays in the plain basis
	s := SupportConfig{Chunk: chunk, K: 40, Decay: 1, Rotate: true}
	cfg := DefaultDiLoCo()
	cfg.Support = &s
	d := checkTelescopes(t, cfg, n, 30)
	for i := range n / chunk * chunk {
		if d.Phi[i] != 0 {
			return
		}
	}
	t.Fatal("phi never moved")
}

// A rotated support with the outer momentum and no residual (decay 0):
// every round moves every coordinate of a whole chunk (the average rotated
// back is dense), by exactly NesterovStep of that average, and keeps
// nothing for later.
func TestDiLoCoRotatedSupportMomentum(t *testing.T) {
	const n, chunk = 1100, 128
	cfg := DefaultDiLoCo()
	cfg.OuterLR, cfg.Momentum, cfg.NormGrowth = 1.5, 0.9, 0
	s := SupportConfig{Chunk: chunk, K: 48, Decay: 0, Rotate: true}
	cfg.Support = &s
	r := rand.New(rand.NewPCG(9, 10))
	phi0 := make([]float32, n)
	for i := range phi0 {
		phi0[i] = float32(r.NormFloat64())
	}
	d, err := NewDiLoCo(cfg, alone{}, phi0)
	if err != nil {
		t.Fatal(err)
	}
	rot := newRotation(chunk)
	theta := make([]float32, n)
	for round := range 4 {
		delta := make([]float32, n)
		for i := range theta {
			theta[i] = d.Phi[i] - float32(r.NormFloat64()*0.01)
			delta[i] = d.Phi[i] - theta[i] // as OuterStep computes it
		}
		phi, mom := append([]float32(nil), d.Phi...), append([]float32(nil), d.Mom...)
		if _, err := d.OuterStep(context.Background(), theta); err != nil {
			t.Fatal(err)
		}
		// The average: the rotated delta at the support, zero elsewhere,
		// rotated back.
		rd := append([]float32(nil), delta...)
		rot.forward(rd)
		avg := make([]float32, n)
		for _, p := range d.sup {
			avg[p] = rd[p]
		}
		rot.inverse(avg)
		NesterovStep(phi, mom, avg, float32(cfg.OuterLR), float32(cfg.Momentum))
		for i := range phi {
			if math.Float32bits(phi[i]) != math.Float32bits(d.Phi[i]) {
				t.Fatalf("round %d: [%d] phi %v, NesterovStep of the rotated-back average gives %v", round, i, d.Phi[i], phi[i])
			}
			if i < n/chunk*chunk && phi[i] == phi0[i] {
				t.Fatalf("round %d: [%d] did not move", round, i)
			}
		}
		copy(phi0, d.Phi)
	}
	for i, v := range d.resid {
		if v != 0 {
			t.Fatalf("decay 0 kept %v at %d", v, i)
		}
	}
}

func TestRotatedSupportConfig(t *testing.T) {
	for name, tc := range map[string]struct {
		s  SupportConfig
		ok bool
	}{
		"rotated":             {SupportConfig{Chunk: 4096, K: 1536, Decay: 0, Rotate: true}, true},
		"decay 0, plain":      {SupportConfig{Chunk: 4096, K: 1536, Decay: 0}, true},
		"decay below 0":       {SupportConfig{Chunk: 4096, K: 1536, Decay: -0.1}, false},
		"chunk not 2^k":       {SupportConfig{Chunk: 3000, K: 1536, Rotate: true}, false},
		"rotated, momentum's": {SupportConfig{Chunk: 4096, K: 1536, FromMomentum: 8, Rotate: true}, false},
		"rotated, nominated":  {SupportConfig{Chunk: 4096, K: 1536, Nominate: 8, Rotate: true}, false},
	} {
		err := tc.s.Validate()
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrConfig)) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestRotatedSupportFusedMatchesPasses checks the plain round's fused
// passes (prepareRotated, a chunk at a time) against the delayed
// variant's, which computes delta over the whole model, copies and
// rotates it: one round of each from the same state and local weights
// must send the same contribution and end at the same phi and momentum,
// bit for bit, with and without a last partial chunk, tiled (the plain
// round reads its draws, the delayed one every position) or not.
func TestRotatedSupportFusedMatchesPasses(t *testing.T) {
	for _, tc := range []struct {
		n     int
		tiled bool
	}{{1024, false}, {1100, false}, {1024, true}, {1100, true}, {100, true}} {
		n := tc.n
		cfg := DefaultDiLoCo()
		cfg.OuterLR, cfg.Momentum, cfg.NormGrowth = 1.5, 0.9, 0
		cfg.Support = &SupportConfig{Chunk: 128, K: 48, Decay: 0, Rotate: true, Tiled: tc.tiled}
		r := rand.New(rand.NewPCG(11, uint64(n)))
		phi0, theta := make([]float32, n), make([]float32, n)
		for i := range phi0 {
			phi0[i] = float32(r.NormFloat64())
			theta[i] = phi0[i] - float32(r.NormFloat64()*0.01)
		}
		plain, err := NewDiLoCo(cfg, alone{}, phi0)
		if err != nil {
			t.Fatal(err)
		}
		delayed, err := NewDiLoCo(cfg, alone{}, phi0)
		if err != nil {
			t.Fatal(err)
		}
		th := append([]float32(nil), theta...)
		if _, err := plain.OuterStep(context.Background(), th); err != nil {
			t.Fatal(err)
		}
		th = append([]float32(nil), theta...)
		if _, err := delayed.OuterStepDelayed(context.Background(), th); err != nil {
			t.Fatal(err)
		}
		if _, err := delayed.Flush(th); err != nil {
			t.Fatal(err)
		}
		for name, pair := range map[string][2][]float32{
			"contribution": {plain.cdelta, delayed.cdelta},
			"phi":          {plain.Phi, delayed.Phi},
			"momentum":     {plain.Mom, delayed.Mom},
		} {
			for i := range pair[0] {
				if math.Float32bits(pair[0][i]) != math.Float32bits(pair[1][i]) {
					t.Fatalf("n %d, tiled %v: %s[%d]: fused %v, passes %v", n, tc.tiled, name, i, pair[0][i], pair[1][i])
				}
			}
		}
		if plain.Phi[0] == phi0[0] {
			t.Fatalf("n %d: phi did not move", n)
		}
	}
}
