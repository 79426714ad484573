package node

import (
	"context"
	"testing"

	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/replica"
)

// A newcomer checks the announcers' chain from the certificate the
// bootstrap it dialled countersigned: three sybils, more than the two
// honest volunteers in its view, announcing round 2^62 with a certificate
// they all signed are not followed (their chain does not extend the
// bootstrap's anchor; a majority of the volunteers the newcomer sees
// signed it, which was all it asked before), and the honest chain from
// the anchor is.
func TestNewcomerFollowsBootstrapAnchor(t *testing.T) {
	w := newCertWorld(t, 7)
	boot, me, honest, sybils := w.sw.Seed, w.me, w.sw.Nodes[2:4], w.sw.Nodes[4:7]
	ctx := context.Background()
	state, sign, serve := w.state, w.sign, w.serve
	waitAnnounced := func(want int, round uint64) { t.Helper(); w.waitFor(0, want, round) }
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
	v := w.volunteer(mine, &replica.Certificate{Run: me.RunID(), Hash: mine.StateHash()}, true)

	far := state(1<<62, 2000)
	cfar := sign(far, sybils)
	for _, s := range sybils {
		serve(s, far, cfar)
	}
	waitAnnounced(3, 1<<62)
	if err := replica.VouchedBy(ids(announcements(me)), cfar); err != nil {
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
