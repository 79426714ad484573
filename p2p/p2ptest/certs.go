package p2ptest

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/replica"
)

// ServeChain makes p answer p2p.ProtoCerts with the certificates of chain
// past the round asked, whatever they are: a member (honest or not) serving
// the chain the test chooses, replacing the handler p had.
func ServeChain(t testing.TB, p *p2p.Node, chain ...*replica.Certificate) {
	t.Helper()
	p.Unhandle(p2p.ProtoCerts)
	err := p.Handle(p2p.ProtoCerts, p2p.MessageFrameConfig(replica.MaxCertBytes), func(_ context.Context, s *p2p.Stream) error {
		_, req, err := s.ReadFrame()
		if err != nil || len(req) != 8 {
			return err
		}
		for _, c := range chain {
			if c.Round > binary.LittleEndian.Uint64(req) {
				b, _ := c.MarshalBinary()
				if err := s.WriteFrame(1, b); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
