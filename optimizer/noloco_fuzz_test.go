package optimizer

import (
	"slices"
	"testing"

	"github.com/skein-ml/skein/transport"
)

// FuzzNoLoCoDecode feeds arbitrary gossip bodies to the decoder of a member
// with a model of 64 parameters: nothing may panic, and what is accepted is
// within MaxAbs (TestNoLoCoDecodeBounded checks the allocations).
func FuzzNoLoCoDecode(f *testing.F) {
	const n = 64
	g, err := NewGossip(DefaultNoLoCo(), "a", n)
	if err != nil {
		f.Fatal(err)
	}
	defer g.Close()
	good, err := g.encode(randomVec(n, 1, 1), randomVec(n, 2, 0.1), 0)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		phi, d := make([]float32, n), make([]float32, n)
		if err := decodeGossip(g.dec, body, phi, d, g.cfg.MaxAbs); err != nil {
			return
		}
		for _, x := range [][]float32{phi, d} {
			if err := checkFinite(x, g.cfg.MaxAbs); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// FuzzGossipStep feeds arbitrary gossip bodies from a partner, for the
// step running or one of the next three, to a machine: nothing may panic,
// and every step's means are within MaxAbs.
func FuzzGossipStep(f *testing.F) {
	const n = 64
	g, err := NewGossip(DefaultNoLoCo(), "a", n)
	if err != nil {
		f.Fatal(err)
	}
	defer g.Close()
	g.SetMembers([]transport.PeerID{"a", "b"})
	phi, d := randomVec(n, 1, 1), randomVec(n, 2, 0.1)
	good, err := g.encode(phi, d, 0)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(0), good)
	f.Add(uint8(1), good)
	f.Add(uint8(0), good[:len(good)/2])
	f.Fuzz(func(t *testing.T, ahead uint8, body []byte) {
		if g.cur == nil {
			if err := g.Start(g.step, phi, slices.Clone(d)); err != nil {
				t.Fatal(err)
			}
		}
		g.Step("b", appendMessage(nil, header{kind: kindGossip, round: g.step + uint64(ahead%4)}, body))
		if _, _, res := g.Ready(); res != nil {
			for _, x := range [][]float32{res.PhiBar, res.DBar} {
				if err := checkFinite(x, g.cfg.MaxAbs); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
