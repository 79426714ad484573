package optimizer

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"
)

func TestNoLoCoGroups(t *testing.T) {
	for _, tt := range []struct{ M, g int }{{2, 2}, {4, 2}, {7, 2}, {9, 3}, {3, 4}} {
		var ms []PeerID
		for i := 0; i < tt.M; i++ {
			ms = append(ms, PeerID(fmt.Sprintf("p%d", i)))
		}
		for step := uint64(0); step < 5; step++ {
			groups := NoLoCoGroups(ms, step, tt.g)
			seen := map[PeerID]int{}
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
	a := NoLoCoGroups([]PeerID{"a", "b", "c", "d", "e", "f"}, 3, 2)
	b := NoLoCoGroups([]PeerID{"f", "e", "d", "c", "b", "a"}, 3, 2)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("groups depend on member order: %v vs %v", a, b)
	}
	changed := false
	for s := uint64(4); s < 10; s++ {
		if fmt.Sprint(NoLoCoGroups([]PeerID{"a", "b", "c", "d", "e", "f"}, s, 2)) != fmt.Sprint(a) {
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

// With no local progress (theta = phi), NoLoCo gossip is a consensus
// process: the members' slow weights converge towards each other.
func TestNoLoCoMembersConverge(t *testing.T) {
	const M, n = 6, 500
	net := NewMemNetwork()
	defer net.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var ns []*NoLoCo
	var ms []*member
	for i := 0; i < M; i++ {
		id := PeerID(fmt.Sprintf("peer-%d", i))
		p := net.Join(id)
		nl, err := NewNoLoCo(ctx, testNoLoCoConfig(), p, randomVec(n, uint64(i), 1))
		if err != nil {
			t.Fatal(err)
		}
		defer nl.Close()
		ns = append(ns, nl)
		ms = append(ms, &member{id: id, peer: p})
	}
	spread := func() float64 {
		var s float64
		for j := 0; j < n; j++ {
			var mean float64
			for _, nl := range ns {
				mean += float64(nl.Phi[j]) / M
			}
			for _, nl := range ns {
				d := float64(nl.Phi[j]) - mean
				s += d * d
			}
		}
		return s
	}
	before := spread()
	for step := 0; step < 6; step++ {
		errs := runAll(ms, func(i int, _ *member) error {
			theta := append([]float32(nil), ns[i].Phi...)
			st, err := ns[i].OuterStep(context.Background(), theta)
			if err == nil && len(st.Heard) != len(st.Group)-1 {
				err = fmt.Errorf("heard %d of %d partners", len(st.Heard), len(st.Group)-1)
			}
			return err
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("step %d member %d: %v", step, i, err)
			}
		}
	}
	if after := spread(); !(after < before*0.2) {
		t.Errorf("spread of slow weights %.3g -> %.3g, want at least 5x smaller", before, after)
	}
}

func TestNoLoCoMissingPartnerMovesOn(t *testing.T) {
	net := NewMemNetwork()
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
