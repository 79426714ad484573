package p2p

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Admission: who may be a member of a run.
//
// An open run admits anyone, up to Admission.MaxMembers members and
// Admission.MaxPerPrefix members behind one address prefix (a /24 for IPv4,
// a /48 for IPv6 by default). A closed run admits only the holders of a
// join token: the run key, an ed25519 key held by the run's operator (not
// necessarily on the bootstrap), signs (peer ID, run ID, role, expiry), and
// every member checks the token of every other against the run key's
// public half (the manifest's admission.run_key). The caps and the tokens
// are checked by every member, for itself (admit.go):
//
//   - in membership: a node's token rides in its gossiped metadata
//     (Meta.Token, signed by the node's identity with the rest, metasig.go);
//     an "alive" or a push/pull about a member with no valid token, or past
//     a cap, is refused (NotifyAlive, NotifyMerge), so it never enters the
//     member table, Members or Member; a member whose token expires drops
//     out of them at its expiry;
//   - on streams (closed runs): every run protocol's handler is registered
//     through one gate (Node.setHandler) that resets a stream from a peer
//     that is neither a member nor admitted by the handshake below in the
//     last few minutes; the seed's relay serves only such peers too;
//   - at the door: a joining node first asks each peer it joins through on
//     /skein/<run>/admission/1, presenting its token. The answer is the run's
//     policy and a verdict, so a refused node fails at once with the reason
//     (NotAdmittedError) instead of waiting on a membership that ignores it,
//     and a node that does not know the policy (a volunteer, before it has
//     the manifest) learns it from the peers it joins through, which it
//     trusts as it trusts them for the manifest. A node of a closed run
//     presents itself the same way to each member before its first
//     membership message, so that no member's gate refuses it while the
//     gossip about it is still on its way.
//
// # Token format (version 1)
//
// A token is at most MaxTokenLen bytes, all fields big endian:
//
//	offset      size  field
//	0           1     version, 1
//	1           1     role: 0 volunteer, 1 bootstrap, 2 observer (Role)
//	2           8     expiry, unix seconds, in [1, MaxTokenExpiry]
//	10          1     n, the run ID's length, 1..MaxRunIDLen
//	11          n     run ID, [A-Za-z0-9._-]
//	11+n        1     k, the peer ID's length, 1..MaxTokenPeerLen
//	12+n        k     peer ID, binary (a multihash, as peer.ID holds it)
//	12+n+k      64    ed25519 signature by the run key over
//	                  TokenContext followed by bytes [0, 12+n+k)
//
// and nothing after: a token is exactly 76+n+k bytes. The signature covers
// the exact encoding, so two tokens with the same fields are the same
// bytes, and a token signed for one purpose (the context string) cannot be
// replayed as another signature. The decoder checks every length against
// the bytes left before it slices and never allocates more than the run ID.
// On the command line a token travels as unpadded URL-safe base64
// (EncodeToken); DecodeToken also takes standard base64.
const (
	tokenVersion = 1
	// TokenContext prefixes the signed bytes of a token.
	TokenContext = "skein/join-token/1"
	// MaxTokenPeerLen bounds a token's peer ID (an ed25519 peer ID is 38
	// bytes).
	MaxTokenPeerLen = 64
	// MaxTokenLen bounds an encoded token.
	MaxTokenLen = 12 + MaxRunIDLen + MaxTokenPeerLen + ed25519.SignatureSize
	// MaxTokenExpiry bounds a token's expiry: the last second of year 9999.
	MaxTokenExpiry = 253402300799

	tokenFixedLen = 12 + ed25519.SignatureSize
)

// Token is what a join token says: the run key lets Peer take part in run
// RunID as Role until Expires.
type Token struct {
	Peer    peer.ID
	RunID   string
	Role    Role
	Expires time.Time // whole seconds
}

