package optimizer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/skein-ml/skein/transport"
)

func TestNoLoCoGroups(t *testing.T) {
	for _, tt := range []struct{ M, g int }{{2, 2}, {4, 2}, {7, 2}, {9, 3}, {3, 4}} {
		var ms []transport.PeerID
		for i := 0; i < tt.M; i++ {
			ms = append(ms, transport.PeerID(fmt.Sprintf("p%d", i)))
		}
		for step := uint64(0); step < 5; step++ {
			groups := NoLoCoGroups(ms, step, tt.g)
			seen := map[transport.PeerID]int{}
			for _, g := range groups {
				if len(g) < min(tt.g, tt.M) || len(g) >= 2*tt.g {
					t.Errorf("M=%d g=%d step %d: group of %d", tt.M, tt.g, step, len(g))
				}
				for _, p := range g {
					seen[p]++
				}
			}
			if len(seen) != tt.M {
				t.Errorf("M=%d: %d members grouped", tt.M, len(seen))
			}
			for p, n := range seen {
				if n != 1 {
					t.Errorf("%s in %d groups", p, n)
				}
			}
		}
	}
	// Same members in another order give the same groups; the groups change with the step.
	a := NoLoCoGroups([]transport.PeerID{"a", "b", "c", "d", "e", "f"}, 3, 2)
	b := NoLoCoGroups([]transport.PeerID{"f", "e", "d", "c", "b", "a"}, 3, 2)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("groups depend on member order: %v vs %v", a, b)
	}
	changed := false
	for s := uint64(4); s < 10; s++ {
		if fmt.Sprint(NoLoCoGroups([]transport.PeerID{"a", "b", "c", "d", "e", "f"}, s, 2)) != fmt.Sprint(a) {
			changed = true
		}
	}
	if !changed {
		t.Error("groups never change with the step")
	}
}

func TestNoLoCoUpdateByHand(t *testing.T) {
	// phi 1, delta 0.2, phibar 2, dbar 0.5, eta 0.7, beta 0.5, gamma 0.7:
	// delta = 0.1 + 0.35 + 0.7 = 1.15, phi = 2.15
	phi, delta := []float32{1}, []float32{0.2}
	NoLoCoUpdate(phi, delta, []float32{2}, []float32{0.5}, 0.7, 0.5, 0.7)
	if math.Abs(float64(delta[0])-1.15) > 1e-6 || math.Abs(float64(phi[0])-2.15) > 1e-6 {
		t.Fatalf("delta %v phi %v, want 1.15 and 2.15", delta[0], phi[0])
	}
}

func testNoLoCoConfig() NoLoCoConfig {
	c := DefaultNoLoCo()
	c.InitialDeadline, c.MinDeadline, c.MaxDeadline = time.Second, 100*time.Millisecond, time.Second
	return c
}

