package optimizer

import (
	"context"
	"errors"
)

// PeerID names a member of the swarm (a libp2p peer ID in production).
type PeerID string

// Message is one payload received from a peer.
type Message struct {
	From    PeerID
	Payload []byte
}

// Peers is everything the optimizer needs from the network. The p2p layer
// implements it over libp2p streams; MemNetwork implements it in memory with
// fault injection. Implementations must be safe for concurrent use.
type Peers interface {
	// Self is this member's ID.
	Self() PeerID
	// Members lists the members currently believed alive, self included, in
	// any order.
	Members() []PeerID
	// Send delivers payload to one peer, or fails (ErrPeerGone for a peer
	// known to be dead). The optimizer does not reuse payload after Send
	// returns, and the implementation must not retain it past delivery.
	Send(ctx context.Context, to PeerID, payload []byte) error
	// Recv blocks for the next message addressed to this member.
	Recv(ctx context.Context) (Message, error)
}

// Errors of the collectives; callers test them with errors.Is.
var (
	// ErrPeerGone: the peer is not reachable (dead, left, or killed in tests).
	ErrPeerGone = errors.New("optimizer: peer gone")
	// ErrClosed: this member's endpoint is closed.
	ErrClosed = errors.New("optimizer: endpoint closed")
	// ErrNotMember: this member is not in the group it was asked to reduce in.
	ErrNotMember = errors.New("optimizer: self not among members")
	// ErrBadMessage: a peer sent bytes that do not decode; it is dropped.
	ErrBadMessage = errors.New("optimizer: malformed message")
	// ErrRejected: a peer's contribution failed validation (shape, finiteness
	// or norm bound) and was dropped.
	ErrRejected = errors.New("optimizer: contribution rejected")
)
