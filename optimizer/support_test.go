package optimizer

import (
	"cmp"
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/skein-ml/skein/transport"
)

// The support is a pure function of (momentum, round): sorted within each
// chunk, K per chunk, the largest |momentum| among them, and a different
// random part each round.
func TestSupport(t *testing.T) {
	c := SupportConfig{Chunk: 100, K: 10, FromMomentum: 4, Decay: 1}
	r := rand.New(rand.NewPCG(1, 2))
	mom := make([]float32, 1050)
	for i := range mom {
		mom[i] = float32(r.NormFloat64())
	}
	s := c.Support(nil, mom, 7)
	if len(s) != c.SupportLen(len(mom)) || len(s) != 10*10+10 {
		t.Fatalf("support of %d, want %d", len(s), c.SupportLen(len(mom)))
	}
	if !slices.Equal(s, c.Support(nil, mom, 7)) {
		t.Fatal("not deterministic")
	}
	if slices.Equal(s, c.Support(nil, mom, 8)) {
		t.Fatal("the same support in two rounds")
	}
	for base := 0; base < len(mom); base += 100 {
		var in []int32
		for _, p := range s {
			if int(p) >= base && int(p) < base+100 {
				in = append(in, p)
			}
		}
		if len(in) != min(10, len(mom)-base) || !slices.IsSorted(in) || len(slices.Compact(slices.Clone(in))) != len(in) {
			t.Fatalf("chunk %d: %v", base, in)
		}
		// The 4 largest |momentum| of the chunk are in.
		idx := make([]int, min(100, len(mom)-base))
		for i := range idx {
			idx[i] = base + i
		}
		slices.SortFunc(idx, func(a, b int) int {
			return -cmpF(math.Abs(float64(mom[a])), math.Abs(float64(mom[b])))
		})
		for _, i := range idx[:min(4, len(idx))] {
			if !slices.Contains(in, int32(i)) {
				t.Fatalf("chunk %d: the top |momentum| %d is not in the support", base, i)
			}
		}
	}
	// Zero momentum (a run's start): all random, still K per chunk.
	if z := c.Support(nil, make([]float32, 300), 1); len(z) != 30 {
		t.Fatalf("zero momentum: %d", len(z))
	}
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// alone is a collective of one member: the mean is its contribution.
type alone struct{}

func (alone) Self() transport.PeerID { return "me" }
func (alone) AllReduceMean(_ context.Context, round uint64, x, out []float32) (RoundStats, error) {
	copy(out, x)
	return RoundStats{Round: round}, nil
}

// Error feedback over the support telescopes: with outer SGD (lr 1, no
// momentum) phi moves by exactly what was sent, and what was sent plus the
// residual is the sum of every round's pseudo-gradient.
func TestDiLoCoSupportTelescopes(t *testing.T) {
	const n = 5000
	cfg := DefaultDiLoCo()
	s := SupportConfig{Chunk: 512, K: 16, FromMomentum: 8, Decay: 1}
	cfg.Support = &s
	d := checkTelescopes(t, cfg, n, 40)
	if d.Round != 40 || len(d.cavg) != s.SupportLen(n) {
		t.Fatalf("round %d, compacted %d", d.Round, len(d.cavg))
	}
}

// checkTelescopes runs rounds of random pseudo-gradients through a DiLoCo
// of cfg with outer SGD (lr 1, no momentum) alone, and checks that what phi
// moved plus the residual is their sum, and that the residual is not empty.
func checkTelescopes(t *testing.T, cfg DiLoCoConfig, n, rounds int) *DiLoCo {
	t.Helper()
	cfg.OuterLR, cfg.Momentum, cfg.NormGrowth = 1, 0, 0
	phi0 := make([]float32, n)
	d, err := NewDiLoCo(cfg, alone{}, phi0)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	sum := make([]float64, n)
	theta := make([]float32, n)
	for range rounds {
		for i := range theta {
			delta := float32(r.NormFloat64() * 0.01)
			sum[i] += float64(delta)
			theta[i] = d.Phi[i] - delta
		}
		if _, err := d.OuterStep(context.Background(), theta); err != nil {
			t.Fatal(err)
		}
	}
	res := d.resid
	if d.rot != nil { // a rotated support's residual, back in the plain basis
		res = slices.Clone(res)
		d.rot.inverse(res)
	}
	var worst, resid float64
	for i := range n {
		sent := float64(phi0[i]) - float64(d.Phi[i])
		worst = max(worst, math.Abs(sent+float64(res[i])-sum[i]))
		resid = max(resid, math.Abs(float64(res[i])))
	}
	if worst > 1e-4 {
		t.Fatalf("sent + residual differs from the pseudo-gradients' sum by %v", worst)
	}
	if resid == 0 {
		t.Fatal("nothing left in the residual: the test sends everything")
	}
	return d
}

// Nominations are each chunk's largest magnitudes; a support takes the
// nominated positions first (at most K a chunk), then tops up as before.
func TestSupportNominations(t *testing.T) {
	c := SupportConfig{Chunk: 100, K: 10, FromMomentum: 4, Decay: 1, Nominate: 3}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 250)
	for i := range x {
		x[i] = float32(i%7) * 0.01
	}
	x[5], x[60], x[99], x[150], x[249] = -9, 8, 7, 6, float32(math.Inf(1))
	got := c.Nominations(nil, x, 3)
	// Chunk 0: 5, 60, 99; chunk 1: 150 and two of the 0.06s (the lowest
	// positions between equals); chunk 2 (50 long): the infinity is not a
	// magnitude, so three 0.06s.
	if len(got) != 9 || !slices.Equal(got[:3], []int32{5, 60, 99}) || !slices.Contains(got[3:6], 150) || slices.Contains(got, 249) {
		t.Fatalf("nominations %v", got)
	}
	mom := make([]float32, 250)
	mom[7], mom[8] = 1, -2
	s := c.SupportWith(nil, mom, 3, []int32{5, 60, 99, 150, 151, 152, 153, 154, 155, 156, 157, 158, 159, 160, 161})
	if len(s) != c.SupportLen(250) {
		t.Fatalf("support of %d, want %d", len(s), c.SupportLen(250))
	}
	for _, p := range []int32{5, 60, 99, 7, 8, 150, 159} {
		if !slices.Contains(s, p) {
			t.Errorf("support %v lacks %d", s, p)
		}
	}
	if slices.Contains(s, 160) || slices.Contains(s, 161) {
		t.Errorf("support %v takes more than K nominations of a chunk", s)
	}
	if !slices.IsSorted(s) {
		t.Errorf("support %v not sorted", s)
	}
	dc := DefaultDiLoCo()
	dc.Support = &c
	if err := dc.Validate(); err == nil {
		t.Error("nominations without a Nominator accepted")
	}
	if dc.Nominator = (selfNominator{}); dc.Validate() != nil {
		t.Errorf("nominations with a Nominator refused: %v", dc.Validate())
	}
	if c.Nominate = 11; c.Validate() == nil {
		t.Error("more nominations than K accepted")
	}
}

