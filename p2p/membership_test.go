package p2p_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// TestSwarm16Join: 16 nodes join and all see all (NewSwarm waits for it,
// within its own generous deadline). How long that takes is a figure of
// bench/join_time.sh, not a test: a time budget here failed on a machine
// busy with other tests (10.07 s against 10 s).
func TestSwarm16Join(t *testing.T) {
	start := time.Now()
	s := p2ptest.NewSwarm(t, 16, p2ptest.Options{})
	t.Logf("16 nodes started and see 16 members in %v", time.Since(start))
	// Every member carries valid metadata of this run.
	for _, m := range s.Nodes[3].Members() {
		if m.Meta.RunID != "test" {
			t.Errorf("member %s has run %q", m.ID, m.Meta.RunID)
		}
	}
	// A metadata update propagates to everyone.
	sub := s.Nodes[1].Subscribe()
	defer sub.Close()
	target := s.Nodes[5]
	if err := target.UpdateMeta(context.Background(), func(m *p2p.Meta) {
		m.Stage = 3
		m.Device = "cuda:H100"
		m.ComputeTFLOPS = 400
	}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := s.Eventually(5*time.Second, func() error {
		for i, n := range s.Nodes {
			m, ok := n.Member(target.ID())
			if !ok || m.Meta.Stage != 3 || m.Meta.Device != "cuda:H100" {
				return errors.New("node " + string(rune('0'+i)) + " has not seen the update")
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("metadata update seen by all in %v", time.Since(t0))
	// AnnounceMeta returns before the broadcast and gossip still carries
	// it to everyone.
	if err := s.Nodes[7].AnnounceMeta(func(m *p2p.Meta) { m.Round, m.RunID = 41, "other" }); err != nil {
		t.Fatal(err)
	}
	if got := s.Nodes[7].Meta(); got.Round != 41 || got.RunID != "test" {
		t.Fatalf("after AnnounceMeta: round %d, run %q; want 41 and the run's ID kept", got.Round, got.RunID)
	}
	if err := s.Eventually(5*time.Second, func() error {
		for i, n := range s.Nodes {
			if m, ok := n.Member(s.Nodes[7].ID()); !ok || m.Meta.Round != 41 {
				return fmt.Errorf("node %d has not seen the announcement", i)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The subscriber saw the 16 members join, then the update. Another
	// member's events in between are membership noise, not this test's
	// subject: under -race on a busy machine a starved node is suspected
	// and comes back (seen once in CI: a "fail" before the update).
	joined := map[peer.ID]bool{}
	for ev := range sub.C {
		switch {
		case ev.Kind == p2p.EventJoin:
			joined[ev.Member.ID] = true
			continue
		case ev.Member.ID != target.ID():
			t.Logf("event %v of %s before the update (membership noise under load)", ev.Kind, ev.Member.ID)
			continue
		case ev.Kind != p2p.EventUpdate || len(joined) != 16:
			t.Fatalf("event %v of the target after %d members joined; want its update after 16", ev.Kind, len(joined))
		}
		break
	}
}

// waitGone waits until every node in nodes stops seeing id and returns the
// latest time any of them took, or fails after timeout.
func waitGone(t *testing.T, s *p2ptest.Swarm, id peer.ID, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := s.Eventually(timeout, func() error {
		for i, n := range s.Live() {
			if p2ptest.Sees(n, id) {
				return fmt.Errorf("node %d still sees %s", i, id)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

func TestFailureAndLeave(t *testing.T) {
	const n = 8
	timing := p2ptest.Timing()
	s := p2ptest.NewSwarm(t, n, p2ptest.Options{Timing: timing})
	sub := s.Nodes[1].Subscribe()
	defer sub.Close()

	// A node that vanishes without leaving is declared failed by everyone
	// within the failure window.
	victim := s.Nodes[n-1]
	s.Remove(victim)
	victim.Shutdown()
	window := timing.FailureWindow(n)
	took := waitGone(t, s, victim.ID(), 3*window)
	t.Logf("silent node marked failed by all in %v (window %v)", took, window)
	if took > window+(p2ptest.Slowdown-1)*time.Second {
		t.Errorf("failure detection took %v, window %v", took, window)
	}
	expectEvent(t, sub, victim.ID(), p2p.EventFail)

	// A graceful leave propagates faster and is reported as a leave.
	leaver := s.Nodes[n-2]
	s.Remove(leaver)
	t0 := time.Now()
	if err := leaver.Close(); err != nil {
		t.Fatal(err)
	}
	leaveTook := waitGone(t, s, leaver.ID(), window)
	t.Logf("graceful leave seen by all in %v (Close took %v)", leaveTook, time.Since(t0)-leaveTook)
	// Compared with the failure window, not with the one failure measured
	// above: that one can come early (a probe right after the shutdown),
	// and under load a leave's gossip then loses a race it need not win.
	if leaveTook >= window {
		t.Errorf("leave took %v, not faster than the failure window %v (failure took %v)", leaveTook, window, took)
	}
	expectEvent(t, sub, leaver.ID(), p2p.EventLeave)
}

// expectEvent reads sub until an event about id arrives and checks its kind.
func expectEvent(t *testing.T, sub *p2p.Subscription, id peer.ID, want p2p.EventKind) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-sub.C:
			if ev.Member.ID != id || ev.Kind == p2p.EventJoin || ev.Kind == p2p.EventUpdate {
				continue
			}
			if ev.Kind != want {
				t.Fatalf("event %v for %s, want %v", ev.Kind, id, want)
			}
			return
		case <-timeout:
			t.Fatalf("no %v event for %s", want, id)
		}
	}
}

func TestWrongRunRefused(t *testing.T) {
	s := p2ptest.NewSwarm(t, 3, p2ptest.Options{})
	cfg := s.NodeConfig(9)
	cfg.RunID = "other-run"
	n, err := p2p.NewNode(context.Background(), cfg)
	if err == nil {
		n.Shutdown()
		t.Fatal("node of another run joined")
	}
	if !errors.Is(err, p2p.ErrWrongRun) {
		t.Fatalf("err = %v, want ErrWrongRun", err)
	}
	t.Logf("refused: %v", err)
	for i, n := range s.Nodes {
		if n.NumMembers() != 3 {
			t.Errorf("node %d sees %d members, want 3", i, n.NumMembers())
		}
	}
}

func TestBootstrapRestart(t *testing.T) {
	s := p2ptest.NewSwarm(t, 5, p2ptest.Options{Persist: true})
	seed := s.Seed
	seedID := seed.ID()
	seedAddr := seed.FullAddr().String()
	// Let every node save its peer book.
	time.Sleep(1500 * time.Millisecond)

	// The bootstrap goes away: members keep their view of each other.
	s.Remove(seed.Node)
	seed.Shutdown()
	waitGone(t, s, seedID, 3*s.Opts.Timing.FailureWindow(5))
	for i, n := range s.Live() {
		if n.NumMembers() != 4 {
			t.Fatalf("node %d sees %d members, want 4", i, n.NumMembers())
		}
	}

	// A new node joins through a member's address (the dead seed listed first).
	cfg := s.NodeConfig(5)
	cfg.Bootstrap = []string{seedAddr, s.Live()[0].Addrs()[0].String()}
	nn, err := s.Add(cfg)
	if err != nil {
		t.Fatalf("join through a member: %v", err)
	}
	s.WaitMembers(5, 10*time.Second)
	_ = nn

	// The seed restarts with the same identity (same data dir, new port) and
	// rejoins through its peer book; everyone sees it again.
	seed2, err := p2p.NewSeed(context.Background(), s.SeedConfig())
	if err != nil {
		t.Fatal(err)
	}
	s.Adopt(seed2.Node)
	if seed2.ID() != seedID {
		t.Fatalf("restarted seed has ID %s, want %s", seed2.ID(), seedID)
	}
	s.WaitMembers(6, 15*time.Second)
}

// TestDepartedPeersForgotten: once a member has left, or failed, and stayed
// away for ForgetAfter, nothing of it is left in another node's peerstore:
// no addresses, keys, protocols or metadata. libp2p alone would keep its
// addresses for good (and its keys and protocols for a minute).
func TestDepartedPeersForgotten(t *testing.T) {
	const forgetAfter = time.Second
	timing := p2ptest.Timing()
	timing.GossipToTheDeadTime = forgetAfter
	s := p2ptest.NewSwarm(t, 5, p2ptest.Options{Timing: timing, Node: func(i int, c *p2p.NodeConfig) {
		c.ForgetAfter = forgetAfter // RejoinInterval is 1 s in p2ptest
	}})
	obs, leaver, victim, stayer := s.Nodes[1], s.Nodes[2], s.Nodes[3], s.Nodes[4]
	ps := obs.Host().Peerstore()
	// left reports what of id is still in ps.
	left := func(id peer.ID) []string {
		var out []string
		if a := ps.Addrs(id); len(a) > 0 {
			out = append(out, fmt.Sprintf("addresses %v", a))
		}
		for _, p := range ps.Peers() {
			if p == id {
				out = append(out, "listed in Peers")
			}
		}
		if p, _ := ps.GetProtocols(id); len(p) > 0 {
			out = append(out, fmt.Sprintf("%d protocols", len(p)))
		}
		if _, err := ps.Get(id, "AgentVersion"); err == nil {
			out = append(out, "metadata")
		}
		return out
	}
	if err := s.Eventually(10*time.Second, func() error {
		for _, n := range []*p2p.Node{leaver, victim, stayer} {
			if l := left(n.ID()); len(l) < 4 {
				return fmt.Errorf("member %s is not fully in the peerstore: %v", n.ID(), l)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Well before libp2p's own cleanup (a minute for keys, never for
	// addresses).
	budget := 10*time.Second + p2ptest.Slowdown*5*time.Second
	forgotten := func(n *p2p.Node, how string) {
		t.Helper()
		start := time.Now()
		if err := s.Eventually(budget, func() error {
			if l := left(n.ID()); len(l) > 0 {
				return fmt.Errorf("%s member %s still in the peerstore: %v", how, n.ID(), l)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s member forgotten %v after every node saw it go", how, time.Since(start))
	}

	s.Remove(leaver)
	if err := leaver.Close(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, s, leaver.ID(), timing.FailureWindow(5))
	forgotten(leaver, "left")

	s.Remove(victim)
	victim.Shutdown()
	waitGone(t, s, victim.ID(), 3*timing.FailureWindow(5))
	forgotten(victim, "failed")

	// Members stay.
	for _, n := range []*p2p.Node{s.Nodes[0], stayer} {
		if l := left(n.ID()); len(l) < 4 {
			t.Errorf("member %s lost peerstore state: only %v", n.ID(), l)
		}
	}
}
