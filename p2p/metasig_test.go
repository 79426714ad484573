package p2p

import (
	"crypto/rand"
	"errors"
	"net"
	"strconv"
	"testing"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// signedMember returns a fresh identity and m encoded and signed by it, as
// a node without an address (memberlist.Node's zero Addr and Port) gossips
// its metadata.
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
	return id, signAt(t, key, m, "", 1)
}

// signAt returns m signed by key at incarnation inc for a node announcing
// addr ("ip:port"; "" for none).
func signAt(t testing.TB, key crypto.PrivKey, m Meta, addr string, inc uint64) []byte {
	t.Helper()
	fields, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	ip, port := splitAddr(t, addr)
	b, err := signMeta(key, inc, ip, port, fields)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func splitAddr(t testing.TB, addr string) (net.IP, uint16) {
	if addr == "" {
		return nil, 0
	}
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	return net.ParseIP(h), uint16(port)
}

// memberAt returns the memberlist node of a fresh identity announcing addr,
// its metadata m signed for that address, and a function that returns the
// same member moved to another address (re-signed, as it would).
func memberAt(t testing.TB, m Meta, addr string) (*memberlist.Node, func(addr string) *memberlist.Node) {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(key)
	inc := uint64(0)
	at := func(addr string) *memberlist.Node {
		inc++
		ip, port := splitAddr(t, addr)
		return &memberlist.Node{Name: id.String(), Addr: ip, Port: port, Meta: signAt(t, key, m, addr, inc)}
	}
	return at(addr), at
}

// Metadata is accepted only signed by the member's own key for the address
// it is gossiped with: a peer cannot gossip another member's round, role or
// state hash (issue 9: a forged higher-incarnation "alive" rewrote an honest
// member's announced round), nor move a member to another address.
func TestMetaSignature(t *testing.T) {
	ev := newEvents("run", "", nil)
	key, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	honest, _ := peer.IDFromPrivateKey(key)
	const at = "203.0.113.5:4001"
	good := signAt(t, key, Meta{RunID: "run", Round: 5, StateHash: 7}, at, 10)
	_, forged := signedMember(t, Meta{RunID: "run", Round: 1_000_000, StateHash: 66})
	unsigned, _ := Meta{RunID: "run", Round: 9}.MarshalBinary()
	tampered := append([]byte(nil), good...)
	tampered[len(tampered)-metaSigLen-len(metaSigTrailer)-metaIncLen-1] ^= 1 // the state hash's last byte
	bumped := append([]byte(nil), good...)
	bumped[len(bumped)-metaSigLen-len(metaSigTrailer)-1] ^= 1 // the incarnation's last byte
	for _, c := range []struct {
		name string
		meta []byte
		addr string
		ok   bool
	}{
		{"signed by its own key", good, at, true},
		{"signed by another member's key", forged, at, false},
		{"unsigned", unsigned, at, false},
		{"tampered after signing", tampered, at, false},
		{"incarnation changed after signing", bumped, at, false},
		{"gossiped at another IP", good, "203.0.113.6:4001", false},
		{"gossiped at another port", good, "203.0.113.5:4002", false},
		{"gossiped without an address", good, "", false},
		{"too short", []byte("SG"), at, false},
		{"empty", nil, at, false},
	} {
		ip, port := splitAddr(t, c.addr)
		err := ev.NotifyAlive(&memberlist.Node{Name: honest.String(), Addr: ip, Port: port, Meta: c.meta})
		if c.ok && err != nil {
			t.Errorf("%s: refused: %v", c.name, err)
		}
		if !c.ok && !errors.Is(err, ErrBadMeta) {
			t.Errorf("%s: %v, want ErrBadMeta", c.name, err)
		}
	}
	ip, port := splitAddr(t, at)
	m, err := ev.member(&memberlist.Node{Name: honest.String(), Addr: ip, Port: port, Meta: good})
	if err != nil || m.Meta.Round != 5 || m.Meta.StateHash != 7 || m.inc != 10 {
		t.Fatalf("decoded %+v at %d, %v", m.Meta, m.inc, err)
	}
}

// A member's signed metadata cannot be replayed: an alive message carrying
// metadata older than the member's current one is refused, whatever
// memberlist incarnation it comes with, and so is the member's own newer
// metadata re-gossiped at another address; the member itself may sign a
// newer one at a new address.
func TestMetaReplay(t *testing.T) {
	ev := newEvents("run", "", nil)
	ev.setPolicy(Admission{})
	key, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	id, _ := peer.IDFromPrivateKey(key)
	alive := func(m Meta, signedAt, gossipedAt string, inc uint64) error {
		ip, port := splitAddr(t, gossipedAt)
		n := &memberlist.Node{Name: id.String(), Addr: ip, Port: port, Meta: signAt(t, key, m, signedAt, inc)}
		if err := ev.NotifyAlive(n); err != nil {
			return err
		}
		ev.NotifyUpdate(n)
		return nil
	}
	const home, away = "203.0.113.5:4001", "198.51.100.9:4001"
	if err := alive(Meta{RunID: "run", Round: 1}, home, home, 10); err != nil {
		t.Fatal(err)
	}
	if err := alive(Meta{RunID: "run", Round: 2}, home, home, 11); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name               string
		signedAt, gossiped string
		inc                uint64
		want               error
	}{
		{"older metadata replayed", home, home, 10, errStaleMeta},
		{"newer metadata re-gossiped at another address", home, away, 12, ErrBadMeta},
	} {
		if err := alive(Meta{RunID: "run", Round: 1}, c.signedAt, c.gossiped, c.inc); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if m, ok := ev.get(id); !ok || m.Meta.Round != 2 || m.Addr != home {
		t.Fatalf("member now %+v at %s (listed %v), want round 2 at %s", m.Meta, m.Addr, ok, home)
	}
	// A late honest copy of older metadata in a push/pull does not refuse
	// the whole merge.
	ip, port := splitAddr(t, home)
	old := &memberlist.Node{Name: id.String(), Addr: ip, Port: port, Meta: signAt(t, key, Meta{RunID: "run"}, home, 10)}
	if err := ev.NotifyMerge([]*memberlist.Node{old}); err != nil {
		t.Errorf("merge with an older copy: %v", err)
	}
	if err := alive(Meta{RunID: "run", Round: 3}, away, away, 13); err != nil {
		t.Errorf("the member's own move: %v", err)
	}
}

func FuzzVerifyMeta(f *testing.F) {
	key, _, _ := crypto.GenerateEd25519Key(rand.Reader)
	id, _ := peer.IDFromPrivateKey(key)
	f.Add(signAt(f, key, Meta{RunID: "run", Device: "cpu"}, "192.0.2.1:4001", 7), uint16(4001))
	f.Add([]byte("SG"), uint16(0))
	f.Fuzz(func(t *testing.T, in []byte, port uint16) {
		fields, _, err := verifyMeta(id, net.IPv4(192, 0, 2, 1), port, in)
		if err != nil {
			return
		}
		var m Meta
		if m.UnmarshalBinary(fields) != nil {
			return // a validly signed but malformed encoding is refused later
		}
	})
}
