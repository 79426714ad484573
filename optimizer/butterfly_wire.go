package optimizer

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/skein-ml/skein/transport"
)

// Bodies of the butterfly collective's messages (after the 32-byte header of
// wire.go; the header's step is the attempt, its chunk the part). All
// integers little-endian; every parser checks each count against the bytes
// that remain before allocating, and never panics.
//
//	ready     8 state hash
//	group     8 state hash | 4 n | n x (2 len | peer ID) | 2 len | leader ID | 64 leader's signature
//	part      64 producer's signature | compression frame
//	have      4 n | n x input
//	result    4 n | n x decl | compression frame
//	digest    32 SHA-256 of the owner's result frame | 4 n | n x decl
//	inputs    4 n | n x (input | 4 len | compression frame)
//	fetch, audit, finished: empty
//
// where input = 4 member index | 32 SHA-256 of its part frame | 64 signature
// and decl = 4 member index | 32 SHA-256 of its part frame: the inputs an
// owner aggregated, in member order.
//
// Signatures (ed25519 by the node's identity key) cover a context string,
// the round, the attempt, the group hash, the part and a SHA-256:
//
//	part:  "skein/butterfly/part/1"  | round | attempt | group | part | SHA-256(frame)
//	group: "skein/butterfly/group/1" | round | attempt | SHA-256(group body before the signature)
const (
	sigLen       = 64
	digestLen    = sha256.Size
	declLen      = 4 + digestLen
	inputLen     = declLen + sigLen
	maxIDLen     = 256
	partContext  = "skein/butterfly/part/1"
	groupContext = "skein/butterfly/group/1"
)

// decl names one input of an aggregate: the member's index in the group and
// the hash of the frame it sent.
type decl struct {
	idx  uint32
	hash [digestLen]byte
}

// signedInput is a decl with the producer's signature over it.
type signedInput struct {
	decl
	sig [sigLen]byte
}

func partSigMsg(round uint64, attempt uint32, gh uint64, part uint32, hash [digestLen]byte) []byte {
	b := make([]byte, 0, len(partContext)+24+digestLen)
	b = append(b, partContext...)
	b = binary.LittleEndian.AppendUint64(b, round)
	b = binary.LittleEndian.AppendUint32(b, attempt)
	b = binary.LittleEndian.AppendUint64(b, gh)
	b = binary.LittleEndian.AppendUint32(b, part)
	return append(b, hash[:]...)
}

func groupSigMsg(round uint64, attempt uint32, body []byte) []byte {
	h := sha256.Sum256(body)
	b := make([]byte, 0, len(groupContext)+12+digestLen)
	b = append(b, groupContext...)
	b = binary.LittleEndian.AppendUint64(b, round)
	b = binary.LittleEndian.AppendUint32(b, attempt)
	return append(b, h[:]...)
}

// groupMsg is a decoded group announcement.
type groupMsg struct {
	stateHash uint64
	members   []transport.PeerID
	leader    transport.PeerID
	signed    []byte // the bytes the signature covers (before groupSigMsg)
	sig       []byte
}

func appendGroupBody(dst []byte, stateHash uint64, members []transport.PeerID, leader transport.PeerID) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, stateHash)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(members)))
	for _, m := range members {
		dst = binary.LittleEndian.AppendUint16(dst, uint16(len(m)))
		dst = append(dst, m...)
	}
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(leader)))
	return append(dst, leader...)
}

func parseGroup(body []byte) (groupMsg, error) {
	var g groupMsg
	if len(body) < 12+2+sigLen {
		return g, fmt.Errorf("%w: group of %d bytes", ErrBadMessage, len(body))
	}
	g.signed, g.sig = body[:len(body)-sigLen], body[len(body)-sigLen:]
	b := g.signed
	g.stateHash = binary.LittleEndian.Uint64(b)
	n := binary.LittleEndian.Uint32(b[8:])
	b = b[12:]
	if n == 0 || n > maxGroup || uint64(n)*3 > uint64(len(b)) {
		return g, fmt.Errorf("%w: group of %d members in %d bytes", ErrBadMessage, n, len(b))
	}
	g.members = make([]transport.PeerID, 0, n)
	readID := func() (transport.PeerID, error) {
		if len(b) < 2 {
			return "", fmt.Errorf("%w: group truncated", ErrBadMessage)
		}
		l := int(binary.LittleEndian.Uint16(b))
		if l == 0 || l > maxIDLen || l > len(b)-2 {
			return "", fmt.Errorf("%w: peer ID of %d bytes", ErrBadMessage, l)
		}
		id := transport.PeerID(b[2 : 2+l])
		b = b[2+l:]
		return id, nil
	}
	for range n {
		id, err := readID()
		if err != nil {
			return g, err
		}
		if len(g.members) > 0 && id <= g.members[len(g.members)-1] {
			return g, fmt.Errorf("%w: group members not sorted or repeated", ErrBadMessage)
		}
		g.members = append(g.members, id)
	}
	var err error
	if g.leader, err = readID(); err != nil {
		return g, err
	}
	if len(b) != 0 {
		return g, fmt.Errorf("%w: %d trailing bytes in group", ErrBadMessage, len(b))
	}
	return g, nil
}

