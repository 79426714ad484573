package replica

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/skein-ml/skein/transport"
)

func TestWitnessesWindow(t *testing.T) {
	_, ids := newKeys(4)
	w := NewWitnesses(time.Minute)
	t0 := time.Unix(1000, 0)
	if got := w.Observe(t0, ids[:3]); !slices.Equal(got, ids[:3]) {
		t.Fatalf("at first: %v", got)
	}
	// ids[2] drops out; it still counts within the window.
	if got := w.Observe(t0.Add(30*time.Second), ids[:2]); !slices.Equal(got, ids[:3]) {
		t.Fatalf("within the window: %v", got)
	}
	if got := w.Observe(t0.Add(61*time.Second), []transport.PeerID{ids[3], ids[0]}); !slices.Equal(got, []transport.PeerID{ids[0], ids[1], ids[3]}) {
		t.Fatalf("past ids[2]'s window: %v", got)
	}
	if got := w.Observe(t0.Add(200*time.Second), nil); len(got) != 0 {
		t.Fatalf("past everyone's window: %v", got)
	}
}

// The memory is bounded: the most recently seen stay.
func TestWitnessesBounded(t *testing.T) {
	w := NewWitnesses(time.Hour)
	t0 := time.Unix(1000, 0)
	old := make([]transport.PeerID, maxWitnesses)
	for i := range old {
		old[i] = transport.PeerID(fmt.Sprintf("old-%05d", i))
	}
	w.Observe(t0, old)
	fresh := []transport.PeerID{"fresh-1", "fresh-2"}
	got := w.Observe(t0.Add(time.Second), fresh)
	if len(got) != maxWitnesses || !slices.Contains(got, fresh[0]) || !slices.Contains(got, fresh[1]) {
		t.Fatalf("%d kept, fresh kept: %v %v", len(got), slices.Contains(got, fresh[0]), slices.Contains(got, fresh[1]))
	}
	if len(w.seen) != maxWitnesses {
		t.Fatalf("%d remembered", len(w.seen))
	}
}

