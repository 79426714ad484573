package p2p

import (
	"encoding/binary"
	"net"
	"strconv"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Hostile hosts, for the chaos soak only (skein demo --chaos --hostile
// ghosts): what any host on the internet can send a run's members without
// joining it. Nothing honest calls this file.

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

// mpStr encodes s as go-msgpack's MsgpackHandle does: legacy raw.
func mpStr(s string) []byte {
	if len(s) < 32 {
		return append([]byte{0xa0 | byte(len(s))}, s...)
	}
	return append(binary.BigEndian.AppendUint16([]byte{0xda}, uint16(len(s))), s...)
}