func appendDecls(dst []byte, ds []decl) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(ds)))
	for _, d := range ds {
		dst = binary.LittleEndian.AppendUint32(dst, d.idx)
		dst = append(dst, d.hash[:]...)
	}
	return dst
}

// parseDecls reads a counted list of decls (at most maxN, indices strictly
// increasing) and returns the rest of b.
func parseDecls(b []byte, maxN int) ([]decl, []byte, error) {
	if len(b) < 4 {
		return nil, nil, fmt.Errorf("%w: input list truncated", ErrBadMessage)
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if uint64(n) > uint64(maxN) || uint64(n)*declLen > uint64(len(b)) {
		return nil, nil, fmt.Errorf("%w: %d inputs in %d bytes", ErrBadMessage, n, len(b))
	}
	ds := make([]decl, n)
	for i := range ds {
		ds[i].idx = binary.LittleEndian.Uint32(b)
		copy(ds[i].hash[:], b[4:declLen])
		b = b[declLen:]
		if ds[i].idx >= uint32(maxN) || (i > 0 && ds[i].idx <= ds[i-1].idx) {
			return nil, nil, fmt.Errorf("%w: input index %d out of order or range", ErrBadMessage, ds[i].idx)
		}
	}
	return ds, b, nil
}

func appendInputs(dst []byte, in []signedInput) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(in)))
	for _, s := range in {
		dst = binary.LittleEndian.AppendUint32(dst, s.idx)
		dst = append(dst, s.hash[:]...)
		dst = append(dst, s.sig[:]...)
	}
	return dst
}

func parseInputs(b []byte, maxN int) ([]signedInput, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: have truncated", ErrBadMessage)
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if uint64(n) > uint64(maxN) || uint64(n)*inputLen != uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d inputs in %d bytes", ErrBadMessage, n, len(b))
	}
	out := make([]signedInput, n)
	for i := range out {
		out[i].idx = binary.LittleEndian.Uint32(b)
		copy(out[i].hash[:], b[4:declLen])
		copy(out[i].sig[:], b[declLen:inputLen])
		b = b[inputLen:]
		if out[i].idx >= uint32(maxN) || (i > 0 && out[i].idx <= out[i-1].idx) {
			return nil, fmt.Errorf("%w: input index %d out of order or range", ErrBadMessage, out[i].idx)
		}
	}
	return out, nil
}

// auditInput is one input of an audit answer: the signed decl and its frame.
type auditInput struct {
	signedInput
	frame []byte
}

func appendAudit(dst []byte, in []auditInput) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(in)))
	for _, s := range in {
		dst = binary.LittleEndian.AppendUint32(dst, s.idx)
		dst = append(dst, s.hash[:]...)
		dst = append(dst, s.sig[:]...)
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(s.frame)))
		dst = append(dst, s.frame...)
	}
	return dst
}

// parseAudit reads an audit answer; frames alias b and are at most
// maxFrame bytes each.
func parseAudit(b []byte, maxN, maxFrame int) ([]auditInput, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("%w: inputs truncated", ErrBadMessage)
	}
	n := binary.LittleEndian.Uint32(b)
	b = b[4:]
	if uint64(n) > uint64(maxN) || uint64(n)*(inputLen+4) > uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d audit inputs in %d bytes", ErrBadMessage, n, len(b))
	}
	out := make([]auditInput, n)
	for i := range out {
		if len(b) < inputLen+4 {
			return nil, fmt.Errorf("%w: audit input %d truncated", ErrBadMessage, i)
		}
		out[i].idx = binary.LittleEndian.Uint32(b)
		copy(out[i].hash[:], b[4:declLen])
		copy(out[i].sig[:], b[declLen:inputLen])
		l := binary.LittleEndian.Uint32(b[inputLen:])
		b = b[inputLen+4:]
		if uint64(l) > uint64(maxFrame) || uint64(l) > uint64(len(b)) {
			return nil, fmt.Errorf("%w: audit frame of %d bytes", ErrBadMessage, l)
		}
		out[i].frame = b[:l]
		b = b[l:]
		if out[i].idx >= uint32(maxN) || (i > 0 && out[i].idx <= out[i-1].idx) {
			return nil, fmt.Errorf("%w: audit index %d out of order or range", ErrBadMessage, out[i].idx)
		}
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes in audit answer", ErrBadMessage, len(b))
	}
	return out, nil
}