// The sybils soak's breakdown, replayed: two sybils of five volunteers are
// half of the trusted group of four (the fifth was away that round). One
// honest member of that group is killed and another paused at once; the
// judge (the fifth) then sees the two sybils and one honest volunteer live,
// and the sybils offer a certificate of round 2^62 signed by both. Counted
// against the volunteers live at that moment they were a majority (2 of 3)
// and the judge re-anchored on their state; counted against those seen
// within the window they are 2 of 4. The honest churn case the rule exists
// for still re-anchors, and the sybils win only once the honest volunteers
// have been gone for the whole window.
func TestBookRejoinRemembersAbsentVolunteers(t *testing.T) {
	k, ids := newKeys(5)
	s1, s2, h1, h2 := ids[0], ids[1], ids[2], ids[3]
	group := []transport.PeerID{s1, s2, h1, h2}
	trusted := k.cert("run", 7, 77, group, []transport.PeerID{s1, h1, h2})
	sybil := k.cert("run", 1<<62, 666, []transport.PeerID{s1, s2}, []transport.PeerID{s1, s2})
	if _, err := NewBook("run", k, trusted).Adopt([]*Certificate{sybil}); !errors.Is(err, ErrBrokenChain) {
		t.Fatalf("the sybils' certificate must not extend the chain: %v", err)
	}
	if err := VouchedBy([]transport.PeerID{h1, s1, s2}, sybil); err != nil {
		t.Fatalf("the sybils must be a majority of the judge's live view for this test to mean anything: %v", err)
	}

	w := NewWitnesses(time.Minute)
	t0 := time.Unix(1000, 0)
	w.Observe(t0, group) // round 7: everyone live
	b := NewBook("run", k, trusted)
	if err := b.Rejoin(sybil, w.Observe(t0.Add(10*time.Second), []transport.PeerID{h1, s1, s2})); !errors.Is(err, ErrMinority) || b.Trusted() != trusted {
		t.Fatalf("re-anchored on the sybils' certificate while an honest volunteer was away: %v", err)
	}
	// A certificate signed by the sybils alone never rejoins a chain whose
	// group they are less than half of.
	b2 := NewBook("run", k, k.cert("run", 7, 77, ids, ids[1:]))
	if err := b2.Rejoin(sybil, []transport.PeerID{s1, s2}); !errors.Is(err, ErrMinority) {
		t.Fatalf("sybils of less than half the group: %v", err)
	}
	// Honest churn (the lone-jump soak's case): the judge j straggled in
	// round 8 and s1 voted apart, so round 8's certificate holds only half
	// of round 7's group; the judge, with every volunteer it saw still
	// live, re-anchors on it.
	j := ids[4]
	hb := NewBook("run", k, k.cert("run", 7, 77, []transport.PeerID{s1, h1, h2, j}, []transport.PeerID{s1, h1, h2, j}))
	honest := k.cert("run", 8, 88, []transport.PeerID{s1, h1, h2}, []transport.PeerID{h1, h2})
	hw := NewWitnesses(time.Minute)
	hw.Observe(t0, []transport.PeerID{s1, h1, h2})
	if err := hb.Rejoin(honest, hw.Observe(t0.Add(20*time.Second), []transport.PeerID{s1, h1, h2})); err != nil || hb.Trusted() != honest {
		t.Fatalf("honest churn: %v", err)
	}
	// The breakdown: h2 gone for the whole window, the sybils a majority
	// of everyone seen within it.
	b3 := NewBook("run", k, trusted)
	w.Observe(t0.Add(100*time.Second), []transport.PeerID{h1, s1, s2})
	if err := b3.Rejoin(sybil, w.Observe(t0.Add(100*time.Second), []transport.PeerID{h1, s1, s2})); err != nil {
		t.Fatalf("past the window the rule is the live majority's again: %v", err)
	}
}

// The bootstrap's anchor outranks a broken chain: a member whose chain
// does not extend takes the chain that extends the bootstrap's anchor (past
// its trusted round), and not one that does not.
func TestBookAdoptFromBrokenChain(t *testing.T) {
	k, ids := newKeys(6)
	trusted := k.cert("run", 7, 77, ids[:4], ids[:3])
	anchor := k.cert("run", 9, 99, ids[2:6], ids[2:5])
	next := k.cert("run", 10, 100, ids[2:6], ids[2:6])
	sybil := k.cert("run", 10, 666, ids[:2], ids[:2])

	b := NewBook("run", k, trusted)
	if _, err := b.AdoptFrom(anchor, []*Certificate{sybil}); !errors.Is(err, ErrBrokenChain) || b.Trusted() != trusted {
		t.Fatalf("a chain that extends neither: %v", err)
	}
	last, err := b.AdoptFrom(anchor, []*Certificate{anchor, next})
	if err != nil || last != next {
		t.Fatalf("the chain from the bootstrap's anchor: %v", err)
	}
	if c, ok := b.At(9); !ok || c != anchor {
		t.Fatal("the anchor is not in the trusted chain")
	}
	if _, ok := b.At(7); ok {
		t.Fatal("the broken chain was kept")
	}
	// An anchor at or before the trusted round does not replace a chain.
	b = NewBook("run", k, next)
	if _, err := b.AdoptFrom(anchor, []*Certificate{k.cert("run", 11, 666, ids[:2], ids[:2])}); !errors.Is(err, ErrBrokenChain) {
		t.Fatal("an older anchor let a chain that does not extend in")
	}
	// A chain that extends is adopted as by Adopt, whatever the anchor.
	b = NewBook("run", k, anchor)
	if last, err := b.AdoptFrom(trusted, []*Certificate{next}); err != nil || last != next {
		t.Fatalf("extends: %v", err)
	}
}