// The outer step over a support works only the support when there is no
// momentum (everything else keeps its bits), and gives the same bits as
// NesterovStep over the scattered average, with and without momentum.
func TestDiLoCoSupportApplyBits(t *testing.T) {
	const n = 3000 // a short last chunk
	for _, tc := range []struct {
		mu float64
		s  SupportConfig
	}{
		{0, SupportConfig{Chunk: 256, K: 8, FromMomentum: 4, Decay: 0.95}},
		{0.9, SupportConfig{Chunk: 256, K: 8, FromMomentum: 4, Decay: 0.95}},
		{0, SupportConfig{Chunk: 256, K: 96, Decay: 0.5}}, // dense: applyDenseSupport
		{0, SupportConfig{Chunk: 256, K: 96, Decay: 1}},
	} {
		mu, s := tc.mu, tc.s
		cfg := DefaultDiLoCo()
		cfg.OuterLR, cfg.Momentum, cfg.NormGrowth = 0.7, mu, 0
		cfg.Support = &s
		phi0 := make([]float32, n)
		r := rand.New(rand.NewPCG(7, 8))
		for i := range phi0 {
			phi0[i] = float32(r.NormFloat64())
		}
		phi0[5] = float32(math.Copysign(0, -1)) // a -0 off the support keeps its sign
		d, err := NewDiLoCo(cfg, alone{}, phi0)
		if err != nil {
			t.Fatal(err)
		}
		theta := make([]float32, n)
		for round := range 6 {
			for i := range theta {
				theta[i] = d.Phi[i] - float32(r.NormFloat64()*0.01)
			}
			phi, mom, resid := slices.Clone(d.Phi), slices.Clone(d.Mom), slices.Clone(d.resid)
			phi0, theta0 := slices.Clone(d.Phi), slices.Clone(theta) // OuterStep sets theta to phi
			if _, err := d.OuterStep(context.Background(), theta); err != nil {
				t.Fatal(err)
			}
			avg := make([]float32, n)
			for j, p := range d.sup {
				avg[p] = d.cavg[j]
			}
			NesterovStep(phi, mom, avg, float32(cfg.OuterLR), float32(mu))
			// The residual: decayed, plus this round's delta, less what
			// was sent (all of it: this collective reports no rounding).
			for i := range resid {
				delta := phi0[i] - theta0[i]
				if s.Decay == 1 {
					resid[i] += delta
				} else {
					resid[i] = float32(s.Decay*resid[i]) + delta
				}
			}
			for _, p := range d.sup {
				resid[p] = 0
			}
			for i := range phi {
				if math.Float32bits(phi[i]) != math.Float32bits(d.Phi[i]) || math.Float32bits(mom[i]) != math.Float32bits(d.Mom[i]) ||
					math.Float32bits(resid[i]) != math.Float32bits(d.resid[i]) {
					t.Fatalf("%+v mu %v round %d: [%d] phi %v mom %v resid %v, NesterovStep gives %v %v %v",
						s, mu, round, i, d.Phi[i], d.Mom[i], d.resid[i], phi[i], mom[i], resid[i])
				}
			}
		}
	}
}

