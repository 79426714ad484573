package p2p

import (
	"context"
	"fmt"

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
