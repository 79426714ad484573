package replica

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/skein-ml/skein/transport"
)

// A round's certificate: the members of round r's group each sign
//
//	voteContext | u16 len(run) | run | u64 round | u64 state hash | group digest (32)
//
// where round is the round the state is at (the next round to run, as
// optimizer.DiLoCo.Round counts it), the state hash optimizer.StateHashOf's
// and the group digest GroupDigest of the round's signed group. A
// certificate is valid when a strict majority of its group signed it
// (Verify); it extends an earlier certificate when a strict majority of the
// earlier group is among its signers too (Extends), so a chain of them
// leads from a state everyone trusts (the manifest's start state, or a
// certificate the member checked before) to the run's current state, and
// no member, no minority and no set of newcomers decides on its own.
//
// On the wire (MarshalBinary, little-endian):
//
//	0   4   magic "SKCT"
//	4   1   version (1)
//	5   2   len(run), then run
//	..  8   round
//	..  8   state hash
//	..  2   group size g (1..MaxGroup)
//	..      g times: u8 len(id), id, u8 signature length (0 or 64), signature
const (
	voteContext = "skein/replica/vote/1"
	certMagic   = "SKCT"
	certVersion = 1
	// MaxGroup bounds a round's group (the butterfly's groups are far
	// smaller); MaxIDLen a member's ID (a libp2p peer ID is 39-53 bytes).
	MaxGroup = 1024
	MaxIDLen = 128
	maxRun   = 256
	sigLen   = 64
)

// Errors of certificates; callers test them with errors.Is.
var (
	// ErrBadCert: the bytes do not decode as a certificate.
	ErrBadCert = errors.New("replica: malformed certificate")
	// ErrWrongRun: the certificate is of another run.
	ErrWrongRun = errors.New("replica: certificate of another run")
	// ErrMinority: fewer than a strict majority of the group signed.
	ErrMinority = errors.New("replica: certificate without a majority")
	// ErrBadSignature: a signature does not verify (forged, or made for
	// another round, state, group or run).
	ErrBadSignature = errors.New("replica: bad signature")
	// ErrBrokenChain: a certificate does not extend the one before it.
	ErrBrokenChain = errors.New("replica: certificate does not extend the chain")
)

// Certificate is a strict majority of round Round's group vouching that
// the run's state at Round has hash Hash.
type Certificate struct {
	Run   string
	Round uint64
	Hash  uint64
	// Group is the round's signed group, sorted, without duplicates; Sigs
	// holds member i's signature at i, or nil where it did not sign.
	Group []transport.PeerID
	Sigs  [][]byte
}

// GroupDigest is the SHA-256 of the sorted group, each ID length-prefixed.
func GroupDigest(group []transport.PeerID) [32]byte {
	h := sha256.New()
	for _, id := range group {
		h.Write([]byte{byte(len(id))})
		h.Write([]byte(id))
	}
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// VoteBytes is what a member of round's group signs for the state hash.
func VoteBytes(run string, round, hash uint64, group []transport.PeerID) []byte {
	return signedBytes(voteContext, run, round, hash, group)
}

// signedBytes is what is signed for (run, round, hash, group) in context
// (a vote, or the bootstrap's countersignature).
func signedBytes(context, run string, round, hash uint64, group []transport.PeerID) []byte {
	b := make([]byte, 0, len(context)+2+len(run)+8+8+32)
	b = append(b, context...)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(run)))
	b = append(b, run...)
	b = binary.LittleEndian.AppendUint64(b, round)
	b = binary.LittleEndian.AppendUint64(b, hash)
	d := GroupDigest(group)
	return append(b, d[:]...)
}

// Signers lists the members whose signature the certificate carries (not
// checked: Verify first).
func (c *Certificate) Signers() []transport.PeerID {
	var out []transport.PeerID
	for i, s := range c.Sigs {
		if s != nil {
			out = append(out, c.Group[i])
		}
	}
	return out
}