// String describes t for people.
func (t Token) String() string {
	return fmt.Sprintf("%s of run %q for peer %s until %s", t.Role, t.RunID, t.Peer, t.Expires.UTC().Format(time.RFC3339))
}

// IssueToken signs t with the run's private key and returns the encoded
// token. The expiry is truncated to whole seconds.
func IssueToken(runKey ed25519.PrivateKey, t Token) ([]byte, error) {
	if len(runKey) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("%w: run key of %d bytes, want an ed25519 private key of %d", ErrTokenMalformed, len(runKey), ed25519.PrivateKeySize)
	}
	if err := ValidateRunID(t.RunID); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTokenMalformed, err)
	}
	if t.Role > RoleObserver {
		return nil, fmt.Errorf("%w: role %d", ErrTokenMalformed, t.Role)
	}
	pid := []byte(t.Peer)
	if len(pid) == 0 || len(pid) > MaxTokenPeerLen {
		return nil, fmt.Errorf("%w: peer ID of %d bytes, want 1..%d", ErrTokenMalformed, len(pid), MaxTokenPeerLen)
	}
	if _, err := peer.IDFromBytes(pid); err != nil {
		return nil, fmt.Errorf("%w: peer ID: %v", ErrTokenMalformed, err)
	}
	exp := t.Expires.Unix()
	if exp < 1 || exp > MaxTokenExpiry {
		return nil, fmt.Errorf("%w: expiry %s out of range", ErrTokenMalformed, t.Expires)
	}
	b := make([]byte, 0, tokenFixedLen+len(t.RunID)+len(pid))
	b = append(b, tokenVersion, byte(t.Role))
	b = binary.BigEndian.AppendUint64(b, uint64(exp))
	b = append(b, byte(len(t.RunID)))
	b = append(b, t.RunID...)
	b = append(b, byte(len(pid)))
	b = append(b, pid...)
	return append(b, ed25519.Sign(runKey, tokenMessage(b))...), nil
}

// tokenMessage is what the run key signs: TokenContext, then the fields.
func tokenMessage(fields []byte) []byte {
	m := make([]byte, 0, len(TokenContext)+len(fields))
	return append(append(m, TokenContext...), fields...)
}

// ParseToken decodes a token without checking its signature (VerifyToken
// does). It never panics; every error matches ErrTokenMalformed.
func ParseToken(b []byte) (Token, error) {
	t, _, _, err := parseToken(b)
	return t, err
}

// parseToken also returns the signed fields and the signature.
func parseToken(b []byte) (t Token, fields, sig []byte, err error) {
	if len(b) > MaxTokenLen {
		return Token{}, nil, nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTokenMalformed, len(b), MaxTokenLen)
	}
	if len(b) < tokenFixedLen+2 {
		return Token{}, nil, nil, fmt.Errorf("%w: %d bytes, at least %d", ErrTokenMalformed, len(b), tokenFixedLen+2)
	}
	if b[0] != tokenVersion {
		return Token{}, nil, nil, fmt.Errorf("%w: version %d, want %d", ErrTokenMalformed, b[0], tokenVersion)
	}
	role := Role(b[1])
	if role > RoleObserver {
		return Token{}, nil, nil, fmt.Errorf("%w: role %d", ErrTokenMalformed, b[1])
	}
	exp := binary.BigEndian.Uint64(b[2:10])
	if exp < 1 || exp > MaxTokenExpiry {
		return Token{}, nil, nil, fmt.Errorf("%w: expiry %d out of range [1, %d]", ErrTokenMalformed, exp, uint64(MaxTokenExpiry))
	}
	rest := b[10:]
	n := int(rest[0])
	// The run ID, the peer ID's length byte and the signature must follow.
	if n < 1 || n > MaxRunIDLen || len(rest) < 1+n+1 {
		return Token{}, nil, nil, fmt.Errorf("%w: run ID of %d bytes in a %d-byte token", ErrTokenMalformed, n, len(b))
	}
	run := rest[1 : 1+n]
	rest = rest[1+n:]
	k := int(rest[0])
	if k < 1 || k > MaxTokenPeerLen || len(rest) != 1+k+ed25519.SignatureSize {
		return Token{}, nil, nil, fmt.Errorf("%w: peer ID of %d bytes in a %d-byte token", ErrTokenMalformed, k, len(b))
	}
	id, perr := peer.IDFromBytes(rest[1 : 1+k])
	if perr != nil {
		return Token{}, nil, nil, fmt.Errorf("%w: peer ID: %v", ErrTokenMalformed, perr)
	}
	t = Token{Peer: id, RunID: string(run), Role: role, Expires: time.Unix(int64(exp), 0)}
	if err := ValidateRunID(t.RunID); err != nil {
		return Token{}, nil, nil, fmt.Errorf("%w: %v", ErrTokenMalformed, err)
	}
	end := len(b) - ed25519.SignatureSize
	return t, b[:end], b[end:], nil
}

