package p2p

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/peer"
)

// JoinPastTheDoor joins n to the run through addr with memberlist alone,
// skipping the admission handshake, as a node that does not follow the
// protocol would: the tests check that membership and the stream gate
// refuse it on their own.
func JoinPastTheDoor(ctx context.Context, n *Node, addr string) (int, error) {
	ai, err := peer.AddrInfoFromString(addr)
	if err != nil {
		return 0, err
	}
	if err := n.h.Connect(ctx, *ai); err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	return n.ml.Join([]string{n.joinString(ai.ID)})
}

// NumMemberlistMembers counts the nodes n's memberlist holds alive,
// whatever its member table says.
func NumMemberlistMembers(n *Node) int { return n.ml.NumMembers() }

// ForgeDead sends, from n, a memberlist packet to peer to that declares
// victim dead at incarnation inc, naming from as the accuser: what a
// hostile member can do, since memberlist's dead messages are unsigned.
func ForgeDead(n *Node, to, victim peer.ID, from string, inc uint32) error {
	_, err := n.tr.WriteToAddress(encodeAccusation(true, victim.String(), from, inc), memberlist.Address{Name: to.String()})
	return err
}

// Accusations describes the suspect and dead messages about id that n
// received.
func Accusations(n *Node, id peer.ID) []string { return n.tr.accused.about(id, time.Now()) }

// DisputeTimeout bounds a disputed member's direct check.
const DisputeTimeout = disputeTimeout

// BookRole is the role n's peer book records for id (false: no record).
func BookRole(n *Node, id peer.ID) (Role, bool) {
	n.book.mu.Lock()
	defer n.book.mu.Unlock()
	r, ok := n.book.recs[id]
	return r.Role, ok
}
