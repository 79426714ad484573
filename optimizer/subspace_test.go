package optimizer

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func testSubspace() SubspaceConfig {
	// Dense 10, a 12x20 matrix, dense 7, a 30x9 matrix, dense 5.
	return SubspaceConfig{Rank: 3, Decay: 1, Seed: 7, Matrices: []Matrix{{Off: 10, Rows: 12, Cols: 20}, {Off: 257, Rows: 30, Cols: 9}}}
}

func TestSubspaceValidate(t *testing.T) {
	good := testSubspace()
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(c *SubspaceConfig){
		"rank 0":     func(c *SubspaceConfig) { c.Rank = 0 },
		"rank > dim": func(c *SubspaceConfig) { c.Rank = 10 },
		"decay 0":    func(c *SubspaceConfig) { c.Decay = 0 },
		"decay > 1":  func(c *SubspaceConfig) { c.Decay = 1.5 },
		"overlap":    func(c *SubspaceConfig) { c.Matrices[1].Off = 200 },
		"no rows":    func(c *SubspaceConfig) { c.Matrices[0].Rows = 0 },
	} {
		c := testSubspace()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := good.checkLen(527); err != nil {
		t.Fatal(err)
	}
	if err := good.checkLen(532); err != nil {
		t.Fatal(err)
	}
	if err := good.checkLen(526); err == nil {
		t.Fatal("a matrix past the end accepted")
	}
}

func orthonormal(t *testing.T, b []float32, r, l int) {
	t.Helper()
	for i := 0; i < r; i++ {
		for k := 0; k <= i; k++ {
			var s float64
			for e := 0; e < l; e++ {
				s += float64(b[i*l+e]) * float64(b[k*l+e])
			}
			want := 0.0
			if i == k {
				want = 1
			}
			if math.Abs(s-want) > 1e-5 {
				t.Fatalf("basis vectors %d,%d: dot %v, want %v", i, k, s, want)
			}
		}
	}
}

// The projection is orthogonal: what a basis spans comes back exactly, the
// rest is orthogonal to it, and the bases stay orthonormal as they follow
// the aggregate, even when it vanishes.
func TestSubspaceProjection(t *testing.T) {
	c := testSubspace()
	const n = 532
	s := newSubspace(c)
	r := rand.New(rand.NewPCG(1, 2))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	cx := make([]float32, c.Len(n))
	back := make([]float32, n)
	for round := uint64(0); round < 6; round++ {
		for j, m := range c.Matrices {
			l := m.Cols
			if !sideR(j, round) {
				l = m.Rows
			}
			orthonormal(t, s.basis[j], c.Rank, l)
		}
		if got := c.roundLen(n, round); got > len(cx) || got < n-12*20-30*9 {
			t.Fatalf("round %d: length %d of %d", round, got, len(cx))
		}
		s.project(cx, x, round)
		s.expand(back, cx, round)
		// Dense coordinates come back as they are.
		for _, i := range []int{0, 9, 250, 256, 527, 531} {
			if back[i] != x[i] {
				t.Fatalf("round %d: dense coordinate %d: %v, want %v", round, i, back[i], x[i])
			}
		}
		// The projection of the projection is itself; the residual projects to 0.
		res := make([]float32, n)
		for i := range x {
			res[i] = x[i] - back[i]
		}
		cr := make([]float32, len(cx))
		s.project(cr, res, round)
		for i, v := range cr {
			if math.Abs(float64(v)) > 1e-4 {
				t.Fatalf("round %d: residual has coordinate %d = %v in the basis", round, i, v)
			}
		}
		if round == 3 {
			clear(cx) // a vanished aggregate: the next bases are random
		}
		s.advance(cx, round)
	}
}

// Error feedback over the subspace telescopes like the support's: with
// outer SGD, what phi moved plus the residual is every round's sum.
func TestDiLoCoSubspaceTelescopes(t *testing.T) {
	cfg := DefaultDiLoCo()
	s := testSubspace()
	cfg.Subspace = &s
	checkTelescopes(t, cfg, 532, 30)
}

// Two members that see the same aggregates hold the same bases, bit for bit.
func TestSubspaceDeterministic(t *testing.T) {
	c := testSubspace()
	a, b := newSubspace(c), newSubspace(c)
	r := rand.New(rand.NewPCG(5, 6))
	agg := make([]float32, c.Len(532))
	for round := uint64(0); round < 5; round++ {
		for i := range agg {
			agg[i] = float32(r.NormFloat64())
		}
		a.advance(agg, round)
		b.advance(slices.Clone(agg), round)
	}
	for j := range a.basis {
		if !slices.Equal(a.basis[j], b.basis[j]) {
			t.Fatalf("matrix %d: bases differ", j)
		}
	}
	c.Seed++
	if d := newSubspace(c); slices.Equal(d.basis[0], newSubspace(testSubspace()).basis[0]) {
		t.Fatal("the seed does not key the first bases")
	}
}

// At full rank the subspace sends everything: DiLoCo steps as without it.
func TestDiLoCoSubspaceFullRank(t *testing.T) {
	const n = 532
	full := SubspaceConfig{Rank: 9, Decay: 1, Seed: 7, Matrices: []Matrix{{Off: 10, Rows: 9, Cols: 9}, {Off: 257, Rows: 9, Cols: 9}}}
	cfg := DefaultDiLoCo()
	plain, err := NewDiLoCo(cfg, alone{}, make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Subspace = &full
	sub, err := NewDiLoCo(cfg, alone{}, make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	a, b := make([]float32, n), make([]float32, n)
	for range 10 {
		for i := range a {
			delta := float32(r.NormFloat64() * 0.01)
			a[i], b[i] = plain.Phi[i]-delta, sub.Phi[i]-delta
		}
		if _, err := plain.OuterStep(context.Background(), a); err != nil {
			t.Fatal(err)
		}
		if _, err := sub.OuterStep(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	for i := range plain.Phi {
		if math.Abs(float64(plain.Phi[i]-sub.Phi[i])) > 1e-5 {
			t.Fatalf("phi[%d]: %v with the subspace, %v without", i, sub.Phi[i], plain.Phi[i])
		}
	}
}
