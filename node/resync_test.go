package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
	"github.com/skein-ml/skein/replica"
	"github.com/skein-ml/skein/telemetry"
	"github.com/skein-ml/skein/transport"
)

// Catch-up follows a later round only through a chain of certificates from
// the member's own: a lone member announcing round r+1 (and serving weights
// of its choice under their true hash), or two sybils announcing round
// 2^62, are not followed, however they sign; the honest members'
// certificate for the next round is. Before certificates, the lone jump
// was followed within two rounds and a constant quorum of 2 moved members
// to any round (issue [1/4]).
func TestCatchUpFollowsOnlyCertificates(t *testing.T) {
	w := newCertWorld(t, 7)
	me, honest, attackers := w.me, w.sw.Nodes[2:5], w.sw.Nodes[5:7]
	ctx := context.Background()
	state, sign, serve := w.state, w.sign, w.serve
	waitAnnounced := func(want int, round uint64) { t.Helper(); w.waitFor(0, want, round) }
	s3 := state(3, 0)
	mine := state(3, 0)
	group3 := append([]*p2p.Node{me}, honest...)
	anchor := sign(s3, group3)
	v := w.volunteer(mine, anchor, false)
	// Lone jump: one member of round 3's group announces round 4 with the
	// true hash of its own weights, certified by itself alone (a group of
	// one) and by itself in round 3's group.
	jump := state(4, 1000)
	serve(honest[0], jump, sign(jump, []*p2p.Node{honest[0]}))
	serve(attackers[0], jump, sign(jump, group3, honest[0]))
	waitAnnounced(2, 4)
	if err := v.catchUp(ctx); err != nil || mine.Round != 3 {
		t.Fatalf("lone jump followed: round %d, err %v", mine.Round, err)
	}
	// Two sybils: round 2^62, both sign a group of their own.
	far := state(1<<62, 2000)
	for _, a := range attackers {
		serve(a, far, sign(far, attackers))
	}
	waitAnnounced(2, 1<<62)
	if err := v.catchUp(ctx); err != nil || mine.Round != 3 {
		t.Fatalf("sybils followed: round %d, err %v", mine.Round, err)
	}
	// The honest round 4: certified by 3 of round 3's 4 members.
	s4 := state(4, 7)
	cert4 := sign(s4, group3, honest...)
	for _, h := range honest {
		serve(h, s4, cert4)
	}
	waitAnnounced(3, 4)
	if err := v.catchUp(ctx); err != nil || mine.Round != 4 || mine.StateHash() != s4.StateHash() {
		t.Fatalf("the certified round was not adopted: round %d, err %v", mine.Round, err)
	}
}

// The sybils soak's breakdown under churn, replayed over libp2p: two
// sybils of five volunteers are half of this member's trusted group of
// four (it straggled in that round). One honest member of the group leaves
// (killed, or paused past its suspicion); this member then sees the two
// sybils and one honest volunteer, and the sybils announce round 2^62
// with a certificate both signed. Their chain does not extend the trusted
// one; the re-anchoring rule for churn took it (half of the trusted group
// and 2 of the 3 volunteers live signed it). It is refused now: the
// volunteer that left still counts for the witness window.
func TestCatchUpRemembersAbsentVolunteers(t *testing.T) {
	w := newCertWorld(t, 6)
	me, h1, h2, sybils := w.me, w.sw.Nodes[2], w.sw.Nodes[3], w.sw.Nodes[4:6]
	ctx := context.Background()
	s7 := w.state(7, 7)
	group := append([]*p2p.Node{h1, h2}, sybils...)
	c7 := w.sign(s7, group, h1, h2, sybils[0])
	mine := w.state(7, 7)
	v := w.volunteer(mine, c7, true)
	for _, p := range group {
		w.serve(p, s7, c7)
	}
	w.waitFor(4, 4, 7)
	if err := v.catchUp(ctx); err != nil || mine.Round != 7 {
		t.Fatalf("round %d, err %v", mine.Round, err)
	}
	if err := h2.Close(); err != nil {
		t.Logf("h2 leaving: %v", err)
	}
	far := w.state(1<<62, 2000)
	cfar := w.sign(far, sybils)
	for _, s := range sybils {
		w.serve(s, far, cfar)
	}
	w.waitFor(3, 2, 1<<62)
	if err := replica.VouchedBy(ids(announcements(me)), cfar); err != nil || !cfar.Rejoins(c7) {
		t.Fatalf("the sybils must pass the rule as it was for this test to mean anything: %v", err)
	}
	if err := v.catchUp(ctx); err != nil || mine.Round != 7 || v.certs.book.Trusted() != c7 {
		t.Fatalf("re-anchored on the sybils' certificate: round %d, err %v", mine.Round, err)
	}
	// The bootstrap's anchor outranks the rule: h1 alone certified round
	// 8 (a quarter of the trusted group, which the rule for churn refuses),
	// and the bootstrap countersigned it; the sybils' chain does not extend
	// the anchor.
	s8 := w.state(8, 8)
	c8 := w.sign(s8, []*p2p.Node{h1})
	an, err := replica.Countersign(c8, w.sw.Seed.Sign)
	if err != nil {
		t.Fatal(err)
	}
	enc, _ := an.MarshalBinary()
	if err := w.sw.Seed.Handle(p2p.ProtoAnchor, p2p.MessageFrameConfig(replica.MaxAnchorBytes), func(_ context.Context, s *p2p.Stream) error {
		return s.WriteFrame(1, enc)
	}); err != nil {
		t.Fatal(err)
	}
	w.serve(h1, s8, c8)
	w.waitFor(3, 1, 8)
	if err := v.catchUp(ctx); err != nil || mine.Round != 8 || mine.StateHash() != s8.StateHash() || v.certs.book.Trusted().Hash != c8.Hash {
		t.Fatalf("the bootstrap's anchor was not taken: round %d, err %v", mine.Round, err)
	}
}

