package p2p_test

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// A hostile member gossips forged dead messages about a live member, over
// and over: the honest nodes keep listing it, report no failure, and warn,
// naming the hostile node as the sender. A member that really dies is still
// reported failed, within the failure window plus one direct check.
func TestForgedDeathDisputed(t *testing.T) {
	const n = 4
	rec := p2p.NewLogRecorder()
	s := p2ptest.NewSwarm(t, n, p2ptest.Options{Logger: slog.New(rec)})
	honest := []*p2p.Node{s.Nodes[0], s.Nodes[1]}
	victim, hostile := s.Nodes[2], s.Nodes[3]
	var subs []*p2p.Subscription
	for _, h := range honest {
		sub := h.Subscribe()
		defer sub.Close()
		subs = append(subs, sub)
	}

	// A forged death every 250 ms for 4 s, each with an incarnation above
	// the victim's last refutation so that memberlist believes it; the
	// honest nodes' member lists are sampled every 10 ms meanwhile.
	const forger = "forger" // the accuser the messages name: anything
	var inc uint32
	forged, samples := 0, 0
	var last time.Time
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if time.Since(last) >= 250*time.Millisecond {
			inc += 1 << 16
			for _, to := range []*p2p.Node{honest[0], honest[1], victim} {
				if err := p2p.ForgeDead(hostile, to.ID(), victim.ID(), forger, inc); err != nil {
					t.Fatal(err)
				}
			}
			forged++
			last = time.Now()
		}
		for i, h := range honest {
			if !listed(h.Members(), victim.ID()) {
				for _, r := range rec.Records(slog.LevelDebug, "answer") { // why: the dispute's verdicts
					t.Logf("%v %s %v", r.Level, r.Msg, r.Attrs)
				}
				t.Fatalf("honest node %d dropped the victim after %d forged deaths", i, forged)
			}
		}
		samples++
	}
	t.Logf("%d forged deaths, victim listed by the honest nodes in all %d samples", forged, samples)

	// memberlist believed them (the nodes disputed the verdict), and each
	// honest node's warning names the hostile node as a sender.
	if err := s.Eventually(10*time.Second, func() error {
		for i := range honest {
			if w := warningsAbout(rec, i, victim.ID(), hostile.ID()); w == 0 {
				return fmt.Errorf("honest node %d has not warned that the victim answers, naming %s", i, hostile.ID())
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := range honest {
		t.Logf("honest node %d: %d warnings naming the hostile sender", i, warningsAbout(rec, i, victim.ID(), hostile.ID()))
	}
	for i, sub := range subs {
		for _, ev := range drain(sub, 200*time.Millisecond) {
			if ev.Member.ID == victim.ID() && (ev.Kind == p2p.EventFail || ev.Kind == p2p.EventLeave) {
				t.Fatalf("honest node %d reported the victim's %v", i, ev.Kind)
			}
		}
	}

	// The last forged death refuted: every memberlist holds the victim
	// alive again (so that the kill below is memberlist's to detect, and
	// its own suspect and dead messages are sent).
	if err := s.Eventually(10*time.Second, func() error {
		for i, h := range s.Nodes {
			if k := p2p.NumMemberlistMembers(h); k != n {
				return fmt.Errorf("node %d's memberlist holds %d alive, want %d", i, k, n)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// The victim dies for real: everyone reports it failed.
	s.Remove(victim)
	victim.Shutdown()
	window := s.Opts.Timing.FailureWindow(n)
	took := waitGone(t, s, victim.ID(), 3*window)
	t.Logf("killed victim dropped by all in %v (window plus one check %v)", took, window)
	if took > window+(p2ptest.Slowdown-1)*time.Second {
		t.Errorf("failure detection took %v, window plus one check %v", took, window)
	}
	for _, sub := range subs {
		expectEvent(t, sub, victim.ID(), p2p.EventFail)
	}
	// memberlist's own suspect or dead messages about it, in memberlist's
	// encoding, were read (accusation.go).
	if err := s.Eventually(20*time.Second, func() error {
		var seen []string
		for _, h := range s.Live() {
			for _, a := range p2p.Accusations(h, victim.ID()) {
				if !strings.Contains(a, strconv.Quote(forger)) {
					t.Logf("read from memberlist: %s", a)
					return nil
				}
				seen = append(seen, a)
			}
		}
		return fmt.Errorf("no node read memberlist's own accusation of the killed victim; read %q", seen)
	}); err != nil {
		t.Fatal(err)
	}
}

func listed(ms []p2p.Member, id peer.ID) bool {
	for _, m := range ms {
		if m.ID == id {
			return true
		}
	}
	return false
}

// warningsAbout counts node i's warnings that member answers directly and
// whose accusations name sender.
func warningsAbout(rec *p2p.LogRecorder, i int, member, sender peer.ID) int {
	k := 0
	for _, w := range rec.Records(slog.LevelWarn, "answers directly") {
		if w.Attrs["node"].String() == strconv.Itoa(i) && w.Attrs["member"].String() == member.String() &&
			strings.Contains(w.Attrs["accusations"].String(), sender.String()) {
			k++
		}
	}
	return k
}

// drain returns the events sub delivers until none comes for quiet.
func drain(sub *p2p.Subscription, quiet time.Duration) []p2p.Event {
	var out []p2p.Event
	for {
		select {
		case ev := <-sub.C:
			out = append(out, ev)
		case <-time.After(quiet):
			return out
		}
	}
}
