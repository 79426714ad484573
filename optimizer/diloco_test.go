package optimizer

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/transport"
)

func randomVec(n int, seed uint64, scale float64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 9))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

// innerPhase stands in for H AdamW steps: a member-specific drift.
func innerPhase(theta []float32, member int, round uint64) {
	d := randomVec(len(theta), uint64(member)*1000+round, 0.01)
	for i := range theta {
		theta[i] += d[i] - 0.001
	}
}

// each runs f for every member at once and returns their errors.
func each(n int, f func(i int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(i)
		}()
	}
	wg.Wait()
	return errs
}

func TestNesterovStepByHand(t *testing.T) {
	// eta 0.5, mu 0.9; round 1 from m = 0: m = d, phi -= eta*(d + mu*d).
	phi, m := []float32{1, -2}, []float32{0, 0}
	NesterovStep(phi, m, []float32{0.1, -0.2}, 0.5, 0.9)
	want := []float32{1 - 0.5*(0.1+0.9*0.1), -2 - 0.5*(-0.2+0.9*-0.2)}
	for i := range phi {
		if math.Abs(float64(phi[i]-want[i])) > 1e-6 || math.Abs(float64(m[i]-[]float32{0.1, -0.2}[i])) > 1e-7 {
			t.Fatalf("round 1: phi %v m %v, want phi %v", phi, m, want)
		}
	}
	// round 2: m = 0.9*0.1 + 0.3 = 0.39; phi -= 0.5*(0.3 + 0.9*0.39)
	before := phi[0]
	NesterovStep(phi, m, []float32{0.3, 0}, 0.5, 0.9)
	if math.Abs(float64(m[0])-0.39) > 1e-6 || math.Abs(float64(before-phi[0])-0.5*(0.3+0.9*0.39)) > 1e-6 {
		t.Fatalf("round 2: m %v, step %v", m[0], before-phi[0])
	}
}

// TestDiLoCoCancelledRoundIsRetried: every member's call is cancelled in
// the middle of a round; nothing changes, and the retry (a new attempt of
// the same round) succeeds with one state.
func TestDiLoCoCancelledRoundIsRetried(t *testing.T) {
	const M, n = 4, 1000
	net := transport.NewMemNetwork()
	defer net.Close()
	ds, thetas, _ := bfMembers(t, net, M, n)
	bfStep(t, ds, thetas, []int{0, 1, 2, 3})
	for i := range M {
		net.SetDelay(transport.PeerID(memberName(i)), 300*time.Millisecond, 0)
	}
	saved := make([][]float32, M)
	for i := range M {
		innerPhase(thetas[i], i, 1)
		saved[i] = append([]float32(nil), thetas[i]...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	for i, err := range each(M, func(i int) error { _, err := ds[i].OuterStep(ctx, thetas[i]); return err }) {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("member %d: %v, want deadline exceeded", i, err)
		}
		if ds[i].Round != 1 || !bitsEqual(thetas[i], saved[i]) {
			t.Fatalf("member %d changed state in a cancelled round", i)
		}
	}
	for i := range M {
		net.SetDelay(transport.PeerID(memberName(i)), 0, 0)
	}
	for i, err := range each(M, func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := ds[i].OuterStep(ctx, thetas[i])
		return err
	}) {
		if err != nil {
			t.Fatalf("retry, member %d: %v", i, err)
		}
		if ds[i].Round != 2 || ds[i].StateHash() != ds[0].StateHash() {
			t.Fatalf("member %d: round %d, hash agrees %v", i, ds[i].Round, ds[i].StateHash() == ds[0].StateHash())
		}
	}
}

