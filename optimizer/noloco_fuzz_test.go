package optimizer

import (
	"context"
	"testing"

	"github.com/skein-ml/skein/transport"
)

// FuzzNoLoCoDecode feeds arbitrary gossip bodies to the decoder of a member
// with a model of 64 parameters: nothing may panic, and what is accepted is
// within MaxAbs (TestNoLoCoDecodeBounded checks the allocations).
func FuzzNoLoCoDecode(f *testing.F) {
	const n = 64
	net := transport.NewMemNetwork()
	defer net.Close()
	nl, err := NewNoLoCo(context.Background(), DefaultNoLoCo(), net.Join("a"), randomVec(n, 1, 1))
	if err != nil {
		f.Fatal(err)
	}
	defer nl.Close()
	copy(nl.own, randomVec(n, 2, 0.1))
	good, err := nl.encodeBody()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, body []byte) {
		phi, d := make([]float32, n), make([]float32, n)
		if err := decodeGossip(nl.dec, body, phi, d, nl.cfg.MaxAbs); err != nil {
			return
		}
		for _, x := range [][]float32{phi, d} {
			if err := checkFinite(x, nl.cfg.MaxAbs); err != nil {
				t.Fatal(err)
			}
		}
	})
}