// VerifyToken checks that b is a token signed by runKey for peer id in run
// runID, not expired at now, and returns it. Its errors match one of
// ErrTokenMissing (b is empty), ErrTokenMalformed, ErrTokenForged (not
// signed by runKey), ErrTokenWrongRun, ErrTokenWrongPeer or ErrTokenExpired,
// checked in that order. The role is the caller's to check.
func VerifyToken(runKey ed25519.PublicKey, b []byte, id peer.ID, runID string, now time.Time) (Token, error) {
	if len(b) == 0 {
		return Token{}, ErrTokenMissing
	}
	t, fields, sig, err := parseToken(b)
	if err != nil {
		return Token{}, err
	}
	if len(runKey) != ed25519.PublicKeySize || !ed25519.Verify(runKey, tokenMessage(fields), sig) {
		return Token{}, fmt.Errorf("%w: token of %s not signed by the run key", ErrTokenForged, t.Peer)
	}
	if t.RunID != runID {
		return Token{}, fmt.Errorf("%w: token for run %q, not %q", ErrTokenWrongRun, t.RunID, runID)
	}
	if t.Peer != id {
		return Token{}, fmt.Errorf("%w: token for peer %s, presented by %s", ErrTokenWrongPeer, t.Peer, id)
	}
	if !now.Before(t.Expires) {
		return Token{}, fmt.Errorf("%w: token of %s expired at %s", ErrTokenExpired, id, t.Expires.UTC().Format(time.RFC3339))
	}
	return t, nil
}

// EncodeToken is the text form of a token: unpadded URL-safe base64.
func EncodeToken(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// DecodeToken reads a token's text form (URL-safe or standard base64,
// padded or not, surrounding space ignored) and checks its structure.
func DecodeToken(s string) ([]byte, error) {
	s = strings.TrimRight(strings.TrimSpace(s), "=")
	if len(s) > base64.RawURLEncoding.EncodedLen(MaxTokenLen) {
		return nil, fmt.Errorf("%w: %d characters, more than a token's %d", ErrTokenMalformed, len(s), base64.RawURLEncoding.EncodedLen(MaxTokenLen))
	}
	enc := base64.RawURLEncoding
	if strings.ContainsAny(s, "+/") {
		enc = base64.RawStdEncoding
	}
	b, err := enc.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: not base64: %v", ErrTokenMalformed, err)
	}
	if _, err := ParseToken(b); err != nil {
		return nil, err
	}
	return b, nil
}

// EncodeRunKey is the text form of a run's public key, as the manifest's
// admission.run_key holds it: standard padded base64.
func EncodeRunKey(pub ed25519.PublicKey) string { return base64.StdEncoding.EncodeToString(pub) }

