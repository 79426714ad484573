package node

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
	"github.com/skein-ml/skein/transport"
)

// DiLoCo rounds over real libp2p streams on loopback: four volunteers and a
// seed (which does not train) agree on the state after every round.
func TestDiLoCoOverP2P(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	tr := newP2PTrainers(t, 4, 50_000, p2ptest.Options{}, nil)
	for round := range 3 {
		tr.round(t, round, 4)
	}
}

// Each hostile behaviour of one volunteer of four, over real libp2p streams
// with signed parts: the three honest ones end every round with the same
// state, every coordinate's step stays within what honest contributions
// give, and a provable offence (poison, forged aggregate) is reported with
// the offender's peer ID by every honest member.
func TestHostileVolunteerOverP2P(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	for _, mode := range optimizer.HostileModes {
		t.Run(mode, func(t *testing.T) {
			var mu sync.Mutex
			reported := map[string]map[transport.PeerID]bool{} // by reporter
			tr := newP2PTrainers(t, 4, 50_000, p2ptest.Options{}, func(i int, n *p2p.Node, c *optimizer.ButterflyConfig, o *optimizer.ButterflyOptions) {
				if i == 3 {
					c.Hostile = mode
				}
				if mode == optimizer.HostileMute {
					// The first round waits for the mute member until the
					// phase deadlines: 2 s, not the default 2 minutes.
					c.PhaseWait = int64(2 * time.Second / butterflyTick)
				}
				me := n.ID().String()
				o.OnReject = func(p transport.PeerID, err error) {
					mu.Lock()
					defer mu.Unlock()
					if reported[me] == nil {
						reported[me] = map[transport.PeerID]bool{}
					}
					reported[me][p] = true
				}
			})
			hostile := transport.PeerID(tr.nodes[3].ID().String())
			for round := range 2 {
				before := slices.Clone(tr.ds[0].Phi)
				tr.round(t, round, 3)
				for j, x := range tr.ds[0].Phi {
					// Honest thetas move by at most 0.01*3*4 per round; the
					// outer step (lr 0.7, Nesterov 0.9) scales that by less
					// than 3. The hostile one moves its by 1000x.
					if d := math.Abs(float64(x - before[j])); d > 0.5 {
						t.Fatalf("round %d: coordinate %d moved by %g: the hostile contribution got through", round, j, d)
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			provable := mode == optimizer.HostilePoison || mode == optimizer.HostileForge
			for i, n := range tr.nodes[:3] {
				got := reported[n.ID().String()]
				if provable && !got[hostile] {
					t.Errorf("honest volunteer %d did not report the %s offender %s: %v", i, mode, hostile, got)
				}
				for p := range got {
					if p != hostile {
						t.Errorf("honest volunteer %d reported honest %s", i, p)
					}
				}
			}
		})
	}
}

// p2pTrainers are DiLoCo trainers over the butterfly on real libp2p
// streams (a p2ptest swarm whose seed does not train).
type p2pTrainers struct {
	nodes  []*p2p.Node
	ds     []*optimizer.DiLoCo
	thetas [][]float32
}

// newP2PTrainers starts m trainers of P parameters on a swarm built with
// opts; configure, if set, adjusts trainer i's collective.
func newP2PTrainers(t testing.TB, m, P int, opts p2ptest.Options, configure func(i int, n *p2p.Node, c *optimizer.ButterflyConfig, o *optimizer.ButterflyOptions)) *p2pTrainers {
	t.Helper()
	sw := p2ptest.NewSwarm(t, m+1, opts)
	tr := &p2pTrainers{nodes: sw.Nodes[1:]}
	deadline := time.Now().Add(p2ptest.Slowdown * 10 * time.Second)
	for {
		ok := true
		for _, n := range tr.nodes {
			if len(volunteerIDs(n)) != m {
				ok = false
			}
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("trainers do not see exactly the %d volunteers", m)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	phi0 := make([]float32, P)
	for i := range phi0 {
		phi0[i] = float32(rng.NormFloat64())
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	tr.ds = make([]*optimizer.DiLoCo, m)
	tr.thetas = make([][]float32, m)
	for i, n := range tr.nodes {
		pp, err := p2p.NewPeers(n, p2p.ProtoReduce, 1<<22, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pp.Close)
		bc := optimizer.DefaultButterflyConfig(P, n.Signer(), butterflyTick.Seconds())
		opt := optimizer.ButterflyOptions{Tick: butterflyTick}
		if os.Getenv("SKEIN_TEST_LOG") != "" {
			opt.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("trainer", i)
		}
		if configure != nil {
			configure(i, n, &bc, &opt)
		}
		r, err := optimizer.NewButterflyDriver(pp, bc, opt)
		if err != nil {
			t.Fatal(err)
		}
		r.Start(ctx)
		t.Cleanup(r.Close)
		if tr.ds[i], err = optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), r, phi0); err != nil {
			t.Fatal(err)
		}
		tr.thetas[i] = append([]float32(nil), phi0...)
	}
	return tr
}

// round runs one outer round on every trainer; the first honest ones must
// succeed and agree.
func (tr *p2pTrainers) round(t testing.TB, round, honest int) { tr.roundGroups(t, round, honest) }

// roundGroups is round, and returns each trainer's group for the round.
func (tr *p2pTrainers) roundGroups(t testing.TB, round, honest int) [][]transport.PeerID {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), p2ptest.Slowdown*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, len(tr.ds))
	groups := make([][]transport.PeerID, len(tr.ds))
	for i := range tr.ds {
		for j := range tr.thetas[i] {
			tr.thetas[i][j] -= 0.01 * float32(i+1) * float32(j%5)
		}
		wg.Go(func() {
			var st optimizer.RoundStats
			st, errs[i] = tr.ds[i].OuterStep(ctx, tr.thetas[i])
			groups[i] = st.Group
		})
	}
	wg.Wait()
	for i, err := range errs[:honest] {
		if err != nil {
			t.Fatalf("round %d, trainer %d: %v", round, i, err)
		}
		if tr.ds[i].StateHash() != tr.ds[0].StateHash() {
			t.Fatalf("round %d: trainer %d disagrees", round, i)
		}
	}
	return groups
}

// volunteerIDs are the members n sees whose role is volunteer.
func volunteerIDs(n *p2p.Node) []p2p.Member {
	var out []p2p.Member
	for _, m := range n.Members() {
		if m.Meta.Role == p2p.RoleVolunteer {
			out = append(out, m)
		}
	}
	return out
}
