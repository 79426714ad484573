// Package transport is the vocabulary every protocol core shares with the
// network, in the manner of go-libp2p's core/: member IDs, messages, the
// Peers interface a collective or the pipeline relay sends and receives
// through, the Signer that signs and checks their messages, the Outbox that
// queues sends per destination, and MemNetwork, an in-memory network with
// fault injection for tests and in-process swarms. It is a leaf: it imports
// nothing of Skein. p2p implements Peers over libp2p; optimizer and pipeline
// use it and must not reach for a concrete network.
package transport

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

// Peers is everything a protocol core needs from the network. The p2p layer
// implements it over libp2p streams; MemNetwork implements it in memory with
// fault injection. Implementations must be safe for concurrent use.
type Peers interface {
	// Self is this member's ID.
	Self() PeerID
	// Members lists the members currently believed alive, self included, in
	// any order.
	Members() []PeerID
	// Send delivers payload to one peer, or fails (ErrPeerGone for a peer
	// known to be dead). The caller does not reuse payload after Send
	// returns, and the implementation must not retain it past delivery.
	Send(ctx context.Context, to PeerID, payload []byte) error
	// Recv blocks for the next message addressed to this member.
	Recv(ctx context.Context) (Message, error)
}

// Signer signs this member's messages and checks the others'. In
// production it is the node's libp2p identity (the peer ID embeds the
// public key); tests use deterministic ed25519 keys.
type Signer interface {
	Sign(msg []byte) ([]byte, error)
	Verify(id PeerID, msg, sig []byte) bool
}

// Errors of a transport; callers test them with errors.Is.
var (
	// ErrPeerGone: the peer is not reachable (dead, left, or killed in tests).
	ErrPeerGone = errors.New("transport: peer gone")
	// ErrClosed: this member's endpoint is closed.
	ErrClosed = errors.New("transport: endpoint closed")
)
