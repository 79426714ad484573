package replica

import (
	"crypto/ed25519"
	"errors"
	"testing"

	"github.com/skein-ml/skein/transport"
)

// Members of a round vote; the third vote of four forms the certificate,
// which the next member behind takes as a chain; forged and outside votes
// count for nothing.
func TestBookVotes(t *testing.T) {
	k, ids := newKeys(6)
	genesis := &Certificate{Run: "run", Hash: 1}
	g := ids[:4]
	books := make([]*Book, len(g))
	votes := make([]*Certificate, len(g))
	for i, id := range g {
		books[i] = NewBook("run", k, genesis)
		v, err := books[i].Vote(1, 0xaa, g, id, k.signAs(id))
		if err != nil {
			t.Fatal(err)
		}
		votes[i] = v
	}
	b := books[0]
	// Sybils' votes for a group of their own, all of them, form nothing
	// here: this member did not vote in that group.
	sybils := ids[4:6]
	for _, id := range sybils {
		if c, err := b.AddVote(k.cert("run", 1, 0xee, sybils, []transport.PeerID{id}), id); err != nil || c != nil {
			t.Fatalf("a sybil's vote: %v, formed %v", err, c != nil)
		}
	}
	// A vote from outside the group (for another group: it counts for
	// nothing here), a forged one (member 1's name, member 4's key), member
	// 1's signature claimed by member 2, and member 3 voting for another
	// state first (its later vote for 0xaa is ignored).
	outside := k.cert("run", 1, 0xaa, append([]transport.PeerID{ids[4]}, g...), ids[4:5])
	forged := k.cert("run", 1, 0xaa, g, nil)
	forged.Sigs[1] = ed25519.Sign(k[ids[4]], VoteBytes("run", 1, 0xaa, g))
	for _, bad := range []struct {
		v    *Certificate
		from transport.PeerID
	}{{outside, ids[4]}, {forged, g[1]}, {votes[1], g[2]}} {
		if c, _ := b.AddVote(bad.v, bad.from); c != nil {
			t.Fatalf("a bad vote from %s formed a certificate", bad.from)
		}
	}
	if _, err := b.AddVote(forged, g[1]); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("forged vote: %v", err)
	}
	other := k.cert("run", 1, 0xcc, g, g[3:4])
	if c, err := b.AddVote(other, g[3]); err != nil || c != nil {
		t.Fatalf("member 3's vote for another state: %v", err)
	}
	if c, _ := b.AddVote(votes[3], g[3]); c != nil {
		t.Fatal("member 3 voted twice in one round")
	}
	if c, err := b.AddVote(votes[1], g[1]); err != nil || c != nil {
		t.Fatalf("two votes of four formed a certificate (%v)", err)
	}
	c, err := b.AddVote(votes[2], g[2])
	if err != nil || c == nil || b.Trusted() != c {
		t.Fatalf("three votes of four: %v", err)
	}
	if err := c.Verify("run", k); err != nil {
		t.Fatal(err)
	}
	// A member that missed the votes takes the chain from b.
	late := NewBook("run", k, genesis)
	if got, err := late.Adopt(b.Chain(0, 8)); err != nil || got.Hash != 0xaa {
		t.Fatalf("adopting the chain: %v", err)
	}
	// A minority's chain is refused.
	// (Refused as a broken chain before any signature is checked.)
	if _, err := NewBook("run", k, c).Adopt([]*Certificate{k.cert("run", 2, 0xbb, g, g[:2])}); !errors.Is(err, ErrMinority) && !errors.Is(err, ErrBrokenChain) {
		t.Fatalf("a minority's certificate was adopted: %v", err)
	}
}

