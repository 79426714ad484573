package p2p

import "errors"

// ErrWrongRun is returned when a peer belongs to another run id. Joins to such a
// peer are refused and its membership messages ignored.
var ErrWrongRun = errors.New("p2p: peer belongs to another run")

// ErrFrameTooLarge is returned when a frame's declared length exceeds the limit
// of the stream it arrives on; it is detected before any allocation.
var ErrFrameTooLarge = errors.New("p2p: frame too large")

// ErrBadFrame is returned for a frame with an unknown version or reserved bits set.
var ErrBadFrame = errors.New("p2p: malformed frame")

// ErrBadMeta is returned when node metadata cannot be decoded or is too large.
var ErrBadMeta = errors.New("p2p: malformed node metadata")

// ErrInsecureKey is returned when the identity key file is readable by group or others.
var ErrInsecureKey = errors.New("p2p: identity key file is readable by others")

// ErrNoSeed is returned when a node cannot reach any bootstrap address or known peer.
var ErrNoSeed = errors.New("p2p: no bootstrap or known peer reachable")

// ErrBadPeerBook is returned when the persisted peer file cannot be decoded.
var ErrBadPeerBook = errors.New("p2p: malformed peer book")

// ErrBulk is returned for bulk transfer failures reported by the serving peer
// (unknown key, range out of bounds) or malformed bulk headers.
var ErrBulk = errors.New("p2p: bulk transfer refused")

// ErrClosed is returned by operations on a closed node.
var ErrClosed = errors.New("p2p: node closed")
