package optimizer

import (
	"encoding/binary"
	"fmt"
	"sort"
	"time"

	"github.com/skein-ml/skein/transport"
)

// Collective messages. Every payload a member sends starts with this 32-byte
// header (little-endian):
//
//	0  2  magic "SK"
//	2  1  version (1)
//	3  1  kind
//	4  8  round
//	12 8  group: hash of the round, the attempt and the group it was sent in
//	20 4  step: the attempt (butterfly), the step (NoLoCo gossip)
//	24 4  chunk: the part
//	28 4  body length (must equal the bytes that follow)
//
// Bodies: butterfly_wire.go; NoLoCo's gossip, noloco.go.
const (
	headerLen  = 32
	wireMagic0 = 'S'
	wireMagic1 = 'K'
	wireVer    = 1
)

type kind uint8

const (
	// 1-5 and 7 were the ring all-reduce's (deleted); never reuse them.
	kindGossip kind = 6 // NoLoCo exchange within a group

	// The butterfly collective (butterfly.go); step carries the attempt.
	kindReady    kind = 8  // "I am ready for round r with state hash H"
	kindGroup    kind = 9  // the round's group, signed by its leader
	kindPart     kind = 10 // one part of a contribution, signed by its producer, to an owner
	kindHave     kind = 11 // an owner's list of the signed inputs it holds, to its co-owner
	kindResult   kind = 12 // an owner's aggregate of a part, with the inputs it used
	kindDigest   kind = 13 // the co-owner's hash of the same aggregate
	kindFetch    kind = 14 // "send me your result for part p"
	kindAudit    kind = 15 // "send me the signed inputs of part p"
	kindInputs   kind = 16 // the answer to an audit
	kindFinished kind = 17 // "I already finished round r"
	maxKind           = kindFinished
)

func (k kind) String() string {
	if k == 0 || k > maxKind {
		return fmt.Sprintf("kind(%d)", uint8(k))
	}
	return [...]string{"", "kind(1)", "kind(2)", "kind(3)", "kind(4)", "kind(5)", "gossip", "kind(7)",
		"ready", "group", "part", "have", "result", "digest", "fetch", "audit", "inputs", "finished"}[k]
}

type header struct {
	kind        kind
	round       uint64
	group       uint64
	step, chunk uint32
}

func appendMessage(dst []byte, h header, body []byte) []byte {
	var b [headerLen]byte
	b[0], b[1], b[2], b[3] = wireMagic0, wireMagic1, wireVer, byte(h.kind)
	binary.LittleEndian.PutUint64(b[4:], h.round)
	binary.LittleEndian.PutUint64(b[12:], h.group)
	binary.LittleEndian.PutUint32(b[20:], h.step)
	binary.LittleEndian.PutUint32(b[24:], h.chunk)
	binary.LittleEndian.PutUint32(b[28:], uint32(len(body)))
	return append(append(dst, b[:]...), body...)
}

// parseMessage checks and splits a collective message; body aliases p.
func parseMessage(p []byte) (header, []byte, error) {
	if len(p) < headerLen {
		return header{}, nil, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrBadMessage, len(p), headerLen)
	}
	if p[0] != wireMagic0 || p[1] != wireMagic1 {
		return header{}, nil, fmt.Errorf("%w: bad magic %q", ErrBadMessage, p[:2])
	}
	if p[2] != wireVer {
		return header{}, nil, fmt.Errorf("%w: version %d, want %d", ErrBadMessage, p[2], wireVer)
	}
	h := header{kind: kind(p[3]), round: binary.LittleEndian.Uint64(p[4:]), group: binary.LittleEndian.Uint64(p[12:]),
		step: binary.LittleEndian.Uint32(p[20:]), chunk: binary.LittleEndian.Uint32(p[24:])}
	if h.kind == 0 || h.kind > maxKind || (h.kind != kindGossip && h.kind < kindReady) {
		return header{}, nil, fmt.Errorf("%w: unknown kind %d", ErrBadMessage, h.kind)
	}
	n := binary.LittleEndian.Uint32(p[28:])
	if uint64(n) != uint64(len(p)-headerLen) {
		return header{}, nil, fmt.Errorf("%w: body length %d, %d bytes follow", ErrBadMessage, n, len(p)-headerLen)
	}
	return h, p[headerLen:], nil
}

// maxGroup bounds the members of one collective.
const maxGroup = 1 << 16

// sortedGroup returns the members sorted by ID, without duplicates.
func sortedGroup(ms []transport.PeerID) []transport.PeerID {
	out := append([]transport.PeerID(nil), ms...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	w := 0
	for i, p := range out {
		if i == 0 || p != out[w-1] {
			out[w] = p
			w++
		}
	}
	return out[:w]
}

// chunkBounds splits n elements into m near-equal contiguous chunks.
func chunkBounds(n, m, c int) (lo, hi int) {
	return c * n / m, (c + 1) * n / m
}

// envelope is a received message, parsed, with its arrival time.
type envelope struct {
	from transport.PeerID
	h    header
	body []byte
	at   time.Time
}