// DecodeRunKey reads EncodeRunKey's form.
func DecodeRunKey(s string) (ed25519.PublicKey, error) {
	b, err := base64.StdEncoding.Strict().DecodeString(strings.TrimSpace(s))
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("p2p: run key %q: want the standard base64 of a %d-byte ed25519 public key", s, ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(b), nil
}

// Default address prefixes of Admission.MaxPerPrefix.
const (
	DefaultPrefixV4 = 24
	DefaultPrefixV6 = 48
)

// Admission is a run's admission policy, as its manifest's [admission]
// states it. The zero value admits anyone.
type Admission struct {
	// Closed admits only holders of a token signed by RunKey.
	Closed bool
	RunKey ed25519.PublicKey // closed runs: the run key's public half
	// MaxMembers caps the members, this node included (0: no cap). Seeds
	// this node bootstraps through are never refused by a cap, but count.
	MaxMembers int
	// MaxPerPrefix (open runs) caps the members behind one address prefix
	// (0: no cap). The address is the one the member's connection to this
	// node comes from, or when there is none (or it is relayed) the one it
	// announces in membership.
	MaxPerPrefix int
	// PrefixV4 and PrefixV6 are the prefix lengths in bits (0: 24 and 48).
	PrefixV4, PrefixV6 int
}

// Validate names the offending value.
func (a Admission) Validate() error {
	switch {
	case a.Closed && len(a.RunKey) != ed25519.PublicKeySize:
		return fmt.Errorf("p2p: Admission.RunKey of %d bytes: a closed run needs an ed25519 public key of %d", len(a.RunKey), ed25519.PublicKeySize)
	case !a.Closed && len(a.RunKey) != 0:
		return fmt.Errorf("p2p: Admission.RunKey set for an open run")
	case a.MaxMembers < 0 || a.MaxMembers > math.MaxUint32 || a.MaxPerPrefix < 0 || a.MaxPerPrefix > math.MaxUint32:
		return fmt.Errorf("p2p: Admission.MaxMembers %d / MaxPerPrefix %d must be >= 0", a.MaxMembers, a.MaxPerPrefix)
	case a.PrefixV4 < 0 || a.PrefixV4 > 32 || a.PrefixV6 < 0 || a.PrefixV6 > 128:
		return fmt.Errorf("p2p: Admission.PrefixV4 %d / PrefixV6 %d out of range [0, 32] / [0, 128]", a.PrefixV4, a.PrefixV6)
	}
	return nil
}

// Equal reports whether a and b are the same policy.
func (a Admission) Equal(b Admission) bool {
	return a.Closed == b.Closed && bytes.Equal(a.RunKey, b.RunKey) && a.MaxMembers == b.MaxMembers &&
		a.MaxPerPrefix == b.MaxPerPrefix && a.prefixV4() == b.prefixV4() && a.prefixV6() == b.prefixV6()
}

// String describes the policy for logs.
func (a Admission) String() string {
	if a.Closed {
		return fmt.Sprintf("closed (run key %s, at most %d members)", EncodeRunKey(a.RunKey), a.MaxMembers)
	}
	return fmt.Sprintf("open (at most %d members, %d per /%d or /%d; 0 = no cap)", a.MaxMembers, a.MaxPerPrefix, a.prefixV4(), a.prefixV6())
}

func (a Admission) prefixV4() int {
	if a.PrefixV4 == 0 {
		return DefaultPrefixV4
	}
	return a.PrefixV4
}

func (a Admission) prefixV6() int {
	if a.PrefixV6 == 0 {
		return DefaultPrefixV6
	}
	return a.PrefixV6
}

// prefix names the address prefix of ip under a: "4/203.0.113.0" for a /24.
// An unknown address (nil) is its own prefix, "?".
func (a Admission) prefix(ip net.IP) string {
	if ip == nil {
		return "?"
	}
	if v4 := ip.To4(); v4 != nil {
		return "4/" + v4.Mask(net.CIDRMask(a.prefixV4(), 32)).String()
	}
	return "6/" + ip.Mask(net.CIDRMask(a.prefixV6(), 128)).String()
}
