package optimizer

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skein-ml/skein/transport"
)

// hostileRun is what the honest members of a NoLoCo run with one hostile
// member (nolocoHostile) ended with and saw.
type hostileRun struct {
	phi0 []float32
	phis [][]float32 // the honest members' phi at the end
	// missed lists an honest member's steps where it did not hear an
	// honest partner.
	missed []string
	// outliers and rejected count, by peer, how often honest members named
	// it an outlier (GossipStats.Outliers) and refused a message of it
	// (OnReject).
	outliers, rejected map[transport.PeerID]int
	// stash lists what an honest member kept that it should not have:
	// more than one message of a sender for a step, a message of a member
	// not its partner at the message's step, more bytes than the budget.
	stash []string
	alloc uint64 // bytes the process allocated after the first step
}

// nolocoHostile runs honest members and one more, the last, hostile in mode
// ("": honest), from the same weights phi0 for steps outer steps over the
// in-memory transport. Every member trains alike, each inner phase moving
// theta by 0.01 per element plus noise of its own: the hostile member runs
// the real code with NoLoCoConfig.Hostile, lying only in what it sends.
func nolocoHostile(t *testing.T, mode string, honest, steps int) hostileRun {
	const n = 256
	net := transport.NewMemNetwork()
	defer net.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	M := honest + 1
	run := hostileRun{phi0: randomVec(n, 1, 1), outliers: map[transport.PeerID]int{}, rejected: map[transport.PeerID]int{}}
	var mu sync.Mutex
	ids := make([]transport.PeerID, M)
	ns := make([]*NoLoCo, M)
	for i := range ns {
		ids[i] = transport.PeerID(fmt.Sprintf("peer-%d", i))
		cfg := testNoLoCoConfig()
		// Every honest partner is live and must be heard, even on a loaded
		// machine.
		cfg.InitialDeadline, cfg.MinDeadline, cfg.MaxDeadline = 30*time.Second, 30*time.Second, 30*time.Second
		if i == honest {
			cfg.Hostile = mode
		} else {
			cfg.OnReject = func(p transport.PeerID, _ error) {
				mu.Lock()
				defer mu.Unlock()
				run.rejected[p]++
			}
		}
		nl, err := NewNoLoCo(ctx, cfg, net.Join(ids[i]), run.phi0)
		if err != nil {
			t.Fatal(err)
		}
		defer nl.Close()
		ns[i] = nl
	}
	var before runtime.MemStats
	for step := range steps {
		if step == 1 { // the hostile member built its bombs in step 0
			runtime.ReadMemStats(&before)
		}
		errs := each(M, func(i int) error {
			nl := ns[i]
			theta := slices.Clone(nl.Phi)
			noise := randomVec(n, uint64(1000*i+step), 0.01)
			for j := range theta {
				theta[j] += 0.01 + noise[j]
			}
			st, err := nl.OuterStep(ctx, theta)
			if err != nil || i == honest {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			for _, p := range st.Group {
				if p != ids[i] && p != ids[honest] && !slices.Contains(st.Heard, p) {
					run.missed = append(run.missed, fmt.Sprintf("step %d: %s did not hear %s", step, ids[i], p))
				}
			}
			for _, p := range st.Outliers {
				run.outliers[p]++
			}
			return nil
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("step %d member %d: %v", step, i, err)
			}
		}
		for i, nl := range ns[:honest] {
			nl.d.do(func() { run.stash = append(run.stash, stashFaults(nl.g, ids[i])...) })
		}
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	run.alloc = after.TotalAlloc - before.TotalAlloc
	for _, nl := range ns[:honest] {
		run.phis = append(run.phis, slices.Clone(nl.Phi))
	}
	return run
}

// stashFaults lists what g, member self's machine between steps, keeps
// that Gossip.keep should not have kept.
func stashFaults(g *Gossip, self transport.PeerID) []string {
	var faults []string
	var total int64
	check := func(e envelope) {
		total += int64(len(e.body))
		if !slices.Contains(g.groupAt(e.h.round), e.from) {
			faults = append(faults, fmt.Sprintf("%s kept a message of %s, not its partner at step %d", self, e.from, e.h.round))
		}
	}
	for step, es := range g.arrived {
		seen := map[transport.PeerID]bool{}
		for _, e := range es {
			check(e)
			if seen[e.from] {
				faults = append(faults, fmt.Sprintf("%s kept two messages of %s for step %d", self, e.from, step))
			}
			seen[e.from] = true
		}
	}
	for _, e := range g.ahead {
		check(e)
	}
	if total > g.budget {
		faults = append(faults, fmt.Sprintf("%s kept %d bytes, budget %d", self, total, g.budget))
	}
	return faults
}

// Each NoLoCo hostile mode (NoLoCoConfig.Hostile), played by a member that
// runs the real code, against 4 honest members for 12 steps: the honest
// members' weights stay finite and near where an all-honest run takes them,
// they hear every honest partner, and the offender is named where the
// defence detects one, never an honest member. Each case says which
// defence it exercises; without it the case fails (checked by hand by
// disabling each).
func TestNoLoCoHostileModes(t *testing.T) {
	const honest, steps = 4, 30
	base := nolocoHostile(t, "", honest, steps)
	hostileID := transport.PeerID(fmt.Sprintf("peer-%d", honest))
	for _, tt := range []struct {
		mode string
		// damage bounds how far an honest member's phi ends from where the
		// honest run takes it, relative to the distance that run travels.
		damage float64
		// named: honest members name the hostile member (an outlier for the
		// clip, a refused message for the decoder); refused: they refuse
		// its messages rather than clip them.
		named, refused bool
	}{
		// The clip (noloco_clip.go): without it phi + 1e3 pulls every
		// partner by gamma/2 * 1e3 per element, a damage of about 1e4.
		{HostileNoLoCoScale, 0.7, true, false},
		// The clip again, against a pull in range: without it the initial
		// weights erase most of the progress (TestNoLoCoRollbackAttack).
		{HostileNoLoCoRollback, 0.5, false, false},
		// The decoder capped at the model's size (NewGossip): without it
		// each bomb decoded allocates 16 MiB (the allocation check). And
		// Gossip.keep: one message per partner and step within the
		// budget, none from others (the stash check).
		{HostileNoLoCoBomb, 0.2, true, true},
	} {
		t.Run(tt.mode, func(t *testing.T) {
			run := nolocoHostile(t, tt.mode, honest, steps)
			for _, m := range run.missed {
				t.Error(m)
			}
			for _, f := range run.stash {
				t.Error(f)
			}
			for i, phi := range run.phis {
				if err := checkFinite(phi, 1e4); err != nil {
					t.Fatalf("honest member %d: %v", i, err)
				}
				travelled := distance(base.phis[i], base.phi0)
				if d := distance(phi, base.phis[i]) / travelled; !(d <= tt.damage) {
					t.Errorf("honest member %d ends %.3g of the honest run's progress (%.3g) away from it, at most %.3g", i, d, travelled, tt.damage)
				}
			}
			for p, k := range run.outliers {
				if p != hostileID {
					t.Errorf("honest %s named an outlier %d times", p, k)
				}
			}
			for p, k := range run.rejected {
				if p != hostileID {
					t.Errorf("honest %s refused %d times", p, k)
				}
			}
			named := run.outliers[hostileID] + run.rejected[hostileID]
			if (named > 0) != tt.named || (run.rejected[hostileID] > 0) != tt.refused {
				t.Errorf("the hostile member named an outlier %d times and refused %d times; want named %v, refused %v",
					run.outliers[hostileID], run.rejected[hostileID], tt.named, tt.refused)
			}
			// Honest runs allocate little for a model of 256 parameters; a
			// bomb decoded would take 16 MiB.
			if limit := base.alloc + 8<<20; run.alloc > limit {
				t.Errorf("allocated %d bytes after the first step, at most %d", run.alloc, limit)
			}
			t.Logf("damage %.3g; named %d times, refused %d; allocated %d bytes (honest run %d)",
				maxDamage(run, base), run.outliers[hostileID], run.rejected[hostileID], run.alloc, base.alloc)
		})
	}
}

// maxDamage is the largest distance of an honest member's phi in run from
// its phi in the honest run base, relative to the distance base travelled.
func maxDamage(run, base hostileRun) float64 {
	var worst float64
	for i, phi := range run.phis {
		worst = max(worst, distance(phi, base.phis[i])/distance(base.phis[i], base.phi0))
	}
	if math.IsNaN(worst) {
		return math.Inf(1)
	}
	return worst
}

// A NoLoCoConfig names a known hostile mode or none.
func TestNoLoCoHostileValidate(t *testing.T) {
	for _, mode := range append([]string{""}, NoLoCoHostileModes...) {
		c := DefaultNoLoCo()
		c.Hostile = mode
		if err := c.Validate(); err != nil {
			t.Errorf("%q: %v", mode, err)
		}
	}
	c := DefaultNoLoCo()
	c.Hostile = "scale" // the butterfly's
	if err := c.Validate(); err == nil {
		t.Error("accepted the butterfly's hostile mode")
	}
}