// NoLoCo gossip is a consensus process: members that start from the same
// weights and drift apart in their inner phases stay much closer together
// than the same drifts would take them alone, and honest partners are not
// clipped.
func TestNoLoCoMembersConverge(t *testing.T) {
	const M, n = 6, 500
	net := transport.NewMemNetwork()
	defer net.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ns []*NoLoCo
	for i := 0; i < M; i++ {
		id := transport.PeerID(fmt.Sprintf("peer-%d", i))
		p := net.Join(id)
		// Every partner is live and must be heard: deadlines long enough
		// for a loaded machine under -race (the adaptive one fell to its
		// 100 ms floor after two quick steps, and one late message failed
		// the test), which costs nothing when messages arrive.
		cfg := testNoLoCoConfig()
		cfg.InitialDeadline, cfg.MinDeadline, cfg.MaxDeadline = 30*time.Second, 30*time.Second, 30*time.Second
		nl, err := NewNoLoCo(ctx, cfg, p, randomVec(n, 1, 1))
		if err != nil {
			t.Fatal(err)
		}
		defer nl.Close()
		ns = append(ns, nl)
	}
	// alone[i] is member i's phi had it never averaged.
	alone := make([][]float32, M)
	for i := range alone {
		alone[i] = slices.Clone(ns[i].Phi)
	}
	spread := func(phis [][]float32) float64 {
		var s float64
		for j := 0; j < n; j++ {
			var mean float64
			for _, phi := range phis {
				mean += float64(phi[j]) / M
			}
			for _, phi := range phis {
				d := float64(phi[j]) - mean
				s += d * d
			}
		}
		return s
	}
	deltas := make([][]float32, M)
	for i := range deltas {
		deltas[i] = make([]float32, n)
	}
	for step := 0; step < 6; step++ {
		errs := each(M, func(i int) error {
			theta := append([]float32(nil), ns[i].Phi...)
			innerPhase(theta, i, uint64(step))
			d := slices.Clone(theta)
			for j := range d {
				d[j] -= ns[i].Phi[j]
			}
			NoLoCoUpdate(alone[i], deltas[i], alone[i], d, 0.7, 0.5, 0.7)
			st, err := ns[i].OuterStep(context.Background(), theta)
			if err == nil && (len(st.Heard) != len(st.Group)-1 || len(st.Clipped) != 0) {
				err = fmt.Errorf("heard %d of %d partners, clipped %d", len(st.Heard), len(st.Group)-1, len(st.Clipped))
			}
			return err
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("step %d member %d: %v", step, i, err)
			}
		}
	}
	phis := make([][]float32, M)
	for i, nl := range ns {
		phis[i] = nl.Phi
	}
	if apart, together := spread(alone), spread(phis); !(together < apart*0.2) {
		t.Errorf("spread of slow weights %.3g, alone %.3g: want at least 5x smaller", together, apart)
	}
}

