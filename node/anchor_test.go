package node

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
	"github.com/skein-ml/skein/replica"
	"github.com/skein-ml/skein/transport"
)

// A newcomer checks the announcers' chain from the certificate the
// bootstrap it dialled countersigned: three sybils, more than the two
// honest volunteers in its view, announcing round 2^62 with a certificate
// they all signed are not followed (their chain does not extend the
// bootstrap's anchor; a majority of the volunteers the newcomer sees
// signed it, which was all it asked before), and the honest chain from
// the anchor is.
func TestNewcomerFollowsBootstrapAnchor(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 7, p2ptest.Options{})
	boot, me, honest, sybils := sw.Seed, sw.Nodes[1], sw.Nodes[2:4], sw.Nodes[4:7]
	ctx := context.Background()
	const n = 64
	state := func(round uint64, v float32) *optimizer.DiLoCo {
		phi := make([]float32, n)
		for i := range phi {
			phi[i] = v + float32(i)
		}
		d, _ := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, phi)
		d.Round = round
		return d
	}
	id := func(p *p2p.Node) transport.PeerID { return transport.PeerID(p.ID().String()) }
	// sign makes d's certificate over group, signed by all of it.
	sign := func(d *optimizer.DiLoCo, group []*p2p.Node) *replica.Certificate {
		var ids []transport.PeerID
		for _, g := range group {
			ids = append(ids, id(g))
		}
		slices.Sort(ids)
		c := &replica.Certificate{Run: me.RunID(), Round: d.Round, Hash: d.StateHash(), Group: ids, Sigs: make([][]byte, len(ids))}
		for _, s := range group {
			i, _ := slices.BinarySearch(ids, id(s))
			c.Sigs[i], _ = s.Sign(replica.VoteBytes(c.Run, c.Round, c.Hash, c.Group))
		}
		return c
	}
	// serve makes p announce d's state, serve it, and serve chain after
	// the round asked.
	serve := func(p *p2p.Node, d *optimizer.DiLoCo, chain ...*replica.Certificate) {
		blob, _ := encodeServed(d.State())
		p.ServeBulk(func(context.Context, peer.ID, string) (io.ReaderAt, int64, error) {
			return bytes.NewReader(blob), int64(len(blob)), nil
		}, 0)
		p.Unhandle(p2p.ProtoCerts)
		err := p.Handle(p2p.ProtoCerts, certFrames(), func(_ context.Context, s *p2p.Stream) error {
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
		if err := p.UpdateMeta(ctx, func(m *p2p.Meta) { m.Round, m.StateHash = d.Round, d.StateHash() }); err != nil {
			t.Logf("announcing: %v", err)
		}
	}
	waitAnnounced := func(want int, round uint64) {
		t.Helper()
		err := sw.Eventually(p2ptest.Slowdown*10*time.Second, func() error {
			got := 0
			for _, a := range announcements(me) {
				if a.round == round {
					got++
				}
			}
			if got < want {
				return fmt.Errorf("%d announcements of round %d, want %d", got, round, want)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The bootstrap countersigned the honest round 5.
	s5, s6 := state(5, 5), state(6, 6)
	c5, c6 := sign(s5, honest), sign(s6, honest)
	an, err := replica.Countersign(c5, boot.Sign)
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := an.MarshalBinary()
	if err := boot.Handle(p2p.ProtoAnchor, p2p.MessageFrameConfig(replica.MaxAnchorBytes), func(_ context.Context, s *p2p.Stream) error {
		return s.WriteFrame(1, enc)
	}); err != nil {
		t.Fatal(err)
	}
	// The newcomer: the run's start state, the production rule for a
	// certificate taken without an earlier group.
	mine := state(0, 0)
	v := &Volunteer{log: testLogger("me"), pn: me, dl: mine, n: n}
	v.certs, err = newCerts(me, v.log, &replica.Certificate{Run: me.RunID(), Hash: mine.StateHash()}, "", func(c *replica.Certificate) error {
		return vouchedByLive(announcements(me), c)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.certs.close)

	far := state(1<<62, 2000)
	cfar := sign(far, sybils)
	for _, s := range sybils {
		serve(s, far, cfar)
	}
	waitAnnounced(3, 1<<62)
	if err := vouchedByLive(announcements(me), cfar); err != nil {
		t.Fatalf("the sybils must pass the newcomer's own rule for this test to mean anything: %v", err)
	}
	if err := v.catchUp(ctx); err != nil || mine.Round != 0 {
		t.Fatalf("sybils followed: round %d, err %v", mine.Round, err)
	}
	for _, h := range honest {
		serve(h, s6, c5, c6)
	}
	waitAnnounced(2, 6)
	if err := v.catchUp(ctx); err != nil || mine.Round != 6 || mine.StateHash() != s6.StateHash() {
		t.Fatalf("the honest chain from the anchor was not followed: round %d, err %v", mine.Round, err)
	}
	if got := v.certs.book.Trusted(); got.Round != 6 || got.Hash != c6.Hash {
		t.Fatalf("trusted round %d, want 6", got.Round)
	}
}
