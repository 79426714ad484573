package p2p

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Gossiped metadata is signed by its node's identity key, so that no other
// peer can rewrite it: memberlist lets anyone gossip an "alive" message with
// a higher incarnation for any node, and that message carries the node's
// metadata (role, round, state hash) and its address. On the wire the
// metadata is
//
//	fields (Meta.MarshalBinary) | incarnation (8 bytes, big endian) |
//	signature (64 bytes, ed25519) | "SG"
//
// and the signature covers metaSigContext, the incarnation, the memberlist
// address the node announces (IP as 16 bytes, port as 2), then the fields.
// The incarnation is the signer's own: it grows with every metadata it
// signs (memberlist's incarnation is not signed, and memberlist does not
// show it to its delegates). A member whose metadata is unsigned, signed by
// another key than its name's (the peer ID embeds the public key), or
// gossiped with another address than the one signed, is refused
// (NotifyAlive, NotifyMerge) and its updates are ignored; metadata older
// than the member's current one (a replay) is refused too (errStaleMeta).
const (
	metaSigLen     = 64
	metaIncLen     = 8
	metaSigTrailer = "SG"
	metaSigContext = "skein/meta-signature/2"
)

// errStaleMeta refuses metadata signed at a lower incarnation than the
// member's current one: a replay, or an honest but late copy.
var errStaleMeta = errors.New("p2p: metadata older than the member's current one")

// metaSigned is the message a metadata signature covers.
func metaSigned(inc uint64, ip net.IP, port uint16, fields []byte) []byte {
	b := make([]byte, 0, len(metaSigContext)+metaIncLen+net.IPv6len+2+len(fields))
	b = append(b, metaSigContext...)
	b = binary.BigEndian.AppendUint64(b, inc)
	var ip16 [net.IPv6len]byte
	copy(ip16[:], ip.To16()) // zero for an address that is no IP
	b = append(b, ip16[:]...)
	b = binary.BigEndian.AppendUint16(b, port)
	return append(b, fields...)
}

// signMeta returns fields with the incarnation and their signature by key
// for a node announcing ip:port.
func signMeta(key crypto.PrivKey, inc uint64, ip net.IP, port uint16, fields []byte) ([]byte, error) {
	sig, err := key.Sign(metaSigned(inc, ip, port, fields))
	if err != nil {
		return nil, fmt.Errorf("%w: signing: %v", ErrBadMeta, err)
	}
	if len(sig) != metaSigLen {
		return nil, fmt.Errorf("%w: a %d-byte signature; identities must be ed25519", ErrBadMeta, len(sig))
	}
	out := make([]byte, 0, len(fields)+metaIncLen+metaSigLen+len(metaSigTrailer))
	out = append(binary.BigEndian.AppendUint64(append(out, fields...), inc), sig...)
	out = append(out, metaSigTrailer...)
	if len(out) > MetaLimit {
		return nil, fmt.Errorf("%w: %d bytes signed, limit %d", ErrBadMeta, len(out), MetaLimit)
	}
	return out, nil
}

// verifyMeta checks that b is metadata signed by id's key for a node
// announcing ip:port and returns the fields and the incarnation. It never
// panics and allocates only for the signed message.
func verifyMeta(id peer.ID, ip net.IP, port uint16, b []byte) ([]byte, uint64, error) {
	if len(b) > MetaLimit {
		return nil, 0, fmt.Errorf("%w: %d bytes, limit %d", ErrBadMeta, len(b), MetaLimit)
	}
	n := len(b) - metaIncLen - metaSigLen - len(metaSigTrailer)
	if n < 0 || !bytes.HasSuffix(b, []byte(metaSigTrailer)) {
		return nil, 0, fmt.Errorf("%w: unsigned", ErrBadMeta)
	}
	fields, inc, sig := b[:n], binary.BigEndian.Uint64(b[n:]), b[n+metaIncLen:n+metaIncLen+metaSigLen]
	pub, err := id.ExtractPublicKey()
	if err != nil {
		return nil, 0, fmt.Errorf("%w: no public key in peer ID %s: %v", ErrBadMeta, id, err)
	}
	ok, err := pub.Verify(metaSigned(inc, ip, port, fields), sig)
	if err != nil || !ok {
		return nil, 0, fmt.Errorf("%w: signature does not match %s at %s", ErrBadMeta, id, net.JoinHostPort(ip.String(), fmt.Sprint(port)))
	}
	return fields, inc, nil
}