func TestNoLoCoMissingPartnerMovesOn(t *testing.T) {
	net := transport.NewMemNetwork()
	defer net.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := NewNoLoCo(ctx, testNoLoCoConfig(), net.Join("a"), []float32{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	net.Join("b") // b never answers
	net.DetectAfter = time.Hour
	theta := []float32{1.5, 2, 3}
	began := time.Now()
	st, err := a.OuterStep(context.Background(), theta)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Heard) != 0 || a.Step != 1 {
		t.Fatalf("heard %v, step %d", st.Heard, a.Step)
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("waited %v for a missing partner", d)
	}
	// Alone: phibar = phi, dbar = D = (0.5, 0, 0): delta = 0.7*0.5 = 0.35.
	if math.Abs(float64(a.Phi[0])-1.35) > 1e-6 || theta[0] != a.Phi[0] {
		t.Errorf("phi %v theta %v, want 1.35", a.Phi, theta)
	}
}

// A member that adopts another's state (a joiner, or one that fell behind)
// takes its step, phi and momentum, forgets what arrived for earlier steps,
// uses a partner's message for the adopted step that arrived while it was
// still behind, and goes on with its partners from that step.
func TestNoLoCoSetState(t *testing.T) {
	net := transport.NewMemNetwork()
	defer net.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := NewNoLoCo(ctx, testNoLoCoConfig(), net.Join("a"), []float32{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewNoLoCo(ctx, testNoLoCoConfig(), net.Join("b"), []float32{5, 6, 7})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	kept := func(step uint64) (n int) {
		a.d.do(func() { n = len(a.g.arrived[step]) })
		return n
	}
	// b runs step 0 without a; its message waits at a.
	if _, err := b.OuterStep(ctx, slices.Clone(b.Phi)); err != nil {
		t.Fatal(err)
	}
	if kept(0) != 1 {
		t.Fatalf("%d messages for step 0 kept at a, want 1", kept(0))
	}
	// b jumps to step 10; a, far behind, adopts b's state there, but only
	// after b's message for step 10 has arrived.
	if err := b.SetState(10, b.Phi, b.Delta); err != nil {
		t.Fatal(err)
	}
	step, phi, delta := b.State()
	phi[0], delta[0] = 100, 100 // copies: b is untouched
	if step != 10 || b.Phi[0] != 5 || b.Delta[0] != 0 {
		t.Fatalf("State: step %d, and b's own slices: phi %v delta %v", step, b.Phi, b.Delta)
	}
	phi[0], delta[0] = 5, 0.5
	if _, err := b.OuterStep(ctx, slices.Clone(b.Phi)); err != nil {
		t.Fatal(err)
	}
	if err := a.SetState(step, phi, delta); err != nil {
		t.Fatal(err)
	}
	if a.Step != 10 || kept(0) != 0 || kept(10) != 1 || !slices.Equal(a.Phi, phi) || a.Delta[0] != 0.5 {
		t.Fatalf("after SetState: step %d, %d stale and %d kept messages, phi %v, delta %v", a.Step, kept(0), kept(10), a.Phi, a.Delta)
	}
	for _, bad := range [][2][]float32{
		{{1, 2}, {0, 0}},                           // wrong length
		{{1, 2, float32(math.NaN())}, {0, 0, 0}},   // not finite
		{{1, 2, 3}, {0, float32(math.Inf(-1)), 0}}, // not finite
	} {
		if err := a.SetState(20, bad[0], bad[1]); !errors.Is(err, ErrRejected) || a.Step != 10 {
			t.Errorf("SetState(%v, %v): %v, step %d", bad[0], bad[1], err, a.Step)
		}
	}
	// a's step 10 uses b's message at once: phibar = phi, dbar = 0, so
	// delta = 0.5*0.5 on the first element.
	began := time.Now()
	st, err := a.OuterStep(ctx, slices.Clone(a.Phi))
	if err != nil || len(st.Heard) != 1 || time.Since(began) > 500*time.Millisecond {
		t.Fatalf("step 10: heard %v in %v, err %v", st.Heard, time.Since(began), err)
	}

	// Both at step 11: they hear each other, and the update is the
	// hand-computed one, with phibar = (5.125, 6, 7) and dbar = 1.
	thetas := [][]float32{{6.25, 7, 8}, {6, 7, 8}}
	errs := each(2, func(i int) error {
		nl := []*NoLoCo{a, b}[i]
		st, err := nl.OuterStep(ctx, thetas[i])
		if err == nil && len(st.Heard) != 1 {
			err = fmt.Errorf("heard %v", st.Heard)
		}
		return err
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	// a: delta = 0.5*0.25 + 0.7*1 + 0.7*(5.125-5.25) on the first
	// element, 0.7 on the others; b: 0.7 + 0.7*(5.125-5), 0.7.
	wantA, wantB := []float32{5.9875, 6.7, 7.7}, []float32{5.7875, 6.7, 7.7}
	for i := range wantA {
		if math.Abs(float64(a.Phi[i]-wantA[i])) > 1e-2 || math.Abs(float64(b.Phi[i]-wantB[i])) > 1e-2 {
			t.Fatalf("phi a %v b %v, want %v and %v", a.Phi, b.Phi, wantA, wantB)
		}
	}
	if a.Step != 12 || b.Step != 12 {
		t.Fatalf("steps %d and %d, want 12", a.Step, b.Step)
	}
}

// A partner that says it is past the step being waited for (it finished
// the step without this member, say in another view of the group) is
// waited for MinDeadline, not the whole deadline (here an hour): NoLoCo
// tells the machine what PeerStep says (testdata/noloco/moved-on.txt
// counts the ticks).
func TestNoLoCoPartnerPastStepNotAwaited(t *testing.T) {
	net := transport.NewMemNetwork()
	defer net.Close()
	net.DetectAfter = time.Hour
	cfg := testNoLoCoConfig()
	cfg.InitialDeadline, cfg.MaxDeadline = time.Hour, time.Hour
	cfg.PeerStep = func(p transport.PeerID) uint64 {
		if p == "b" {
			return 2
		}
		return 0
	}
	a, err := NewNoLoCo(context.Background(), cfg, net.Join("a"), []float32{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	net.Join("b") // never sends
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := a.OuterStep(ctx, slices.Clone(a.Phi))
	if err != nil || len(st.Heard) != 0 || len(st.Group) != 2 || a.Step != 1 {
		t.Fatalf("group %v, heard %v, err %v, step after %d", st.Group, st.Heard, err, a.Step)
	}
}