func TestDiLoCoDelayedAgrees(t *testing.T) {
	const M, n = 4, 800
	net := transport.NewMemNetwork()
	defer net.Close()
	ds, thetas, _ := bfMembers(t, net, M, n)
	for phase := range 4 {
		for i := range M {
			innerPhase(thetas[i], i, uint64(phase))
		}
		before := append([]float32(nil), thetas[0]...)
		for i, err := range each(M, func(i int) error { _, err := ds[i].OuterStepDelayed(context.Background(), thetas[i]); return err }) {
			if err != nil {
				t.Fatalf("phase %d member %d: %v", phase, i, err)
			}
		}
		if phase == 0 {
			// Nothing to apply yet: the next phase starts at the round's
			// step taken with this member's own pseudo-gradient (eagerStart).
			cfg := DefaultDiLoCo()
			want, mom, delta := slices.Clone(ds[0].Phi), make([]float32, n), make([]float32, n)
			for j := range delta {
				delta[j] = ds[0].Phi[j] - before[j]
			}
			NesterovStep(want, mom, delta, float32(cfg.OuterLR), float32(cfg.Momentum))
			if !bitsEqual(want, thetas[0]) {
				t.Fatal("the first delayed step did not start the next phase at the member's own outer step")
			}
		}
	}
	for i, err := range each(M, func(i int) error { _, err := ds[i].Flush(thetas[i]); return err }) {
		if err != nil {
			t.Fatal(err)
		}
		if ds[i].Round != 4 || ds[i].StateHash() != ds[0].StateHash() || !bitsEqual(thetas[i], ds[i].Phi) {
			t.Fatalf("member %d: round %d, agrees %v", i, ds[i].Round, ds[i].StateHash() == ds[0].StateHash())
		}
	}
}

// TestDiLoCoLandMidPhase: a delayed round landed a few inner steps into the
// next phase (Land) moves each member's weights by what the round changed,
// keeping the progress made since; the next pseudo-gradient is the whole
// phase's progress; every member holds the same state throughout.
func TestDiLoCoLandMidPhase(t *testing.T) {
	const M, n = 4, 800
	net := transport.NewMemNetwork()
	defer net.Close()
	ds, thetas, _ := bfMembers(t, net, M, n)
	if ds[0].ExchangeDone() {
		t.Fatal("ExchangeDone with nothing in flight")
	}
	if st, err := ds[0].Land(thetas[0]); err != nil || len(st.Group) != 0 || ds[0].Round != 0 {
		t.Fatalf("Land with nothing in flight: %+v, %v, round %d", st, err, ds[0].Round)
	}
	for i := range M {
		innerPhase(thetas[i], i, 0)
	}
	for i, err := range each(M, func(i int) error { _, err := ds[i].OuterStepDelayed(context.Background(), thetas[i]); return err }) {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	phi0 := append([]float32(nil), ds[0].Phi...)
	starts, mids := make([][]float32, M), make([][]float32, M)
	for i := range M {
		starts[i] = append([]float32(nil), thetas[i]...) // phi0 stepped with the member's own delta (eagerStart)
		innerPhase(thetas[i], i, 100)                    // the phase's first steps
		mids[i] = append([]float32(nil), thetas[i]...)
	}
	if _, err := ds[0].Land(thetas[0][1:]); err == nil {
		t.Fatal("Land took weights of the wrong length")
	}
	for i := range M {
		for deadline := time.Now().Add(30 * time.Second); !ds[i].ExchangeDone(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("member %d: the exchange did not end", i)
			}
		}
		st, err := ds[i].Land(thetas[i])
		if err != nil || len(st.Group) != M || ds[i].Round != 1 || ds[i].InFlight() {
			t.Fatalf("member %d: Land %+v, %v; round %d, in flight %v", i, st, err, ds[i].Round, ds[i].InFlight())
		}
		if ds[i].StateHash() != ds[0].StateHash() {
			t.Fatalf("member %d holds another state after the round", i)
		}
		for j := range thetas[i] {
			want := ds[i].Phi[j] + (mids[i][j] - starts[i][j])
			if math.Abs(float64(thetas[i][j]-want)) > 1e-6 {
				t.Fatalf("member %d, weight %d: %v after Land, want phi' + progress = %v", i, j, thetas[i][j], want)
			}
		}
	}
	if bitsEqual(ds[0].Phi, phi0) {
		t.Fatal("the round changed nothing")
	}
	phi1 := append([]float32(nil), ds[0].Phi...)
	for i := range M {
		innerPhase(thetas[i], i, 200) // the phase's remaining steps
	}
	ends := make([][]float32, M)
	for i := range M {
		ends[i] = append([]float32(nil), thetas[i]...)
	}
	for i, err := range each(M, func(i int) error { _, err := ds[i].OuterStepDelayed(context.Background(), thetas[i]); return err }) {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
		if ds[i].Round != 1 || !ds[i].InFlight() {
			t.Fatalf("member %d: round %d after the phase, in flight %v; want 1 and the next round in flight", i, ds[i].Round, ds[i].InFlight())
		}
		// The pseudo-gradient is the whole phase: phi1 minus its end.
		for j := range ends[i] {
			if want := phi1[j] - ends[i][j]; math.Abs(float64(ds[i].delta[j]-want)) > 1e-6 {
				t.Fatalf("member %d, coordinate %d: pseudo-gradient %v, want %v", i, j, ds[i].delta[j], want)
			}
		}
	}
	for i, err := range each(M, func(i int) error { _, err := ds[i].Flush(thetas[i]); return err }) {
		if err != nil {
			t.Fatal(err)
		}
		if ds[i].Round != 2 || ds[i].StateHash() != ds[0].StateHash() || !bitsEqual(thetas[i], ds[i].Phi) {
			t.Fatalf("member %d: round %d, agrees %v", i, ds[i].Round, ds[i].StateHash() == ds[0].StateHash())
		}
	}
}

