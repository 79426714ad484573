package node

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// HostileNoLoCoJump's lie (nolocoJump, what install announces and serves
// for a hostile volunteer) against members catching up from behind the
// run, as a joiner does (slack 0) and a member that fell behind between
// outer steps (slack 1): they go to the honest members' step with weights
// within the honest range, and a member at the run's step stays. The
// defence is nolocoCatchUp's: the step a strict majority (and a quorum)
// announces, and the median of the states served for it. Following the
// highest announced step instead would take the hostile member's state
// alone: fewer states than the quorum, an error here, and phi + 1 outside
// the honest range without the quorum. With the honest members a step
// apart, the lie and the one ahead make a majority for a step only that one
// serves: the member behind must not try it (catchUpTarget; the chaos soak
// saw honest members fetch a state every step and drop it).
func TestNoLoCoJumpNotFollowed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 5, p2ptest.Options{})
	me, honest, hostile := sw.Nodes[1], sw.Nodes[2:4], sw.Nodes[4]
	const n, step = 1000, 10
	vec := func(v float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = v + float32(i%7)/100
		}
		return x
	}
	// announce makes node a volunteer announcing round and serving a state
	// for served, as install does.
	announce := func(node *p2p.Node, round uint64, served uint64, phi, mom []float32) {
		blob, _ := encodeServed(served, phi, mom)
		node.ServeBulk(func(_ context.Context, _ peer.ID, key string) (io.ReaderAt, int64, error) {
			return servedState{blob, served}.open(key)
		}, 0)
		if err := node.UpdateMeta(context.Background(), func(m *p2p.Meta) { m.Role, m.Round = p2p.RoleVolunteer, round }); err != nil {
			t.Fatal(err)
		}
	}
	// The hostile volunteer's true state lies between the honest ones.
	lie, phi, mom := nolocoJump(step, vec(1.5), vec(1.5))
	if lie <= step+nolocoLead {
		t.Fatalf("the jump announces step %d, not far past %d", lie, step)
	}
	announce(hostile, lie, lie, phi, mom)
	for _, tt := range []struct {
		name       string
		honest     [2]uint64 // the honest members' steps
		own, slack uint64
		jump       bool
		wantRound  uint64
	}{
		{"joiner", [2]uint64{step, step}, 0, 0, true, step},
		{"fell behind", [2]uint64{step, step}, step - 2, 1, true, step},
		{"at the run's step", [2]uint64{step, step}, step, 1, false, step},
		{"a step ahead of the run", [2]uint64{step, step}, step + 1, 0, false, step + 1},
		// The lie and one honest member make a majority at step 10, which
		// only that member serves: the target is the step both honest
		// members serve.
		{"honest a step apart, within slack", [2]uint64{step, step - 1}, step - 2, 1, false, step - 2},
		{"honest a step apart", [2]uint64{step, step - 1}, step - 3, 1, true, step - 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			want := map[peer.ID]uint64{hostile.ID(): lie}
			for i, h := range honest {
				announce(h, tt.honest[i], tt.honest[i], vec(float32(i+1)), vec(float32(i+1))) // 1 and 2
				want[h.ID()] = tt.honest[i]
			}
			deadline := time.Now().Add(p2ptest.Slowdown * 30 * time.Second)
			for seen := 0; seen < len(want); time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("announced steps not seen")
				}
				seen = 0
				for _, m := range me.Members() {
					if r, ok := want[m.ID]; ok && m.Meta.Role == p2p.RoleVolunteer && m.Meta.Round == r {
						seen++
					}
				}
			}
			st := &fixedState{round: tt.own, phi: vec(0), mom: vec(0)}
			jumped, err := nolocoCatchUp(context.Background(), me, testLogger("me"), st, tt.own, tt.slack, n, nil)
			if err != nil || jumped != tt.jump || st.round != tt.wantRound {
				t.Fatalf("jumped %v to round %d, err %v; want jumped %v to round %d", jumped, st.round, err, tt.jump, tt.wantRound)
			}
			if !jumped {
				return
			}
			lo, hi := vec(1), vec(2)
			for i := range st.phi {
				if st.phi[i] < lo[i] || st.phi[i] > hi[i] || st.mom[i] < lo[i] || st.mom[i] > hi[i] {
					t.Fatalf("element %d: phi %v mom %v, outside the honest range [%v, %v]", i, st.phi[i], st.mom[i], lo[i], hi[i])
				}
			}
		})
	}
}

// The NoLoCo modes that lie in what a member sends are the optimizer's;
// the jump, the volunteer's own, is not.
func TestNoLoCoHostileModesMapped(t *testing.T) {
	for _, mode := range []string{HostileNoLoCoScale, HostileNoLoCoRollback, HostileNoLoCoBomb} {
		if got := nolocoHostile(HostileMode(mode)); got != mode || !slices.Contains(optimizer.NoLoCoHostileModes, got) {
			t.Errorf("%s: the optimizer plays %q", mode, got)
		}
	}
	for _, mode := range []string{HostileNoLoCoJump, HostileLoneJump, "scale", ""} {
		if got := nolocoHostile(HostileMode(mode)); got != "" {
			t.Errorf("%s: the optimizer plays %q, want none", mode, got)
		}
	}
}
