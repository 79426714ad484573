package replica

import (
	"crypto/ed25519"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/skein-ml/skein/transport"
)

// keys is a deterministic ed25519 signer for tests: member IDs are names,
// each with its own key.
type keys map[transport.PeerID]ed25519.PrivateKey

func newKeys(n int) (keys, []transport.PeerID) {
	k := keys{}
	var ids []transport.PeerID
	for i := range n {
		id := transport.PeerID(fmt.Sprintf("12D3KooW%044d", i)) // as long as a libp2p ed25519 peer ID
		seed := make([]byte, ed25519.SeedSize)
		binary.LittleEndian.PutUint64(seed, uint64(i)+1)
		k[id] = ed25519.NewKeyFromSeed(seed)
		ids = append(ids, id)
	}
	return k, ids
}

func (k keys) Sign([]byte) ([]byte, error) { return nil, errors.New("use signAs") }

func (k keys) Verify(id transport.PeerID, msg, sig []byte) bool {
	key, ok := k[id]
	return ok && ed25519.Verify(key.Public().(ed25519.PublicKey), msg, sig)
}

func (k keys) signAs(id transport.PeerID) func([]byte) ([]byte, error) {
	return func(msg []byte) ([]byte, error) { return ed25519.Sign(k[id], msg), nil }
}

// cert makes a certificate of run for (round, hash) over group, signed by
// signers (which may include keys outside group: they sign but do not count).
func (k keys) cert(run string, round, hash uint64, group, signers []transport.PeerID) *Certificate {
	group = sortedGroup(group)
	c := &Certificate{Run: run, Round: round, Hash: hash, Group: group, Sigs: make([][]byte, len(group))}
	msg := VoteBytes(run, round, hash, group)
	for _, s := range signers {
		if i, ok := slices.BinarySearch(group, s); ok {
			c.Sigs[i] = ed25519.Sign(k[s], msg)
		}
	}
	return c
}

func TestCertificateVerify(t *testing.T) {
	k, ids := newKeys(8)
	g := ids[:5]
	good := k.cert("run", 7, 0xabc, g, g[:3])
	replay := k.cert("run", 7, 0xabc, g, g[:3])
	replay.Round = 8 // signatures of round 7 presented for round 8
	otherRun := k.cert("other", 7, 0xabc, g, g[:3])
	otherRun.Run = "run" // another run's signatures under this run's name
	forged := k.cert("run", 7, 0xabc, g, g[:3])
	forged.Hash = 0xdef // a state the signers did not vote for
	swapped := k.cert("run", 7, 0xabc, g, g[:3])
	swapped.Sigs[0], swapped.Sigs[1] = swapped.Sigs[1], swapped.Sigs[0]
	regrouped := k.cert("run", 7, 0xabc, g, g[:3])
	regrouped.Group = sortedGroup(append(slices.Clone(g[:4]), ids[7])) // group changed after signing
	tests := []struct {
		name string
		c    *Certificate
		want error
	}{
		{"majority", good, nil},
		{"all", k.cert("run", 7, 0xabc, g, g), nil},
		{"half is not a majority", k.cert("run", 7, 0xabc, ids[:4], ids[:2]), ErrMinority},
		{"minority", k.cert("run", 7, 0xabc, g, g[:2]), ErrMinority},
		{"outsiders do not count", k.cert("run", 7, 0xabc, g, append(slices.Clone(g[:2]), ids[5:]...)), ErrMinority},
		{"other round", replay, ErrBadSignature},
		{"other run", otherRun, ErrBadSignature},
		{"other state", forged, ErrBadSignature},
		{"swapped signatures", swapped, ErrBadSignature},
		{"other group", regrouped, ErrBadSignature},
		{"named for another run", k.cert("other", 7, 0xabc, g, g), ErrWrongRun},
		{"unsorted group", &Certificate{Run: "run", Group: []transport.PeerID{"b", "a"}, Sigs: make([][]byte, 2)}, ErrBadCert},
		{"empty group", &Certificate{Run: "run"}, ErrBadCert},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Verify("run", k)
			if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("Verify: %v, want %v", err, tt.want)
			}
		})
	}
}