// Adopting a state while a delayed round is in flight abandons that round:
// the state is exactly the one adopted, nothing of the round in flight is
// applied later.
func TestDiLoCoSetStateAbandonsDelayedRound(t *testing.T) {
	const M, n = 3, 600
	net := transport.NewMemNetwork()
	defer net.Close()
	ds, thetas, _ := bfMembers(t, net, M, n)
	for i := range M {
		innerPhase(thetas[i], i, 0)
	}
	for i, err := range each(M, func(i int) error { _, err := ds[i].OuterStepDelayed(context.Background(), thetas[i]); return err }) {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	if !ds[0].InFlight() {
		t.Fatal("no delayed round in flight")
	}
	phi, mom := make([]float32, n), make([]float32, n)
	for i := range phi {
		phi[i], mom[i] = float32(i)/n, 0.5
	}
	if err := ds[0].SetState(7, phi, mom); err != nil {
		t.Fatal(err)
	}
	if ds[0].InFlight() || ds[0].Round != 7 || !bitsEqual(ds[0].Phi, phi) || !bitsEqual(ds[0].Mom, mom) {
		t.Fatalf("after SetState: in flight %v, round %d", ds[0].InFlight(), ds[0].Round)
	}
	if _, err := ds[0].Flush(thetas[0]); err != nil || !bitsEqual(thetas[0], phi) || ds[0].Round != 7 {
		t.Fatalf("flush after abandon: %v, round %d", err, ds[0].Round)
	}
	for i := 1; i < M; i++ {
		ds[i].Abandon()
	}
}

// Error feedback on a biased codec: int4 pseudo-gradients with EF move phi
// closer to the fp32 result than without, over several rounds.
func TestDiLoCoErrorFeedback(t *testing.T) {
	const M, n, rounds = 3, 2048, 6
	run := func(codec compression.Codec, ef bool) []float32 {
		net := transport.NewMemNetwork()
		defer net.Close()
		ds, thetas, drivers := bfMembersWith(t, net, M, n, func(_ int, c *ButterflyConfig, _ *ButterflyOptions) {
			c.Codec.Codec, c.Robust.Trim = compression.FP32, 0
		})
		if codec != compression.FP32 {
			fc := compression.DefaultConfig()
			fc.Codec, fc.ZstdLevel = codec, 0
			for i := range ds {
				dc := DefaultDiLoCo()
				dc.Feedback = &fc
				var err error
				if ds[i], err = NewDiLoCo(dc, drivers[i], ds[i].Phi); err != nil {
					t.Fatal(err)
				}
				if !ef {
					ds[i].ef = nil // quantize without feedback
					ds[i].efEncOnly = true
				}
			}
		}
		for range rounds {
			for i := range M {
				for j := range thetas[i] { // a small, consistent drift: what int4 rounds away
					thetas[i][j] -= 0.002 * float32(1.3+math.Sin(float64(j)*0.37))
				}
			}
			for _, err := range each(M, func(i int) error { _, err := ds[i].OuterStep(context.Background(), thetas[i]); return err }) {
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		return ds[0].Phi
	}
	exact := run(compression.FP32, false)
	dist := func(a []float32) float64 {
		var s float64
		for i := range a {
			d := float64(a[i] - exact[i])
			s += d * d
		}
		return math.Sqrt(s)
	}
	withEF, without := dist(run(compression.Int4, true)), dist(run(compression.Int4, false))
	t.Logf("distance to fp32 phi after %d rounds: int4+EF %.4f, int4 %.4f", rounds, withEF, without)
	if !(withEF < without) {
		t.Errorf("error feedback did not help: %.4f vs %.4f", withEF, without)
	}
}

// TestDiLoCoOutsizedContribution: one member adds 3000 to every element of
// its contribution. With the plain mean the average's norm jumps and the
// adaptive bound (NormGrowth) rejects the round, nothing applied; with the
// trimmed mean the offset is dropped, and with the plain mean of clipped
// norms it is cut to 4x the median's norm: either way the round goes
// through with a bounded average, identical on every member.
func TestDiLoCoOutsizedContribution(t *testing.T) {
	const M, n = 4, 1000
	tests := []struct {
		name     string
		robust   RobustConfig
		rejected bool
		maxNorm  float64 // of the average applied
	}{
		{"plain mean", RobustConfig{}, true, 0},
		{"trim 1", RobustConfig{Trim: 1}, false, 1},
		{"mean of norms clipped at 4x", RobustConfig{ClipFactor: 4}, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			net := transport.NewMemNetwork()
			defer net.Close()
			ds, thetas, _ := bfMembersWith(t, net, M, n, func(_ int, c *ButterflyConfig, _ *ButterflyOptions) { c.Robust = tt.robust })
			step := func(poison bool) []error {
				for i := range M {
					innerPhase(thetas[i], i, ds[i].Round)
					if poison && i == 0 {
						for k := range thetas[i] {
							thetas[i][k] -= 3000 // delta = phi - theta grows by 3000
						}
					}
				}
				return each(M, func(i int) error { _, err := ds[i].OuterStep(context.Background(), thetas[i]); return err })
			}
			for r := range normMinHistory + 1 {
				for i, err := range step(false) {
					if err != nil {
						t.Fatalf("honest round %d member %d: %v", r, i, err)
					}
				}
			}
			honest := l2(ds[1].avg)
			before, round := ds[1].StateHash(), ds[1].Round
			errs := step(true)
			for i, err := range errs {
				switch {
				case tt.rejected && !errors.Is(err, ErrRejected):
					t.Fatalf("member %d: %v, want ErrRejected", i, err)
				case tt.rejected && (ds[i].Round != round || (i > 0 && ds[i].StateHash() != before)):
					t.Fatalf("member %d applied the poisoned round", i)
				case !tt.rejected && err != nil:
					t.Fatalf("member %d: %v", i, err)
				case !tt.rejected && (ds[i].Round != round+1 || ds[i].StateHash() != ds[1].StateHash()):
					t.Fatalf("member %d at round %d, agrees %v", i, ds[i].Round, ds[i].StateHash() == ds[1].StateHash())
				}
			}
			if !tt.rejected {
				norm := l2(ds[1].avg)
				t.Logf("average norm %.3f (the last honest round's %.3f; the offset alone would add %.0f)", norm, honest, 3000*math.Sqrt(n)/M)
				if norm > tt.maxNorm {
					t.Fatalf("average norm %v > %v: the offset got through", norm, tt.maxNorm)
				}
			}
		})
	}
}

// TestDiLoCoStateHashKept: the state hash is computed once per state and
// is always StateHashOf of the state as it is: after rounds (plain and
// delayed), a rejected round, SetState, a changed round number, and a
// direct write followed by Touch.
func TestDiLoCoStateHashKept(t *testing.T) {
	const M, n = 3, 600
	net := transport.NewMemNetwork()
	defer net.Close()
	ds, thetas, _ := bfMembers(t, net, M, n)
	check := func(when string) {
		t.Helper()
		for i, d := range ds {
			if got, want := d.StateHash(), StateHashOf(d.Round, d.Phi, d.Mom); got != want {
				t.Fatalf("%s: member %d's state hash %x, its state's %x", when, i, got, want)
			}
		}
	}
	check("at the start")
	before := ds[0].StateHash()
	for round := range 2 {
		for i := range M {
			innerPhase(thetas[i], i, uint64(round))
		}
		for i, err := range each(M, func(i int) error { _, err := ds[i].OuterStep(context.Background(), thetas[i]); return err }) {
			if err != nil {
				t.Fatalf("member %d: %v", i, err)
			}
		}
		check("after a round")
	}
	if ds[0].StateHash() == before {
		t.Fatal("the rounds left the state hash as it was")
	}
	for i := range M {
		innerPhase(thetas[i], i, 7)
	}
	for i, err := range each(M, func(i int) error { _, err := ds[i].OuterStepDelayed(context.Background(), thetas[i]); return err }) {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	check("with a delayed round in flight")
	for i, err := range each(M, func(i int) error { _, err := ds[i].Flush(thetas[i]); return err }) {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	check("after a delayed round landed")
	round, phi, mom := ds[1].State()
	if err := ds[0].SetState(round+5, phi, mom); err != nil {
		t.Fatal(err)
	}
	check("after SetState")
	ds[0].Round++
	check("after a new round number")
	ds[0].Phi[3] += 1
	ds[0].Touch()
	check("after a write and Touch")
}

// TestDiLoCoLandAtOnceIsPlain: a delayed round landed before the next
// phase's first inner step is the plain round: the same state after every
// round, dense and with a shared support, so what overlap costs in loss is
// the steps it overlaps, never the delayed path itself (BENCHMARKS.md,
// "Overlap at equal tokens").
func TestDiLoCoLandAtOnceIsPlain(t *testing.T) {
	sup := SupportConfig{Chunk: 64, K: 24, Decay: 0.5}
	support := DefaultDiLoCo()
	support.Support, support.OuterLR, support.Momentum = &sup, 3, 0
	for _, tc := range []struct {
		name string
		cfg  DiLoCoConfig
	}{{"dense", DefaultDiLoCo()}, {"support", support}} {
		t.Run(tc.name, func(t *testing.T) {
			const M, n, rounds = 4, 640, 3
			plainNet, delayedNet := transport.NewMemNetwork(), transport.NewMemNetwork()
			defer plainNet.Close()
			defer delayedNet.Close()
			pd, pt, _ := bfMembersDiLoCo(t, plainNet, M, n, tc.cfg, nil)
			dd, dt, _ := bfMembersDiLoCo(t, delayedNet, M, n, tc.cfg, nil)
			for r := range rounds {
				for i := range M {
					innerPhase(pt[i], i, uint64(r))
					innerPhase(dt[i], i, uint64(r))
				}
				for i, err := range each(M, func(i int) error { _, err := pd[i].OuterStep(context.Background(), pt[i]); return err }) {
					if err != nil {
						t.Fatalf("round %d, plain member %d: %v", r, i, err)
					}
				}
				for i, err := range each(M, func(i int) error {
					if _, err := dd[i].OuterStepDelayed(context.Background(), dt[i]); err != nil {
						return err
					}
					_, err := dd[i].Land(dt[i]) // waits for the exchange: before any step
					return err
				}) {
					if err != nil {
						t.Fatalf("round %d, delayed member %d: %v", r, i, err)
					}
				}
				for i := range M {
					if dd[i].Round != pd[i].Round {
						t.Fatalf("round %d, member %d: delayed at round %d, plain at %d", r, i, dd[i].Round, pd[i].Round)
					}
					for j := range pd[i].Phi {
						if d := math.Abs(float64(dd[i].Phi[j] - pd[i].Phi[j])); d > 1e-5 {
							t.Fatalf("round %d, member %d, coordinate %d: phi %v delayed, %v plain", r, i, j, dd[i].Phi[j], pd[i].Phi[j])
						}
						if d := math.Abs(float64(dt[i][j] - pt[i][j])); d > 1e-5 {
							t.Fatalf("round %d, member %d, coordinate %d: weights %v delayed, %v plain", r, i, j, dt[i][j], pt[i][j])
						}
					}
				}
			}
		})
	}
}

// TestDiLoCoResidualOnlyWhereCarried: a residual exists (and is saved by
// a volunteer) only where a later round reads it; a support with decay 0
// and no nominations sends each round's own delta, so it keeps none and
// refuses to install one.
func TestDiLoCoResidualOnlyWhereCarried(t *testing.T) {
	const n = 4096
	sub := func(c SupportConfig) DiLoCoConfig {
		cfg := DefaultDiLoCo()
		cfg.Support = &c
		return cfg
	}
	noMom := func(cfg DiLoCoConfig) DiLoCoConfig { cfg.Momentum = 0; return cfg }
	for _, tc := range []struct {
		name  string
		cfg   DiLoCoConfig
		keeps bool
	}{
		{"dense", DefaultDiLoCo(), false},
		{"support with decay", sub(SupportConfig{Chunk: 256, K: 8, Decay: 0.95}), true},
		{"support without decay", sub(SupportConfig{Chunk: 256, K: 8}), false},
		{"dense support without decay (fused scratch)", noMom(sub(SupportConfig{Chunk: 256, K: 64})), false},
		{"rotated support without decay", sub(SupportConfig{Chunk: 256, K: 96, Rotate: true}), false},
		{"rotated support with decay", sub(SupportConfig{Chunk: 256, K: 96, Rotate: true, Decay: 1}), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewDiLoCo(tc.cfg, nil, make([]float32, n))
			if err != nil {
				t.Fatal(err)
			}
			if got := d.Residual() != nil; got != tc.keeps {
				t.Fatalf("Residual() present = %v, want %v", got, tc.keeps)
			}
			err = d.SetResidual(make([]float32, n))
			if (err == nil) != tc.keeps {
				t.Fatalf("SetResidual: %v, want accepted = %v", err, tc.keeps)
			}
		})
	}
}

// TestDiLoCoEagerStartIsTheRound: an overlapped round's next phase starts
// where the round would take phi if the group's average were this
// member's own pseudo-gradient (eagerStart). Alone in its group, that is
// the round's phi bit for bit, outer momentum included, and landing the
// round moves nothing.
func TestDiLoCoEagerStartIsTheRound(t *testing.T) {
	const n = 1000
	phi0 := randomVec(n, 5, 1)
	d, err := NewDiLoCo(DefaultDiLoCo(), alone{}, phi0)
	if err != nil {
		t.Fatal(err)
	}
	theta := slices.Clone(phi0)
	for r := range 4 {
		innerPhase(theta, 0, uint64(r))
		if _, err := d.OuterStepDelayed(context.Background(), theta); err != nil {
			t.Fatal(err)
		}
		eager := slices.Clone(theta)
		if _, err := d.Land(theta); err != nil {
			t.Fatal(err)
		}
		if d.Round != uint64(r+1) {
			t.Fatalf("round %d: at round %d", r, d.Round)
		}
		for i, p := range d.Phi {
			if math.Float32bits(eager[i]) != math.Float32bits(p) || math.Float32bits(theta[i]) != math.Float32bits(p) {
				t.Fatalf("round %d, [%d]: started the phase at %v, landed at %v, the round's phi is %v", r, i, eager[i], theta[i], p)
			}
		}
	}
}

// The share of a pseudo-gradient a round is expected to apply (eagerStart).
func TestDiLoCoEagerShare(t *testing.T) {
	sup := func(k int, decay float32) DiLoCoConfig {
		c := DefaultDiLoCo()
		c.Support = &SupportConfig{Chunk: 4096, K: k, Decay: decay, Rotate: true}
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  DiLoCoConfig
		want float64
	}{
		{"dense", DefaultDiLoCo(), 1},
		{"support without residual", sup(1792, 0), 1792.0 / 4096},
		{"support, residual kept whole", sup(1024, 1), 1},
		{"support, residual halved", sup(1024, 0.5), 0.25 / (1 - 0.5*0.75)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewDiLoCo(tc.cfg, alone{}, make([]float32, 8192))
			if err != nil {
				t.Fatal(err)
			}
			if got := float64(d.eagerShare()); math.Abs(got-tc.want) > 1e-6 {
				t.Fatalf("share %v, want %v", got, tc.want)
			}
		})
	}
}