// Verify checks that c is a certificate of run whose signatures, from a
// strict majority of its group, all verify.
func (c *Certificate) Verify(run string, signer transport.Signer) error {
	if c.Run != run {
		return fmt.Errorf("%w: %q, this run is %q", ErrWrongRun, c.Run, run)
	}
	if err := c.wellFormed(); err != nil {
		return err
	}
	// The count first: a minority is refused without a signature checked.
	if n := len(c.Signers()); 2*n <= len(c.Group) {
		return fmt.Errorf("%w: %d of %d signed round %d", ErrMinority, n, len(c.Group), c.Round)
	}
	msg := VoteBytes(c.Run, c.Round, c.Hash, c.Group)
	for i, s := range c.Sigs {
		if s != nil && !signer.Verify(c.Group[i], msg, s) {
			return fmt.Errorf("%w: %s's vote for round %d", ErrBadSignature, c.Group[i], c.Round)
		}
	}
	return nil
}

// Extends checks that c may follow prev (trusted): a later round, and a
// strict majority of prev's group among c's signers. It checks no
// signature (Verify does): VerifyChain asks it first, so that a chain that
// cannot extend costs no ed25519 work. A prev
// without a group (the run's start state, known from the manifest alone)
// is extended by any verified certificate of a later round.
func (c *Certificate) Extends(prev *Certificate) error {
	if c.Round <= prev.Round {
		return fmt.Errorf("%w: round %d after round %d", ErrBrokenChain, c.Round, prev.Round)
	}
	if len(prev.Group) == 0 {
		return nil
	}
	n := c.signedOf(prev)
	if 2*n <= len(prev.Group) {
		return fmt.Errorf("%w: %d of round %d's %d members signed round %d", ErrBrokenChain, n, prev.Round, len(prev.Group), c.Round)
	}
	return nil
}

// Rejoins reports whether at least half of prev's group signed c: the
// relaxed link by which a member whose chain broke under churn and dissent
// (Extends wants more than half) may start again from c, together with a
// rule outside the chain (node and the bootstrap: a strict majority of the
// live volunteers signed c). Sybils new to the run never hold half of it.
func (c *Certificate) Rejoins(prev *Certificate) bool {
	return len(prev.Group) > 0 && 2*c.signedOf(prev) >= len(prev.Group)
}

// signedOf counts the members of prev's group among c's signers.
func (c *Certificate) signedOf(prev *Certificate) int {
	n := 0
	for _, id := range c.Signers() {
		if _, ok := slices.BinarySearch(prev.Group, id); ok {
			n++
		}
	}
	return n
}

// MedianRound is the median of rounds (the upper one of an even count; 0
// for none): the round most members announce, which a minority announcing
// far rounds does not move.
func MedianRound(rounds []uint64) uint64 {
	if len(rounds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(rounds))
	return s[len(s)/2]
}

// ChainPage is how many certificates one answer on the chain protocol
// (p2p.ProtoCerts) carries at most.
const ChainPage = 16

// ChainRequest is the chain protocol's request: the round the asker
// trusts (8 bytes, little-endian); the answer is one frame per trusted
// certificate after it, oldest first, at most ChainPage.
func ChainRequest(from uint64) []byte { return binary.LittleEndian.AppendUint64(nil, from) }

// ParseChainRequest reads ChainRequest's bytes.
func ParseChainRequest(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: a chain request of %d bytes", ErrBadCert, len(b))
	}
	return binary.LittleEndian.Uint64(b), nil
}

// DecodeChain decodes an answer's frames (at most ChainPage are read).
func DecodeChain(frames [][]byte) ([]*Certificate, error) {
	var chain []*Certificate
	for _, b := range frames[:min(len(frames), ChainPage)] {
		c := new(Certificate)
		if err := c.UnmarshalBinary(b); err != nil {
			return nil, err
		}
		chain = append(chain, c)
	}
	return chain, nil
}

// VerifyChain checks chain (in round order) against the trusted anchor and
// returns the last certificate, or anchor when chain is empty. Every
// certificate must verify and extend the one before it.
func VerifyChain(run string, signer transport.Signer, anchor *Certificate, chain []*Certificate) (*Certificate, error) {
	last := anchor
	for _, c := range chain {
		if err := c.Extends(last); err != nil {
			return nil, err
		}
		if err := c.Verify(run, signer); err != nil {
			return nil, err
		}
		last = c
	}
	return last, nil
}

