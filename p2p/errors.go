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

// ErrInsecureKey is returned when the identity key file is readable by group
// or others, or is a symbolic link (whoever controls the link chooses the
// node's identity).
var ErrInsecureKey = errors.New("p2p: insecure identity key file")

// ErrNoSeed is returned when a node cannot reach any bootstrap address or known peer.
var ErrNoSeed = errors.New("p2p: no bootstrap or known peer reachable")

// ErrBadPeerBook is returned when the persisted peer file cannot be decoded.
var ErrBadPeerBook = errors.New("p2p: malformed peer book")

// ErrBulk is returned for bulk transfer failures reported by the serving peer
// (unknown key, range out of bounds) or malformed bulk headers.
var ErrBulk = errors.New("p2p: bulk transfer refused")

// ErrClosed is returned by operations on a closed node.
var ErrClosed = errors.New("p2p: node closed")

// Admission errors (admission.go). A node refused by a peer it joins
// through gets a *NotAdmittedError wrapping ErrNotAdmitted and the reason.
var (
	// ErrNotAdmitted is returned when a run refuses this node, or a member
	// refuses another: the errors below say why.
	ErrNotAdmitted = errors.New("p2p: not admitted to the run")
	// ErrTokenMissing: the run is closed and the node has no join token.
	ErrTokenMissing = errors.New("p2p: the run is closed and the node has no join token")
	// ErrTokenMalformed: the bytes are not a token (format, bounds).
	ErrTokenMalformed = errors.New("p2p: malformed join token")
	// ErrTokenForged: the token is not signed by the run key.
	ErrTokenForged = errors.New("p2p: join token not signed by the run key")
	// ErrTokenExpired: the token's expiry has passed.
	ErrTokenExpired = errors.New("p2p: join token expired")
	// ErrTokenWrongPeer: the token names another peer than its holder.
	ErrTokenWrongPeer = errors.New("p2p: join token issued to another peer")
	// ErrTokenWrongRun: the token is for another run.
	ErrTokenWrongRun = errors.New("p2p: join token for another run")
	// ErrTokenWrongRole: the token's role is not the one the node claims.
	ErrTokenWrongRole = errors.New("p2p: join token for another role")
	// ErrRunFull: the run has Admission.MaxMembers members.
	ErrRunFull = errors.New("p2p: the run has its maximum of members")
	// ErrPrefixFull: the node's address prefix has Admission.MaxPerPrefix
	// members.
	ErrPrefixFull = errors.New("p2p: the run has its maximum of members behind this address prefix")
)