// A chain is followed only where each link carries a strict majority of
// the previous group: a group made of newcomers (sybils) cannot extend it,
// however many they are, and a real run with churn can.
func TestChain(t *testing.T) {
	k, ids := newKeys(12)
	genesis := &Certificate{Run: "run", Round: 0, Hash: 1}
	c1 := k.cert("run", 1, 11, ids[:4], ids[:3])
	// Churn: member 3 leaves, 4 and 5 join; 0..2 (3 of round 1's 4) sign.
	c2 := k.cert("run", 2, 22, ids[:6], []transport.PeerID{ids[0], ids[1], ids[2], ids[4]})
	chain, err := VerifyChain("run", k, genesis, []*Certificate{c1, c2})
	if err != nil || chain != c2 {
		t.Fatalf("honest chain: %v", err)
	}
	// Sybils: round 3's group is 8 newcomers and member 0; all sign.
	sybils := append([]transport.PeerID{ids[0]}, ids[4:]...)
	c3 := k.cert("run", 3, 33, sybils, sybils)
	if err := c3.Verify("run", k); err != nil {
		t.Fatalf("the sybils' certificate is well signed: %v", err)
	}
	if _, err := VerifyChain("run", k, genesis, []*Certificate{c1, c2, c3}); !errors.Is(err, ErrBrokenChain) {
		t.Fatalf("sybils extended the chain: %v", err)
	}
	// Lone jump: one member of round 2's group vouches for round 3 alone.
	lone := k.cert("run", 3, 33, ids[:6], ids[:1])
	if _, err := VerifyChain("run", k, c2, []*Certificate{lone}); !errors.Is(err, ErrMinority) && !errors.Is(err, ErrBrokenChain) {
		t.Fatalf("a lone announcer was followed: %v", err)
	}
	// Going back is not extending.
	if _, err := VerifyChain("run", k, c2, []*Certificate{c1}); !errors.Is(err, ErrBrokenChain) {
		t.Fatalf("an older certificate extended the chain: %v", err)
	}
}

func TestCertificateRoundTrip(t *testing.T) {
	k, ids := newKeys(5)
	c := k.cert("run-1", 1<<40, 0xfeedface, ids, ids[1:4])
	b, err := c.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var d Certificate
	if err := d.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if err := d.Verify("run-1", k); err != nil {
		t.Fatal(err)
	}
	b2, _ := d.MarshalBinary()
	if !slices.Equal(b, b2) {
		t.Fatal("round trip changed the bytes")
	}
	for i := range b {
		if err := new(Certificate).UnmarshalBinary(b[:i]); !errors.Is(err, ErrBadCert) {
			t.Fatalf("%d of %d bytes: %v", i, len(b), err)
		}
	}
}

// A claimed group of 65535 members in a few bytes allocates nothing like it.
func FuzzCertificate(f *testing.F) {
	k, ids := newKeys(3)
	good, _ := k.cert("run", 3, 9, ids, ids[:2]).MarshalBinary()
	f.Add(good)
	f.Add([]byte("SKCT\x01\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var c Certificate
		if err := c.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrBadCert) {
				t.Fatalf("error %v does not match ErrBadCert", err)
			}
			return
		}
		out, err := c.MarshalBinary()
		if err != nil || !slices.Equal(out, b) {
			t.Fatalf("a decoded certificate re-encodes differently (%v)", err)
		}
		_ = c.Verify("run", k)
	})
}

// Rejoins: half of the previous group among the signers (a straggler gone,
// a dissenting vote), not a group of newcomers however large.
func TestRejoins(t *testing.T) {
	k, ids := newKeys(10)
	prev := k.cert("run", 6, 1, ids[:4], ids[:4])
	for _, tt := range []struct {
		name string
		c    *Certificate
		want bool
	}{
		{"two of four stayed and signed", k.cert("run", 7, 2, ids[:3], ids[:2]), true},
		{"one of four", k.cert("run", 7, 2, ids[:3], ids[:1]), false},
		{"six newcomers", k.cert("run", 7, 2, ids[4:], ids[4:]), false},
		{"one old member among newcomers", k.cert("run", 7, 2, ids[3:], ids[3:]), false},
	} {
		if got := tt.c.Rejoins(prev); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	if (&Certificate{}).Rejoins(&Certificate{}) {
		t.Error("an anchor without a group is rejoined by anything")
	}
}