func (c *Certificate) wellFormed() error {
	g := len(c.Group)
	switch {
	case g == 0 || g > MaxGroup:
		return fmt.Errorf("%w: a group of %d (1..%d)", ErrBadCert, g, MaxGroup)
	case len(c.Sigs) != g:
		return fmt.Errorf("%w: %d signatures for a group of %d", ErrBadCert, len(c.Sigs), g)
	case len(c.Run) > maxRun:
		return fmt.Errorf("%w: run id of %d bytes", ErrBadCert, len(c.Run))
	}
	for i, id := range c.Group {
		if len(id) == 0 || len(id) > MaxIDLen {
			return fmt.Errorf("%w: member ID of %d bytes", ErrBadCert, len(id))
		}
		if i > 0 && c.Group[i-1] >= id {
			return fmt.Errorf("%w: group not sorted or with duplicates", ErrBadCert)
		}
		if s := c.Sigs[i]; s != nil && len(s) != sigLen {
			return fmt.Errorf("%w: a %d-byte signature", ErrBadCert, len(s))
		}
	}
	return nil
}

// MarshalBinary encodes a well-formed certificate.
func (c *Certificate) MarshalBinary() ([]byte, error) {
	if err := c.wellFormed(); err != nil {
		return nil, err
	}
	b := append([]byte(certMagic), certVersion)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Run)))
	b = append(b, c.Run...)
	b = binary.LittleEndian.AppendUint64(b, c.Round)
	b = binary.LittleEndian.AppendUint64(b, c.Hash)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(c.Group)))
	for i, id := range c.Group {
		b = append(b, byte(len(id)))
		b = append(b, id...)
		b = append(b, byte(len(c.Sigs[i])))
		b = append(b, c.Sigs[i]...)
	}
	return b, nil
}

// UnmarshalBinary decodes a certificate of at most MaxGroup members; it
// never allocates more than the input's size and never panics. The
// signatures are not checked (Verify).
func (c *Certificate) UnmarshalBinary(b []byte) error {
	r := reader{b: b}
	if m := r.take(len(certMagic)); !bytes.Equal(m, []byte(certMagic)) {
		return fmt.Errorf("%w: bad magic", ErrBadCert)
	}
	if v := r.take(1); v != nil && v[0] != certVersion {
		return fmt.Errorf("%w: version %d, want %d", ErrBadCert, v[0], certVersion)
	}
	run := string(r.take(int(r.u16())))
	round, hash := r.u64(), r.u64()
	g := int(r.u16())
	if g == 0 || g > MaxGroup {
		return fmt.Errorf("%w: a group of %d (1..%d)", ErrBadCert, g, MaxGroup)
	}
	out := Certificate{Run: run, Round: round, Hash: hash, Group: make([]transport.PeerID, 0, min(g, len(b)/2)), Sigs: make([][]byte, 0, min(g, len(b)/2))}
	for range g {
		id := r.take(int(r.u8()))
		n := int(r.u8())
		if n != 0 && n != sigLen {
			return fmt.Errorf("%w: a %d-byte signature", ErrBadCert, n)
		}
		var sig []byte
		if n > 0 {
			sig = slices.Clone(r.take(n))
		}
		if r.err != nil {
			break
		}
		out.Group = append(out.Group, transport.PeerID(id))
		out.Sigs = append(out.Sigs, sig)
	}
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrBadCert, len(r.b))
	}
	if err := out.wellFormed(); err != nil {
		return err
	}
	*c = out
	return nil
}

// reader takes little-endian fields from b; past the end it records
// ErrBadCert and returns zeros.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int) []byte {
	if r.err != nil || n > len(r.b) {
		if r.err == nil {
			r.err = fmt.Errorf("%w: truncated", ErrBadCert)
		}
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8() uint8 {
	if v := r.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}
