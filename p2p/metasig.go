package p2p

import (
	"bytes"
	"fmt"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Gossiped metadata is signed by its node's identity key, so that no other
// peer can rewrite it: memberlist lets anyone gossip an "alive" message with
// a higher incarnation for any node, and that message carries the node's
// metadata (role, round, state hash). On the wire the metadata is
//
//	fields (Meta.MarshalBinary) | signature (64 bytes, ed25519) | "SG"
//
// and the signature covers metaSigContext followed by the fields. A member
// whose metadata is unsigned, or signed by another key than its name's
// (the peer ID embeds the public key), is refused (NotifyAlive, NotifyMerge)
// and its updates are ignored.
const (
	metaSigLen     = 64
	metaSigTrailer = "SG"
	metaSigContext = "skein/meta-signature/1"
)

// signMeta returns fields with their signature by key appended.
func signMeta(key crypto.PrivKey, fields []byte) ([]byte, error) {
	sig, err := key.Sign(append([]byte(metaSigContext), fields...))
	if err != nil {
		return nil, fmt.Errorf("%w: signing: %v", ErrBadMeta, err)
	}
	if len(sig) != metaSigLen {
		return nil, fmt.Errorf("%w: a %d-byte signature; identities must be ed25519", ErrBadMeta, len(sig))
	}
	out := make([]byte, 0, len(fields)+metaSigLen+len(metaSigTrailer))
	out = append(append(append(out, fields...), sig...), metaSigTrailer...)
	if len(out) > MetaLimit {
		return nil, fmt.Errorf("%w: %d bytes signed, limit %d", ErrBadMeta, len(out), MetaLimit)
	}
	return out, nil
}

// verifyMeta checks that b is metadata signed by id's key and returns the
// fields. It never panics and allocates only for the signed message.
func verifyMeta(id peer.ID, b []byte) ([]byte, error) {
	if len(b) > MetaLimit {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrBadMeta, len(b), MetaLimit)
	}
	n := len(b) - metaSigLen - len(metaSigTrailer)
	if n < 0 || !bytes.HasSuffix(b, []byte(metaSigTrailer)) {
		return nil, fmt.Errorf("%w: unsigned", ErrBadMeta)
	}
	fields, sig := b[:n], b[n:n+metaSigLen]
	pub, err := id.ExtractPublicKey()
	if err != nil {
		return nil, fmt.Errorf("%w: no public key in peer ID %s: %v", ErrBadMeta, id, err)
	}
	ok, err := pub.Verify(append([]byte(metaSigContext), fields...), sig)
	if err != nil || !ok {
		return nil, fmt.Errorf("%w: signature does not match %s", ErrBadMeta, id)
	}
	return fields, nil
}
