package p2p

import (
	"testing"

	"github.com/skein-ml/skein/transport"
)

// TestInboxBudgets: a peer flooding the inbox fills only its own share;
// another peer's messages still get in, and draining frees the share.
func TestInboxBudgets(t *testing.T) {
	p := &Peers{perPeer: 100, total: 250, queued: map[transport.PeerID]int64{}}
	for i := range 10 {
		if got, want := p.reserve("flood", 30), i < 3; got != want {
			t.Fatalf("flood message %d: reserved %v, want %v", i, got, want)
		}
	}
	if !p.reserve("honest", 100) {
		t.Fatal("the honest peer's message was refused during the flood")
	}
	if p.reserve("third", 100) {
		t.Fatal("past the total budget")
	}
	p.release("flood", 30)
	if !p.reserve("flood", 30) || p.reserve("flood", 11) {
		t.Fatal("the flood's share is not freed by draining, or not bounded after")
	}
	p.release("honest", 100)
	if p.queued["honest"] != 0 || p.queuedAll != 90 {
		t.Fatalf("accounting: %v, total %d", p.queued, p.queuedAll)
	}
}
