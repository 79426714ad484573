package pipeline

import (
	"encoding/binary"
	"fmt"
)

// The relay's wire format. One message per payload handed to the network
// (the transport frames payloads; this is what is inside). All integers
// little-endian:
//
//	offset size
//	0      2    magic "SR"
//	2      1    version (1)
//	3      1    kind: 1 activation, 2 gradient, 3 fail, 4 abort
//	4      8    iteration
//	12     4    microbatch
//	16     2    stage: the stage whose input (activation) or whose output's
//	            gradient (gradient) this is; 0 for the return to the head
//	18     2    hop: the index in the path of the visit that receives it;
//	            L (the path's length) for the return to stage 0's head
//	20     2    L, the path's length, in [1, maxPathLen]
//	22     6L   the path: per visit 4 node | 2 stage
//	then, by kind:
//	  activation, gradient: 4 n | n bytes of one compression frame
//	  fail:                 1 reason (failReason)
//	  abort:                nothing
//
// Nothing may follow. The path rides in every message so that a hop checks
// it against its own copy of the schedule and knows where to send next
// without asking anyone. The parser checks every count against the bytes
// that remain before it allocates, allocates only the path (at most
// maxPathLen visits), returns the frame as a view of its input, and never
// panics (FuzzRelayMessage).
const (
	relayMagic   = "SR"
	relayVersion = 1
	relayHdrLen  = 22
	visitLen     = 6
	// maxPathLen is the most visits a path may have: Rules.Stages' bound.
	maxPathLen = 256
	// maxNodeIndex bounds node indices on the wire, far above any swarm's
	// size; the machine checks them against its placement as well.
	maxNodeIndex = 1 << 24
)

// relayKind is a message's kind byte.
type relayKind uint8

const (
	kindAct relayKind = iota + 1
	kindGrad
	kindFail
	kindAbort
)

func (k relayKind) String() string {
	switch k {
	case kindAct:
		return "act"
	case kindGrad:
		return "grad"
	case kindFail:
		return "fail"
	case kindAbort:
		return "abort"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// failReason says why a hop gave up a microbatch, in a fail message.
type failReason uint8

const (
	reasonMemory   failReason = iota + 1 // the hop holds mu activations already
	reasonRejected                       // the path or the sender does not match the hop's schedule
	reasonPayload                        // the tensor did not decode to one activation
	reasonCompute                        // the stage's forward or backward failed
	reasonTimeout                        // the hop's own deadline passed
	reasonTensor                         // an activation or gradient was not finite or past its bound
	maxReason      = reasonTensor
)

// relayMsg is one decoded message.
type relayMsg struct {
	kind   relayKind
	iter   uint64
	mb     uint32
	stage  uint16
	hop    uint16
	path   Path
	reason failReason
	frame  []byte // a view of the parsed bytes
}

// appendRelayMsg appends the encoding of m to dst.
func appendRelayMsg(dst []byte, m relayMsg) []byte {
	dst = append(dst, relayMagic...)
	dst = append(dst, relayVersion, byte(m.kind))
	dst = binary.LittleEndian.AppendUint64(dst, m.iter)
	dst = binary.LittleEndian.AppendUint32(dst, m.mb)
	dst = binary.LittleEndian.AppendUint16(dst, m.stage)
	dst = binary.LittleEndian.AppendUint16(dst, m.hop)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(m.path.Nodes)))
	for i, v := range m.path.Nodes {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(v))
		dst = binary.LittleEndian.AppendUint16(dst, uint16(m.path.Stages[i]))
	}
	switch m.kind {
	case kindAct, kindGrad:
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(m.frame)))
		dst = append(dst, m.frame...)
	case kindFail:
		dst = append(dst, byte(m.reason))
	}
	return dst
}

// parseRelayMsg decodes one message; the frame aliases b.
func parseRelayMsg(b []byte) (relayMsg, error) {
	var m relayMsg
	if len(b) < relayHdrLen {
		return m, fmt.Errorf("%w: %d bytes, header needs %d", ErrBadMessage, len(b), relayHdrLen)
	}
	if string(b[:2]) != relayMagic || b[2] != relayVersion {
		return m, fmt.Errorf("%w: magic %q version %d", ErrBadMessage, b[:2], b[2])
	}
	m.kind = relayKind(b[3])
	if m.kind < kindAct || m.kind > kindAbort {
		return m, fmt.Errorf("%w: kind %d", ErrBadMessage, b[3])
	}
	m.iter = binary.LittleEndian.Uint64(b[4:])
	m.mb = binary.LittleEndian.Uint32(b[12:])
	m.stage = binary.LittleEndian.Uint16(b[16:])
	m.hop = binary.LittleEndian.Uint16(b[18:])
	n := int(binary.LittleEndian.Uint16(b[20:]))
	rest := b[relayHdrLen:]
	if n < 1 || n > maxPathLen || n*visitLen > len(rest) {
		return m, fmt.Errorf("%w: path of %d visits in %d bytes (at most %d visits)", ErrBadMessage, n, len(rest), maxPathLen)
	}
	if int(m.hop) > n {
		return m, fmt.Errorf("%w: hop %d past a path of %d visits", ErrBadMessage, m.hop, n)
	}
	m.path = Path{Nodes: make([]int, n), Stages: make([]int, n)}
	for i := range n {
		v := binary.LittleEndian.Uint32(rest)
		s := binary.LittleEndian.Uint16(rest[4:])
		if v >= maxNodeIndex || s >= maxPathLen {
			return m, fmt.Errorf("%w: visit %d to node %d, stage %d", ErrBadMessage, i, v, s)
		}
		m.path.Nodes[i], m.path.Stages[i] = int(v), int(s)
		rest = rest[visitLen:]
	}
	switch m.kind {
	case kindAct, kindGrad:
		if len(rest) < 4 {
			return m, fmt.Errorf("%w: %s without a frame length", ErrBadMessage, m.kind)
		}
		fl := binary.LittleEndian.Uint32(rest)
		rest = rest[4:]
		if uint64(fl) != uint64(len(rest)) {
			return m, fmt.Errorf("%w: %s frame of %d bytes declared, %d follow", ErrBadMessage, m.kind, fl, len(rest))
		}
		m.frame, rest = rest, nil
	case kindFail:
		if len(rest) != 1 || rest[0] == 0 || failReason(rest[0]) > maxReason {
			return m, fmt.Errorf("%w: fail body of %d bytes", ErrBadMessage, len(rest))
		}
		m.reason, rest = failReason(rest[0]), nil
	}
	if len(rest) != 0 {
		return m, fmt.Errorf("%w: %d trailing bytes after a %s", ErrBadMessage, len(rest), m.kind)
	}
	return m, nil
}
