package p2p

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// JoinPastTheDoor joins n to the run through addr with memberlist alone,
// skipping the admission handshake, as a node that does not follow the
// protocol would: the tests check that membership and the stream gate
// refuse it on their own.
func JoinPastTheDoor(ctx context.Context, n *Node, addr string) (int, error) {
	ai, err := peer.AddrInfoFromString(addr)
	if err != nil {
		return 0, err
	}
	if err := n.h.Connect(ctx, *ai); err != nil {
		return 0, fmt.Errorf("connect: %w", err)
	}
	return n.ml.Join([]string{n.joinString(ai.ID)})
}

// NumMemberlistMembers counts the nodes n's memberlist holds alive,
// whatever its member table says.
func NumMemberlistMembers(n *Node) int { return n.ml.NumMembers() }

// ForgeDead sends, from n, a memberlist packet to peer to that declares
// victim dead at incarnation inc, naming from as the accuser: what a
// hostile member can do, since memberlist's dead messages are unsigned.
func ForgeDead(n *Node, to, victim peer.ID, from string, inc uint32) error {
	_, err := n.tr.WriteToAddress(encodeAccusation(true, victim.String(), from, inc), memberlist.Address{Name: to.String()})
	return err
}

// Accusations describes the suspect and dead messages about id that n
// received.
func Accusations(n *Node, id peer.ID) []string { return n.tr.accused.about(id, time.Now()) }

// DisputeTimeout bounds a disputed member's direct check.
const DisputeTimeout = disputeTimeout

// ForgeAlive sends, from n, a memberlist alive message to peer to about the
// node of key announced at addr ("ip:port"), its metadata m signed at
// incarnation inc and gossiped at memberlist incarnation mlInc: what any
// host can send, member or not (alive messages are unsigned).
func ForgeAlive(n *Node, to peer.ID, key crypto.PrivKey, m Meta, addr string, inc uint64, mlInc uint32) error {
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return err
	}
	fields, err := m.MarshalBinary()
	if err != nil {
		return err
	}
	h, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	port64, err := strconv.ParseUint(ps, 10, 16)
	if err != nil {
		return err
	}
	ip, port := net.ParseIP(h), uint16(port64)
	meta, err := signMeta(key, inc, ip, port, fields)
	if err != nil {
		return err
	}
	// memberlist's alive message: type 4, then a msgpack map of its fields.
	bin := func(b []byte, v []byte) []byte {
		if len(v) < 256 {
			return append(append(b, 0xc4, byte(len(v))), v...)
		}
		return append(binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(len(v))), v...)
	}
	b := []byte{4, 0x86}
	b = binary.BigEndian.AppendUint32(append(append(b, mpStr("Incarnation")...), 0xce), mlInc)
	b = append(append(b, mpStr("Node")...), mpStr(id.String())...)
	b = bin(append(b, mpStr("Addr")...), ip.To4())
	b = binary.BigEndian.AppendUint16(append(append(b, mpStr("Port")...), 0xcd), port)
	b = bin(append(b, mpStr("Meta")...), meta)
	b = bin(append(b, mpStr("Vsn")...), []byte{memberlist.ProtocolVersionMin, memberlist.ProtocolVersionMax, 2, 0, 0, 0})
	_, err = n.tr.WriteToAddress(b, memberlist.Address{Name: to.String()})
	return err
}
