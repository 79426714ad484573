package optimizer

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"sort"
)

// Collective messages. Every payload a member sends starts with this 32-byte
// header (little-endian):
//
//	0  2  magic "SK"
//	2  1  version (1)
//	3  1  kind
//	4  8  round
//	12 8  group: hash of the round and the group (the ring) it was sent in;
//	      in a suspect, the ring the suspicion was made in (0: none)
//	20 4  step within the collective; in a query, 1 means "I am in no ring
//	      of this round, only waiting for its result" (queryWaiting)
//	24 4  chunk index
//	28 4  body length (must equal the bytes that follow)
//
// The body is a compression frame (reduce, gather), a peer ID (suspect), a
// done record (done) or empty (query, gone).
const (
	headerLen  = 32
	wireMagic0 = 'S'
	wireMagic1 = 'K'
	wireVer    = 1
)

type kind uint8

const (
	kindReduce  kind = 1 // reduce-scatter partial sum
	kindGather  kind = 2 // all-gather of an owner's final chunk
	kindSuspect kind = 3 // the sender excludes the named peer from this round
	kindQuery   kind = 4 // "has round r finished? send me the result"
	kindDone    kind = 5 // a finished round's result
	kindGossip  kind = 6 // NoLoCo exchange within a group
	kindGone    kind = 7 // "I finished round r but no longer hold its result"

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
	return [...]string{"", "reduce", "gather", "suspect", "query", "done", "gossip", "gone",
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
	if h.kind == 0 || h.kind > maxKind {
		return header{}, nil, fmt.Errorf("%w: unknown kind %d", ErrBadMessage, h.kind)
	}
	n := binary.LittleEndian.Uint32(p[28:])
	if uint64(n) != uint64(len(p)-headerLen) {
		return header{}, nil, fmt.Errorf("%w: body length %d, %d bytes follow", ErrBadMessage, n, len(p)-headerLen)
	}
	return h, p[headerLen:], nil
}

// groupHash names one attempt of a round: the round and its exact member list.
func groupHash(round uint64, group []PeerID) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], round)
	h.Write(b[:])
	for _, p := range group {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// doneRecord is the body of a kindDone message: the group size and the final
// encoded bytes of every chunk, from which any member rebuilds the result.
//
//	4 bytes group size M, then M times: 4-byte length, bytes
func appendDone(dst []byte, chunks [][]byte) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(chunks)))
	for _, c := range chunks {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(c)))
		dst = append(dst, c...)
	}
	return dst
}

// maxGroup bounds the members of one collective.
const maxGroup = 1 << 16

func parseDone(body []byte) ([][]byte, error) {
	if len(body) < 4 {
		return nil, fmt.Errorf("%w: done record of %d bytes", ErrBadMessage, len(body))
	}
	m := binary.LittleEndian.Uint32(body)
	if m == 0 || m > maxGroup || uint64(m)*4 > uint64(len(body)-4) {
		return nil, fmt.Errorf("%w: done record claims %d chunks in %d bytes", ErrBadMessage, m, len(body))
	}
	chunks := make([][]byte, m)
	off := 4
	for i := range chunks {
		if len(body)-off < 4 {
			return nil, fmt.Errorf("%w: done record truncated at chunk %d", ErrBadMessage, i)
		}
		n := int(binary.LittleEndian.Uint32(body[off:]))
		off += 4
		if n > len(body)-off {
			return nil, fmt.Errorf("%w: done chunk %d of %d bytes, %d left", ErrBadMessage, i, n, len(body)-off)
		}
		chunks[i] = body[off : off+n]
		off += n
	}
	if off != len(body) {
		return nil, fmt.Errorf("%w: %d trailing bytes in done record", ErrBadMessage, len(body)-off)
	}
	return chunks, nil
}

// sortedGroup returns the members sorted by ID, without duplicates.
func sortedGroup(ms []PeerID) []PeerID {
	out := append([]PeerID(nil), ms...)
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
