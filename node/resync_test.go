package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

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
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 7, p2ptest.Options{})
	me, honest, attackers := sw.Nodes[1], sw.Nodes[2:5], sw.Nodes[5:7]
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
	// sign makes round's certificate of d's state over group, signed by signers.
	sign := func(d *optimizer.DiLoCo, group, signers []*p2p.Node) *replica.Certificate {
		var ids []transport.PeerID
		for _, g := range group {
			ids = append(ids, id(g))
		}
		slices.Sort(ids)
		c := &replica.Certificate{Run: me.RunID(), Round: d.Round, Hash: d.StateHash(), Group: ids, Sigs: make([][]byte, len(ids))}
		for _, s := range signers {
			i, _ := slices.BinarySearch(ids, id(s))
			c.Sigs[i], _ = s.Sign(replica.VoteBytes(c.Run, c.Round, c.Hash, c.Group))
		}
		return c
	}
	// serve makes p announce d's state, serve it, and serve chain.
	serve := func(p *p2p.Node, d *optimizer.DiLoCo, chain ...*replica.Certificate) {
		blob, _ := encodeServed(d.State())
		p.ServeBulk(func(context.Context, peer.ID, string) (io.ReaderAt, int64, error) {
			return bytes.NewReader(blob), int64(len(blob)), nil
		}, 0)
		// The chain as the member serves it, whatever it holds.
		p.Unhandle(p2p.ProtoCerts)
		err := p.Handle(p2p.ProtoCerts, certFrames(), func(_ context.Context, s *p2p.Stream) error {
			if _, _, err := s.ReadFrame(); err != nil {
				return err
			}
			for _, c := range chain {
				b, _ := c.MarshalBinary()
				if err := s.WriteFrame(1, b); err != nil {
					return err
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
	s3 := state(3, 0)
	mine := state(3, 0)
	group3 := append([]*p2p.Node{me}, honest...)
	anchor := sign(s3, group3, group3)
	v := &Volunteer{log: testLogger("me"), pn: me, dl: mine, n: n}
	var err error
	if v.certs, err = newCerts(me, v.log, anchor, "", nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.certs.close)
	waitAnnounced := func(want int, round uint64) {
		t.Helper()
		deadline := time.Now().Add(p2ptest.Slowdown * 10 * time.Second)
		for {
			got := 0
			for _, a := range announcements(me) {
				if a.round == round {
					got++
				}
			}
			if got >= want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d announcements of round %d arrived, want %d", got, round, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// Lone jump: one member of round 3's group announces round 4 with the
	// true hash of its own weights, certified by itself alone (a group of
	// one) and by itself in round 3's group.
	jump := state(4, 1000)
	serve(honest[0], jump, sign(jump, []*p2p.Node{honest[0]}, []*p2p.Node{honest[0]}))
	serve(attackers[0], jump, sign(jump, group3, []*p2p.Node{honest[0]}))
	waitAnnounced(2, 4)
	if err := v.catchUp(ctx); err != nil || mine.Round != 3 {
		t.Fatalf("lone jump followed: round %d, err %v", mine.Round, err)
	}
	// Two sybils: round 2^62, both sign a group of their own.
	far := state(1<<62, 2000)
	for _, a := range attackers {
		serve(a, far, sign(far, attackers, attackers))
	}
	waitAnnounced(2, 1<<62)
	if err := v.catchUp(ctx); err != nil || mine.Round != 3 {
		t.Fatalf("sybils followed: round %d, err %v", mine.Round, err)
	}
	// The honest round 4: certified by 3 of round 3's 4 members.
	s4 := state(4, 7)
	cert4 := sign(s4, group3, honest)
	for _, h := range honest {
		serve(h, s4, cert4)
	}
	waitAnnounced(3, 4)
	if err := v.catchUp(ctx); err != nil || mine.Round != 4 || mine.StateHash() != s4.StateHash() {
		t.Fatalf("the certified round was not adopted: round %d, err %v", mine.Round, err)
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

// A certificate taken without an earlier group (a newcomer) needs a strict
// majority of the volunteers this member sees: not one, not a fixed two.
func TestVouchedByLive(t *testing.T) {
	a := func(id string) announcement { return announcement{id: transport.PeerID(id), round: 9, hash: 1} }
	cert := func(signers ...string) *replica.Certificate {
		group := []transport.PeerID{"a", "b", "c", "d", "x", "y"}
		c := &replica.Certificate{Group: group, Sigs: make([][]byte, len(group))}
		for _, s := range signers {
			i, _ := slices.BinarySearch(group, transport.PeerID(s))
			c.Sigs[i] = []byte{1}
		}
		return c
	}
	live := []announcement{a("a"), a("b"), a("c"), a("d")}
	for _, tt := range []struct {
		name string
		c    *replica.Certificate
		ok   bool
	}{
		{"three of four live", cert("a", "b", "c"), true},
		{"half", cert("a", "b"), false},
		{"two sybils and one live", cert("x", "y", "a"), false},
		{"sybils only", cert("x", "y"), false},
	} {
		if err := vouchedByLive(live, tt.c); (err == nil) != tt.ok {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	if err := vouchedByLive([]announcement{a("b")}, cert("b")); err != nil {
		t.Errorf("the only other volunteer: %v", err)
	}
}
