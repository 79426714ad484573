package p2p

import (
	"github.com/libp2p/go-libp2p/core/peer"
)

// Sign signs msg with this node's identity key (ed25519): the butterfly
// collective signs its contributions and groups with it, so that any member
// can prove to the others who produced them.
func (n *Node) Sign(msg []byte) ([]byte, error) { return n.key.Sign(msg) }

// VerifyPeer checks sig over msg against the key embedded in the peer ID
// id; false for a malformed ID or signature.
func VerifyPeer(id string, msg, sig []byte) bool {
	pid, err := peer.Decode(id)
	if err != nil {
		return false
	}
	pub, err := pid.ExtractPublicKey()
	if err != nil {
		return false
	}
	ok, err := pub.Verify(msg, sig)
	return err == nil && ok
}