// Block nominations take each chunk's blocks of the largest sums of
// squares, whole and in increasing order (a short last block included),
// and a block size must divide the chunk and the nominations.
func TestSupportBlockNominations(t *testing.T) {
	c := SupportConfig{Chunk: 16, K: 8, Decay: 1, Nominate: 8, NominateBlock: 4}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 38) // chunks of 16, 16 and 6 (blocks of 4 and 2)
	for i := range x {
		x[i] = 0.01
	}
	x[1], x[14] = 5, -4                     // chunk 0: blocks 0 and 3
	x[16], x[17], x[18], x[19] = 1, 1, 1, 1 // chunk 1: block 0 (sum 4) beats block 2's single 1.9 (3.61)
	x[24] = 1.9
	x[37] = float32(math.Inf(1)) // chunk 2: the short block is not finite
	got := c.Nominations(nil, x, c.Nominate)
	want := []int32{0, 1, 2, 3, 12, 13, 14, 15, 16, 17, 18, 19, 24, 25, 26, 27, 32, 33, 34, 35}
	if !slices.Equal(got, want) {
		t.Fatalf("block nominations\n got %v\nwant %v", got, want)
	}
	for _, bad := range []SupportConfig{
		{Chunk: 16, K: 8, Decay: 1, Nominate: 8, NominateBlock: 3},
		{Chunk: 16, K: 8, Decay: 1, Nominate: 6, NominateBlock: 4},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// A cycling support sends every coordinate of a whole chunk exactly once
// in Chunk/K rounds; a short last chunk is topped up by the hash; K must
// divide the chunk.
func TestSupportCycle(t *testing.T) {
	c := SupportConfig{Chunk: 16, K: 4, Decay: 1, Cycle: true}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	mom := make([]float32, 40) // chunks of 16, 16 and 8
	seen := make([]int, 40)
	for r := range uint64(4) {
		s := c.Support(nil, mom, 10+r)
		if len(s) != c.SupportLen(40) || !slices.IsSorted(s) {
			t.Fatalf("round %d: support %v", r, s)
		}
		for _, p := range s {
			seen[p]++
		}
	}
	for p, k := range seen[:32] {
		if k != 1 {
			t.Fatalf("position %d sent %d times in 4 rounds, want once", p, k)
		}
	}
	if c.K = 5; c.Validate() == nil {
		t.Error("a cycle with K not dividing the chunk accepted")
	}
}

// The hash's part of a support is the set the keyed draws give, skipping
// repeats, whatever keeps the taken set: a sorted slice (as first built)
// and the bitmap pick the same coordinates, so runs keep their supports.
func TestSupportHashDraws(t *testing.T) {
	for _, c := range []SupportConfig{
		{Chunk: 4096, K: 64, Decay: 1},
		{Chunk: 4096, K: 1792, Decay: 1},
		{Chunk: 4096, K: 1536, Decay: 1},
		{Chunk: 1000, K: 600, Decay: 1}, // not a power of two
		{Chunk: 512, K: 16, FromMomentum: 8, Decay: 1},
	} {
		mom := randomVec(10_000, 3, 1)
		for round := range uint64(3) {
			got := c.Support(nil, mom, round)
			var want []int32
			for base := 0; base < len(mom); base += c.Chunk {
				m := min(c.Chunk, len(mom)-base)
				k := min(c.K, m)
				chosen := refMomentumPart(c, mom[base:base+m], k)
				for t := uint64(0); len(chosen) < k; t++ {
					p := int32(splitmix(round*0x9E3779B97F4A7C15^uint64(base)*0xBF58476D1CE4E5B9^t) % uint64(m))
					if i, found := slices.BinarySearch(chosen, p); !found {
						chosen = slices.Insert(chosen, i, p)
					}
				}
				for _, p := range chosen {
					want = append(want, int32(base)+p)
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%+v round %d: the support differs from the sorted-slice draws", c, round)
			}
		}
	}
}

// A tiled support is the first chunk's draw (the draw an untiled support
// makes for that chunk) in every whole chunk, shifted cyclically by an
// offset of its own, and a last, partial chunk's own draw; over rounds,
// every position of every chunk is drawn at about K/Chunk.
func TestSupportTiled(t *testing.T) {
	const chunk, k = 64, 24
	c := SupportConfig{Chunk: chunk, K: k, Rotate: true, Tiled: true}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	plain := c
	plain.Tiled = false
	mom := make([]float32, chunk*5+40) // five whole chunks and a tail of 40
	counts := make([]int, len(mom))
	const rounds = 400
	shifted := 0 // chunks whose offset is not 0
	for round := range uint64(rounds) {
		got, own := c.Support(nil, mom, round), plain.Support(nil, mom, round)
		if len(got) != c.SupportLen(len(mom)) || !slices.IsSorted(got) {
			t.Fatalf("round %d: %d positions (want %d), sorted %v", round, len(got), c.SupportLen(len(mom)), slices.IsSorted(got))
		}
		first := got[:k]
		if !slices.Equal(first, own[:k]) {
			t.Fatalf("round %d: the first chunk's draw %v, untiled %v", round, first, own[:k])
		}
		for ch := 1; ch < 5; ch++ {
			part := got[ch*k : (ch+1)*k]
			found := -1
			for o := range chunk {
				var want []int32
				for _, p := range first {
					want = append(want, int32(ch*chunk)+(p+int32(o))%chunk)
				}
				slices.Sort(want)
				if slices.Equal(part, want) {
					found = o
					break
				}
			}
			if found < 0 {
				t.Fatalf("round %d chunk %d: %v is no cyclic shift of %v", round, ch, part, first)
			}
			if found > 0 {
				shifted++
			}
		}
		if tail := got[5*k:]; !slices.Equal(tail, own[5*k:]) {
			t.Fatalf("round %d: the partial chunk's draw %v, want its own %v", round, tail, own[5*k:])
		}
		for _, p := range got {
			counts[p]++
		}
	}
	if shifted < rounds*4*9/10 {
		t.Errorf("%d of %d chunks shifted, want nearly all", shifted, rounds*4)
	}
	// Each position's count is Binomial(400, 24/64): mean 150, sd 9.7.
	for p, n := range counts[:5*chunk] {
		if n < 100 || n > 200 {
			t.Errorf("position %d in %d of %d rounds, want about %d", p, n, rounds, rounds*k/chunk)
		}
	}
	for _, bad := range []SupportConfig{
		{Chunk: 64, K: 24, FromMomentum: 4, Tiled: true},
		{Chunk: 64, K: 16, Cycle: true, Tiled: true},
		{Chunk: 64, K: 24, Nominate: 4, Tiled: true},
	} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// refMomentumPart is the chunk's FromMomentum largest |momentum| (the
// lower index between equals), sorted.
func refMomentumPart(c SupportConfig, mom []float32, k int) []int32 {
	f := min(c.FromMomentum, k)
	idx := make([]int32, len(mom))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(a, b int32) int { return cmp.Compare(math.Abs(float64(mom[b])), math.Abs(float64(mom[a]))) })
	out := slices.Clone(idx[:f])
	slices.Sort(out)
	return out
}

// A rejected round leaves a fused support's residual as it was (prepare
// wrote the next one into scratch), and the retry gives the bits of a
// round that was never rejected.
func TestDiLoCoFusedSupportRejected(t *testing.T) {
	const n = 3000
	mk := func() *DiLoCo {
		cfg := DefaultDiLoCo()
		cfg.OuterLR, cfg.Momentum, cfg.NormGrowth = 3, 0, 0
		cfg.Support = &SupportConfig{Chunk: 256, K: 96, Decay: 0.5}
		d, err := NewDiLoCo(cfg, alone{}, make([]float32, n))
		if err != nil {
			t.Fatal(err)
		}
		if !d.fusedSupport() {
			t.Fatal("not the fused path")
		}
		return d
	}
	a, b := mk(), mk()
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 4 {
		theta := make([]float32, n)
		for i := range theta {
			theta[i] = a.Phi[i] - float32(r.NormFloat64()*0.01)
		}
		if round == 2 {
			resid := slices.Clone(b.resid)
			b.cfg.MaxDeltaNorm = 1e-9
			if _, err := b.OuterStep(context.Background(), slices.Clone(theta)); !errors.Is(err, ErrRejected) {
				t.Fatalf("round %d: %v, want ErrRejected", round, err)
			}
			b.cfg.MaxDeltaNorm = 0
			if !slices.Equal(resid, b.resid) {
				t.Fatal("a rejected round changed the residual")
			}
		}
		ta, tb := slices.Clone(theta), slices.Clone(theta)
		if _, err := a.OuterStep(context.Background(), ta); err != nil {
			t.Fatal(err)
		}
		if _, err := b.OuterStep(context.Background(), tb); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a.Phi, b.Phi) || !slices.Equal(a.resid, b.resid) {
			t.Fatalf("round %d: the retried member differs", round)
		}
	}
}