// A member serving a state other than the one announced is refused: the
// download must have the hash the run announces.
func TestAdoptRefusesForgedState(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 3, p2ptest.Options{})
	me, liar := sw.Nodes[1], sw.Nodes[2]
	const n = 64
	mine, _ := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, make([]float32, n))
	honest, _ := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, make([]float32, n))
	honest.Round = 4
	forged := make([]float32, n)
	for i := range forged {
		forged[i] = 1000
	}
	blob, _ := encodeServed(4, forged, make([]float32, n))
	liar.ServeBulk(func(context.Context, peer.ID, string) (io.ReaderAt, int64, error) {
		return bytes.NewReader(blob), int64(len(blob)), nil
	}, 0)
	id := transport.PeerID(liar.ID().String())
	err := adoptFrom(context.Background(), me, nil, mine, n, []transport.PeerID{id}, honest.StateHash(), nil)
	if !errors.Is(err, ErrBadState) || mine.Round != 0 {
		t.Fatalf("forged state: err %v, round %d; want ErrBadState and nothing adopted", err, mine.Round)
	}
}

// A member that reported a round with one state and then took the run's
// other state for that round reports the round again with the state it
// goes on from (the bootstrap replaces its earlier report); nothing is sent
// when the state did not change or belongs to another round.
func TestCorrectedReport(t *testing.T) {
	dl, err := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, make([]float32, 8))
	if err != nil {
		t.Fatal(err)
	}
	dl.Round = 7
	var out bytes.Buffer
	v := &Volunteer{dl: dl, reporter: &reporter{queue: make(chan telemetry.Report, 1)}}
	v.cfg.Progress = &out
	v.lastSent = telemetry.Report{Round: 7, StateHash: 0xaaaa, Tokens: 640, TrainLoss: 3.5}
	for _, c := range []struct {
		name  string
		round uint64
		hash  uint64
		want  bool
	}{
		{"same state", 7, 0xaaaa, false},
		{"another round", 8, 0xbbbb, false},
		{"taken the run's state", 7, 0xbbbb, true},
		{"already corrected", 7, 0xbbbb, false},
	} {
		dl.Round, v.stateHash = c.round, c.hash
		v.corrected()
		select {
		case rep := <-v.reporter.queue:
			if !c.want {
				t.Fatalf("%s: sent %+v", c.name, rep)
			}
			if rep.Round != 7 || rep.StateHash != 0xbbbb || rep.Tokens != 640 || rep.TrainLoss != 3.5 {
				t.Fatalf("%s: sent %+v, want round 7's report with state bbbb", c.name, rep)
			}
		default:
			if c.want {
				t.Fatalf("%s: nothing sent", c.name)
			}
		}
	}
	if !strings.Contains(out.String(), "round 7: ended it apart from the run") {
		t.Fatalf("console: %q", out.String())
	}
}