// A chain broken by churn and dissent (round 2's signers hold only half of
// round 1's group) is not extended, but may be re-anchored on a verified
// certificate of a later round; a forged or older one is refused.
func TestBookReanchor(t *testing.T) {
	k, ids := newKeys(6)
	c1 := k.cert("run", 1, 11, ids[:4], ids[:4])
	b := NewBook("run", k, c1)
	c2 := k.cert("run", 2, 22, ids[:3], ids[:2]) // 2 of 3 signed; only 2 of round 1's 4
	if _, err := b.Adopt([]*Certificate{c2}); !errors.Is(err, ErrBrokenChain) {
		t.Fatalf("a broken chain was adopted: %v", err)
	}
	forged := k.cert("run", 2, 22, ids[:3], ids[:2])
	forged.Hash = 23
	if err := b.Reanchor(forged); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("forged: %v", err)
	}
	if err := b.Reanchor(c2); err != nil || b.Trusted() != c2 {
		t.Fatalf("re-anchoring: %v", err)
	}
	if err := b.Reanchor(c1); !errors.Is(err, ErrBrokenChain) {
		t.Fatalf("an older certificate: %v", err)
	}
}

// Swing: a member that ended the round apart takes the state two others of
// its group hold when its vote would certify it; not one member's state.
func TestBookSwing(t *testing.T) {
	k, ids := newKeys(4)
	g := ids[:4]
	b := NewBook("run", k, &Certificate{Run: "run", Hash: 1})
	if _, err := b.Vote(1, 0xbb, g, ids[0], k.signAs(ids[0])); err != nil {
		t.Fatal(err)
	}
	// A hostile member votes for its own state: one vote is not enough.
	b.AddVote(k.cert("run", 1, 0xee, g, ids[3:4]), ids[3])
	if _, ok := b.Swing(1, 0xbb); ok {
		t.Fatal("swung to one member's state")
	}
	b.AddVote(k.cert("run", 1, 0xaa, g, ids[1:2]), ids[1])
	if _, ok := b.Swing(1, 0xbb); ok {
		t.Fatal("swung to one member's state")
	}
	b.AddVote(k.cert("run", 1, 0xaa, g, ids[2:3]), ids[2])
	c, ok := b.Swing(1, 0xbb)
	if !ok || c.Hash != 0xaa {
		t.Fatalf("two of the other three hold 0xaa: swing %v", ok)
	}
	// Two sybils in a group of five are not a tie: with this member's vote
	// they would be 3 of 5, but 2 of 5 signatures is not half the group.
	k5, ids5 := newKeys(5)
	b5 := NewBook("run", k5, &Certificate{Run: "run", Hash: 1})
	if _, err := b5.Vote(1, 0xbb, ids5, ids5[0], k5.signAs(ids5[0])); err != nil {
		t.Fatal(err)
	}
	for _, s := range ids5[3:5] {
		b5.AddVote(k5.cert("run", 1, 0xee, ids5, []transport.PeerID{s}), s)
	}
	if c, ok := b5.Swing(1, 0xbb); ok {
		t.Fatalf("swung to two sybils' state %x in a group of five", c.Hash)
	}
	// A group of four split in halves (0xbb: this member and one other;
	// 0xaa and 0xcc: the other two members' states as each half sees it):
	// the half with the larger hash swings, the other stays, so they meet.
	for _, tc := range []struct {
		mine, theirs uint64
		swing        bool
	}{{0xbb, 0xaa, true}, {0xbb, 0xcc, false}} {
		k4, ids4 := newKeys(4)
		b4 := NewBook("run", k4, &Certificate{Run: "run", Hash: 1})
		if _, err := b4.Vote(1, tc.mine, ids4, ids4[0], k4.signAs(ids4[0])); err != nil {
			t.Fatal(err)
		}
		b4.AddVote(k4.cert("run", 1, tc.mine, ids4, ids4[1:2]), ids4[1])
		for _, s := range ids4[2:4] {
			b4.AddVote(k4.cert("run", 1, tc.theirs, ids4, []transport.PeerID{s}), s)
		}
		if _, ok := b4.Swing(1, tc.mine); ok != tc.swing {
			t.Errorf("split 2-2, mine %x, theirs %x: swing %v, want %v", tc.mine, tc.theirs, ok, tc.swing)
		}
	}
}
