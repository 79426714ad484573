package replica

import (
	"errors"
	"slices"
	"testing"

	"github.com/skein-ml/skein/transport"
)

// The countersignature binds the bootstrap to one certificate of one run:
// a forged one, one of another run, round, state or group, one made by
// another key, and the bootstrap's vote (another context) are refused.
func TestAnchorVerify(t *testing.T) {
	k, ids := newKeys(8)
	boot, g := ids[7], ids[:5]
	c := k.cert("run", 7, 0xabc, g, g[:3])
	counter := func(c *Certificate, by transport.PeerID) []byte {
		a, err := Countersign(c, k.signAs(by))
		if err != nil {
			t.Fatal(err)
		}
		return a.Sig
	}
	good := counter(c, boot)
	forged := slices.Clone(good)
	forged[5] ^= 1
	vote, _ := k.signAs(boot)(VoteBytes("run", 7, 0xabc, c.Group))
	tests := []struct {
		name string
		a    Anchor
		want error
	}{
		{"countersigned", Anchor{c, good}, nil},
		{"forged", Anchor{c, forged}, ErrBadSignature},
		{"another key", Anchor{c, counter(c, ids[0])}, ErrBadSignature},
		{"other run", Anchor{c, counter(k.cert("other", 7, 0xabc, g, g[:3]), boot)}, ErrBadSignature},
		{"other round", Anchor{c, counter(k.cert("run", 8, 0xabc, g, g[:3]), boot)}, ErrBadSignature},
		{"other state", Anchor{c, counter(k.cert("run", 7, 0xdef, g, g[:3]), boot)}, ErrBadSignature},
		{"other group", Anchor{c, counter(k.cert("run", 7, 0xabc, ids[:4], ids[:3]), boot)}, ErrBadSignature},
		{"a vote, not a countersignature", Anchor{c, vote}, ErrBadSignature},
		{"a minority countersigned", Anchor{k.cert("run", 7, 0xabc, g, g[:2]), counter(k.cert("run", 7, 0xabc, g, g[:2]), boot)}, ErrMinority},
		{"a certificate of another run", Anchor{k.cert("other", 7, 0xabc, g, g), counter(k.cert("other", 7, 0xabc, g, g), boot)}, ErrWrongRun},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.a.Verify("run", k, boot)
			if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("Verify: %v, want %v", err, tt.want)
			}
		})
	}
}

func TestAnchorRoundTrip(t *testing.T) {
	k, ids := newKeys(5)
	a, err := Countersign(k.cert("run", 1<<40, 0xfeed, ids[:4], ids[:3]), k.signAs(ids[4]))
	if err != nil {
		t.Fatal(err)
	}
	b, err := a.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var d Anchor
	if err := d.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if err := d.Verify("run", k, ids[4]); err != nil {
		t.Fatal(err)
	}
	if b2, _ := d.MarshalBinary(); !slices.Equal(b, b2) {
		t.Fatal("round trip changed the bytes")
	}
	for i := range b {
		if err := new(Anchor).UnmarshalBinary(b[:i]); !errors.Is(err, ErrBadCert) {
			t.Fatalf("%d of %d bytes: %v", i, len(b), err)
		}
	}
	if _, err := (&Anchor{Cert: a.Cert}).MarshalBinary(); !errors.Is(err, ErrBadCert) {
		t.Fatalf("no countersignature encoded: %v", err)
	}
}

// A newcomer's book checks a chain against the bootstrap's anchor: sybils
// that outnumber the honest volunteers in its view (so that their
// certificate passes Anchorless) cannot extend the anchor; the honest
// chain can, and the anchor's round is trusted even before anything
// extends it.
func TestBookAdoptFrom(t *testing.T) {
	k, ids := newKeys(12)
	honest, sybils := ids[:3], ids[3:9]
	genesis := &Certificate{Run: "run"}
	anchor := k.cert("run", 10, 100, honest, honest)
	c11 := k.cert("run", 11, 110, honest, honest[:2])
	far := k.cert("run", 1<<62, 666, sybils, sybils)
	live := append(slices.Clone(sybils), honest...)
	newBook := func() *Book {
		b := NewBook("run", k, genesis)
		b.Anchorless = func(c *Certificate) error { return VouchedBy(live, c) }
		return b
	}
	// Without the anchor (the bootstrap down), the sybils' view wins.
	if got, err := newBook().AdoptFrom(nil, []*Certificate{far}); err != nil || got != far {
		t.Fatalf("without an anchor: %v, %v; want the sybils' certificate (the fallback's limit)", got, err)
	}
	b := newBook()
	if _, err := b.AdoptFrom(anchor, []*Certificate{far}); !errors.Is(err, ErrBrokenChain) {
		t.Fatalf("sybils' chain from the anchor: %v, want ErrBrokenChain", err)
	}
	if _, err := b.AdoptFrom(k.cert("run", 10, 100, honest, honest[:1]), nil); !errors.Is(err, ErrMinority) {
		t.Fatalf("an anchor without a majority: %v", err)
	}
	if b.Trusted() != genesis {
		t.Fatal("a refused chain moved the book")
	}
	if got, err := b.AdoptFrom(anchor, nil); err != nil || got != anchor {
		t.Fatalf("the anchor alone: %v, %v", got, err)
	}
	// Trusted now has a group: AdoptFrom is Adopt, the anchor unused.
	if got, err := b.AdoptFrom(anchor, []*Certificate{c11}); err != nil || got != c11 {
		t.Fatalf("the honest chain: %v, %v", got, err)
	}
	if _, err := b.AdoptFrom(anchor, []*Certificate{far}); !errors.Is(err, ErrBrokenChain) {
		t.Fatalf("sybils after the honest chain: %v", err)
	}
}

func TestVouchedBy(t *testing.T) {
	k, ids := newKeys(6)
	c := k.cert("run", 3, 1, ids, ids[:3])
	for _, tt := range []struct {
		name string
		live []transport.PeerID
		ok   bool
	}{
		{"all live signed", ids[:3], true},
		{"three of five", ids[:5], true},
		{"half", ids[2:6], false},
		{"none live", nil, false},
		{"none of the live", ids[3:], false},
	} {
		if err := VouchedBy(tt.live, c); (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrMinority)) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

// Anchors come from the network: a claimed group of 65535 members in a few
// bytes allocates nothing like it, and nothing panics.
func FuzzAnchor(f *testing.F) {
	k, ids := newKeys(3)
	a, _ := Countersign(k.cert("run", 3, 9, ids[:2], ids[:2]), k.signAs(ids[2]))
	good, _ := a.MarshalBinary()
	f.Add(good)
	f.Add(append([]byte("SKAN\x01"), make([]byte, 64)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		var a Anchor
		if err := a.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrBadCert) {
				t.Fatalf("error %v does not match ErrBadCert", err)
			}
			return
		}
		out, err := a.MarshalBinary()
		if err != nil || !slices.Equal(out, b) {
			t.Fatalf("a decoded anchor re-encodes differently (%v)", err)
		}
		_ = a.Verify("run", k, ids[2])
	})
}
