package p2p

import (
	"crypto/rand"
	"errors"
	"testing"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// signedMember returns a fresh identity and m encoded and signed by it, as
// a node gossips its metadata.
func signedMember(t testing.TB, m Meta) (peer.ID, []byte) {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	fields, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	b, err := signMeta(key, fields)
	if err != nil {
		t.Fatal(err)
	}
	return id, b
}

// Metadata is accepted only signed by the member's own key: a peer cannot
// gossip another member's round, role or state hash (issue 9: a forged
// higher-incarnation "alive" rewrote an honest member's announced round).
func TestMetaSignature(t *testing.T) {
	ev := newEvents("run", "", nil)
	honest, good := signedMember(t, Meta{RunID: "run", Round: 5, StateHash: 7})
	liar, forged := signedMember(t, Meta{RunID: "run", Round: 1_000_000, StateHash: 66})
	_ = liar
	unsigned, _ := Meta{RunID: "run", Round: 9}.MarshalBinary()
	tampered := append([]byte(nil), good...)
	tampered[len(tampered)-metaSigLen-len(metaSigTrailer)-1] ^= 1 // the state hash's last byte
	for _, c := range []struct {
		name string
		meta []byte
		ok   bool
	}{
		{"signed by its own key", good, true},
		{"signed by another member's key", forged, false},
		{"unsigned", unsigned, false},
		{"tampered after signing", tampered, false},
		{"too short", []byte("SG"), false},
		{"empty", nil, false},
	} {
		err := ev.NotifyAlive(&memberlist.Node{Name: honest.String(), Meta: c.meta})
		if c.ok && err != nil {
			t.Errorf("%s: refused: %v", c.name, err)
		}
		if !c.ok && !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: %v, want ErrBadMeta", c.name, err)
		}
	}
	m, err := ev.member(&memberlist.Node{Name: honest.String(), Meta: good})
	if err != nil || m.Meta.Round != 5 || m.Meta.StateHash != 7 {
		t.Fatalf("decoded %+v, %v", m.Meta, err)
	}
}

func FuzzVerifyMeta(f *testing.F) {
	id, good := signedMember(f, Meta{RunID: "run", Device: "cpu"})
	f.Add(good)
	f.Add([]byte("SG"))
	f.Fuzz(func(t *testing.T, in []byte) {
		fields, err := verifyMeta(id, in)
		if err != nil {
			return
		}
		var m Meta
		if m.UnmarshalBinary(fields) != nil {
			return // a validly signed but malformed encoding is refused later
		}
	})
}
