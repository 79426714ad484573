package p2p

import (
	"bytes"
	"compress/lzw"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Accusations: who declared whom failed.
//
// A forged suspect or dead message is refused by the dispute (dispute.go);
// naming its sender is for the operator. The transport sees every
// memberlist packet with its libp2p sender, authenticated, so it reads the
// suspect and dead messages out of each inbound packet and keeps the last
// few about each member. A record holds the accuser the message names
// (unauthenticated: any string) and the peer that sent it (the accuser
// itself, or a member forwarding its gossip): neither alone is proof, both
// are in the dispute's warning.
//
// The parser reads memberlist v0.7.0's packet format (net.go, util.go):
//
//	packet  = 12 crc32(4, big endian) command   hasCrcMsg, outermost only
//	        | command
//	command = 7 n(1) len(2, big endian)*n part*  compoundMsg; a truncated part ends it
//	        | 9 msgpack{Algo, Buf}             compressMsg: Algo 0 = LZW, LSB, 8-bit literals
//	        | 3 msgpack{Incarnation, Node, From}   suspectMsg
//	        | 5 msgpack{Incarnation, Node, From}   deadMsg
//	        | any other type                   not read
//
// msgpack structs are maps keyed by field name or arrays in field order
// (go-msgpack decodes both). The parser only reads: the packet goes to
// memberlist unchanged whatever it finds. It is bounded (maxAccuseDepth
// nested commands, maxInflated bytes decompressed, maxAccusations per
// packet) and gives up on anything unexpected, so a message crafted in an
// encoding memberlist takes and this parser does not loses only its name
// in the log. Push/pull state exchanges (streams) are not read: a member
// declared left or dead in one is still disputed, but unnamed.
const (
	msgSuspect  = 3
	msgDead     = 5
	msgCompound = 7
	msgCompress = 9
	msgHasCRC   = 12

	// maxAccuseDepth bounds nested commands; an honest packet nests two
	// (compressed, then compound).
	maxAccuseDepth = 4
	// maxInflated bounds a decompressed payload: an honest sender
	// compresses at most its UDPBufferSize (16 KiB), an LZW bomb would
	// reach memberlist's own 40 MiB.
	maxInflated = maxPacket
	// maxAccusations bounds what one packet can record.
	maxAccusations = 16
)

// accusation is one suspect or dead message as memberlist would decode it.
type accusation struct {
	dead        bool   // dead message; else suspect
	node        string // the accused (a peer ID, as a memberlist name)
	from        string // the accuser it names, unauthenticated
	incarnation uint32
}

// parseAccusations returns the suspect and dead messages in a memberlist
// packet, in order, at most maxAccusations. It never fails: what it cannot
// read it skips.
func parseAccusations(pkt []byte) []accusation {
	if len(pkt) >= 5 && pkt[0] == msgHasCRC {
		if crc32.ChecksumIEEE(pkt[5:]) != binary.BigEndian.Uint32(pkt[1:5]) {
			return nil // memberlist drops it too
		}
		pkt = pkt[5:]
	}
	var out []accusation
	parseCommand(pkt, 0, &out)
	return out
}

func parseCommand(b []byte, depth int, out *[]accusation) {
	if len(b) == 0 || depth >= maxAccuseDepth || len(*out) >= maxAccusations {
		return
	}
	body := b[1:]
	switch b[0] {
	case msgCompound:
		if len(body) < 1 {
			return
		}
		n := int(body[0])
		body = body[1:]
		if len(body) < 2*n {
			return
		}
		lens, parts := body[:2*n], body[2*n:]
		for i := 0; i < n; i++ {
			l := int(binary.BigEndian.Uint16(lens[2*i:]))
			if len(parts) < l {
				return
			}
			parseCommand(parts[:l], depth+1, out)
			parts = parts[l:]
		}
	case msgCompress:
		f, ok := decodeStruct(body, "Algo", "Buf")
		if !ok || !f[0].isUint() || f[0].u != 0 || f[1].kind != mpBytes {
			return
		}
		z := lzw.NewReader(bytes.NewReader(f[1].s), lzw.LSB, 8)
		defer z.Close()
		inflated, err := io.ReadAll(io.LimitReader(z, maxInflated+1))
		if err != nil || len(inflated) > maxInflated {
			return
		}
		parseCommand(inflated, depth+1, out)
	case msgSuspect, msgDead:
		f, ok := decodeStruct(body, "Incarnation", "Node", "From")
		if !ok || !f[0].isUint() || f[0].u > math.MaxUint32 || !f[1].isString() || !f[2].isString() {
			return
		}
		*out = append(*out, accusation{dead: b[0] == msgDead, node: string(f[1].s), from: string(f[2].s), incarnation: uint32(f[0].u)})
	}
}

// mpKind is the kind of a msgpack scalar.
type mpKind uint8

const (
	mpNil mpKind = iota
	mpUint
	mpBytes // str, bin or legacy raw
	mpOther // bool, negative int, float: read past, never used
)

type mpValue struct {
	kind mpKind
	u    uint64
	s    []byte // aliases the input
}

func (v mpValue) isUint() bool   { return v.kind == mpUint || v.kind == mpNil }
func (v mpValue) isString() bool { return v.kind == mpBytes || v.kind == mpNil }

// decodeStruct reads a msgpack-encoded Go struct whose fields named in
// names are scalars, as go-msgpack would decode it: a map (unknown scalar
// fields skipped, the last of repeated fields wins) or an array in field
// order (missing fields zero, extra scalars ignored). A nested container
// or extension fails it.
func decodeStruct(b []byte, names ...string) ([]mpValue, bool) {
	r := mpReader{b: b}
	out := make([]mpValue, len(names))
	c, ok := r.byte1()
	if !ok {
		return nil, false
	}
	var n uint64
	isMap := true
	switch {
	case c >= 0x80 && c <= 0x8f:
		n = uint64(c & 0x0f)
	case c >= 0x90 && c <= 0x9f:
		n, isMap = uint64(c&0x0f), false
	case c == 0xde || c == 0xdc:
		n, ok = r.uint(2)
		isMap = c == 0xde
	case c == 0xdf || c == 0xdd:
		n, ok = r.uint(4)
		isMap = c == 0xdf
	default:
		return nil, false
	}
	if !ok || n > uint64(len(r.b)) { // every entry takes a byte at least
		return nil, false
	}
	for i := uint64(0); i < n; i++ {
		var key mpValue
		if isMap {
			if key, ok = r.value(); !ok || key.kind != mpBytes {
				return nil, false
			}
		}
		v, ok := r.value()
		if !ok {
			return nil, false
		}
		for j, name := range names {
			if isMap && string(key.s) == name || !isMap && i == uint64(j) {
				out[j] = v
			}
		}
	}
	return out, true
}

// mpReader reads msgpack scalars from b, never past its end.
type mpReader struct{ b []byte }

func (r *mpReader) byte1() (byte, bool) {
	if len(r.b) < 1 {
		return 0, false
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c, true
}

func (r *mpReader) take(n uint64) ([]byte, bool) {
	if n > uint64(len(r.b)) {
		return nil, false
	}
	s := r.b[:n]
	r.b = r.b[n:]
	return s, true
}

// uint reads an n-byte big-endian unsigned integer (n is 1, 2, 4 or 8).
func (r *mpReader) uint(n uint64) (uint64, bool) {
	s, ok := r.take(n)
	if !ok {
		return 0, false
	}
	var u uint64
	for _, c := range s {
		u = u<<8 | uint64(c)
	}
	return u, true
}

// value reads one scalar.
func (r *mpReader) value() (mpValue, bool) {
	c, ok := r.byte1()
	if !ok {
		return mpValue{}, false
	}
	switch {
	case c <= 0x7f:
		return mpValue{kind: mpUint, u: uint64(c)}, true
	case c >= 0xe0: // negative fixint
		return mpValue{kind: mpOther}, true
	case c >= 0xa0 && c <= 0xbf:
		s, ok := r.take(uint64(c & 0x1f))
		return mpValue{kind: mpBytes, s: s}, ok
	}
	switch c {
	case 0xc0:
		return mpValue{kind: mpNil}, true
	case 0xc2, 0xc3:
		return mpValue{kind: mpOther}, true
	case 0xc4, 0xd9, 0xc5, 0xda, 0xc6, 0xdb: // bin 8/16/32, str 8/16/32: length, then bytes
		w := uint64(4)
		switch c {
		case 0xc4, 0xd9:
			w = 1
		case 0xc5, 0xda:
			w = 2
		}
		n, ok := r.uint(w)
		if !ok {
			return mpValue{}, false
		}
		s, ok := r.take(n)
		return mpValue{kind: mpBytes, s: s}, ok
	case 0xcc, 0xcd, 0xce, 0xcf: // uint 8/16/32/64
		u, ok := r.uint(1 << (c - 0xcc))
		return mpValue{kind: mpUint, u: u}, ok
	case 0xd0, 0xd1, 0xd2, 0xd3: // int 8/16/32/64: a non-negative one is a uint
		w := uint64(1) << (c - 0xd0)
		u, ok := r.uint(w)
		if !ok {
			return mpValue{}, false
		}
		if u>>(8*w-1) != 0 {
			return mpValue{kind: mpOther}, true
		}
		return mpValue{kind: mpUint, u: u}, true
	case 0xca: // float32
		_, ok := r.take(4)
		return mpValue{kind: mpOther}, ok
	case 0xcb: // float64
		_, ok := r.take(8)
		return mpValue{kind: mpOther}, ok
	}
	return mpValue{}, false
}

// Bounds of the accusation records: they are fed by any peer that can send
// a memberlist packet.
const (
	// maxAccused bounds the members with records: 4x the members a node is
	// sized for, as maxLeftAt. When full an arbitrary record is dropped; a
	// flood of accusations of made-up names can thus cost a warning its
	// names, nothing else.
	maxAccused = 1024
	// accusationsPerPeer: the last few distinct (kind, accuser, sender)
	// of each accused member.
	accusationsPerPeer = 4
	// accuseTTL: a dispute starts within a gossip round of the message
	// that caused it, so a minute is ample.
	accuseTTL = time.Minute
	// maxAccuserLen truncates the accuser's name (a peer ID is 52 bytes).
	maxAccuserLen = 64
)

// accusations records suspect and dead messages per accused member.
type accusations struct {
	mu sync.Mutex
	by map[peer.ID][]accusationSeen // oldest first
}

type accusationSeen struct {
	accusation
	via peer.ID // the libp2p peer that sent the packet
	at  time.Time
}

func newAccusations() *accusations {
	return &accusations{by: make(map[peer.ID][]accusationSeen)}
}

// record keeps the accusations found in a packet from via at now.
func (a *accusations) record(now time.Time, via peer.ID, found []accusation) {
	if len(found) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, f := range found {
		id, err := peer.Decode(f.node)
		if err != nil {
			continue
		}
		if len(f.from) > maxAccuserLen {
			f.from = f.from[:maxAccuserLen]
		}
		l, ok := a.by[id]
		if !ok && len(a.by) >= maxAccused {
			for k := range a.by {
				delete(a.by, k)
				break
			}
		}
		for i, s := range l {
			if s.dead == f.dead && s.from == f.from && s.via == via {
				l = append(l[:i], l[i+1:]...)
				break
			}
		}
		if len(l) >= accusationsPerPeer {
			l = l[1:]
		}
		a.by[id] = append(l, accusationSeen{accusation: f, via: via, at: now})
	}
}

// about describes the unexpired accusations of id, newest first, for a log
// line.
func (a *accusations) about(id peer.ID, now time.Time) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.by[id]
	out := make([]string, 0, len(l))
	for i := len(l) - 1; i >= 0; i-- {
		s := l[i]
		if now.Sub(s.at) >= accuseTTL {
			continue
		}
		kind := "suspect"
		if s.dead {
			kind = "dead"
		}
		out = append(out, fmt.Sprintf("%s (incarnation %d) declared by %q, sent by %s %v ago",
			kind, s.incarnation, s.from, s.via, now.Sub(s.at).Round(time.Millisecond)))
	}
	return out
}

// expire forgets records older than accuseTTL at now.
func (a *accusations) expire(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, l := range a.by {
		if len(l) == 0 || now.Sub(l[len(l)-1].at) >= accuseTTL {
			delete(a.by, id)
		}
	}
}
