package bootstrap

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
	"github.com/skein-ml/skein/replica"
	"github.com/skein-ml/skein/transport"
)

// The bootstrap countersigns the chain it follows: not a certificate that
// only one of the four volunteers it sees signed, as its first; then the
// honest round 5, which three of them signed; not a round 2^62 certified
// by four sybils that joined since (more than the honest volunteers it
// sees, so a newcomer's rule alone would take it), which does not extend
// round 5; then round 6, which does. The newest countersigned certificate
// is served on p2p.ProtoAnchor and names the status page's certified
// states.
func TestBootstrapCountersignsChain(t *testing.T) {
	sw := p2ptest.NewSwarm(t, 5, p2ptest.Options{})
	vols, honest, sybil := sw.Nodes[1:], sw.Nodes[1:4], sw.Nodes[4]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	path := filepath.Join(t.TempDir(), AnchorFile)
	a := newAnchors(sw.Opts.RunID, path, slog.New(slog.DiscardHandler))
	if err := a.start(ctx, sw.Seed.Node); err != nil {
		t.Fatal(err)
	}
	id := func(p *p2p.Node) transport.PeerID { return transport.PeerID(p.ID().String()) }
	sign := func(round, hash uint64, group, signers []*p2p.Node) *replica.Certificate {
		var ids []transport.PeerID
		for _, g := range group {
			ids = append(ids, id(g))
		}
		slices.Sort(ids)
		c := &replica.Certificate{Run: sw.Opts.RunID, Round: round, Hash: hash, Group: ids, Sigs: make([][]byte, len(ids))}
		for _, s := range signers {
			i, _ := slices.BinarySearch(ids, id(s))
			c.Sigs[i], _ = s.Sign(replica.VoteBytes(c.Run, c.Round, c.Hash, c.Group))
		}
		return c
	}
	// serve makes p announce round and serve chain after the round asked.
	serve := func(p *p2p.Node, round uint64, chain ...*replica.Certificate) {
		p2ptest.ServeChain(t, p, chain...)
		if err := p.UpdateMeta(ctx, func(m *p2p.Meta) { m.Round, m.StateHash = round, 1 }); err != nil {
			t.Logf("announcing: %v", err)
		}
		if err := sw.Eventually(p2ptest.Slowdown*10*time.Second, func() error {
			if m, ok := sw.Seed.Member(p.ID()); !ok || m.Meta.Round != round {
				return fmt.Errorf("the bootstrap does not see round %d announced", round)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	// served is the round of the anchor served to a volunteer; 0 for none.
	served := func() uint64 {
		t.Helper()
		s, err := vols[0].Open(ctx, sw.Seed.ID(), p2p.ProtoAnchor, p2p.MessageFrameConfig(replica.MaxAnchorBytes))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		_, b, err := s.ReadFrame()
		if err != nil || len(b) == 0 {
			return 0
		}
		var an replica.Anchor
		if err := an.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		if err := an.Verify(sw.Opts.RunID, sw.Seed.Signer(), id(sw.Seed.Node)); err != nil {
			t.Fatal(err)
		}
		return an.Cert.Round
	}
	far := sign(1<<62, 666, []*p2p.Node{sybil}, []*p2p.Node{sybil})
	serve(sybil, far.Round, far)
	a.poll(ctx)
	if r := served(); r != 0 {
		t.Fatalf("a certificate one of four live volunteers signed was countersigned first (round %d)", r)
	}
	c5 := sign(5, 55, honest, honest)
	for _, h := range honest {
		serve(h, 5, c5)
	}
	serve(sybil, 5, c5)
	a.poll(ctx)
	if r := served(); r != 5 {
		t.Fatalf("countersigned round %d, want 5", r)
	}
	sybils := []*p2p.Node{sybil}
	for range 3 {
		n, err := sw.Add(sw.NodeConfig(len(sw.Nodes)))
		if err != nil {
			t.Fatal(err)
		}
		sybils = append(sybils, n)
	}
	sw.WaitMembers(8, p2ptest.Slowdown*30*time.Second)
	far = sign(1<<62, 666, sybils, sybils)
	if err := replica.VouchedBy(a.volunteers(), far); err != nil {
		t.Fatalf("the sybils must outnumber the honest volunteers for this test to mean anything: %v", err)
	}
	for _, s := range sybils {
		serve(s, far.Round, far)
	}
	a.poll(ctx)
	if r := served(); r != 5 {
		t.Fatalf("countersigned round %d, want 5: a chain that does not extend the bootstrap's", r)
	}
	c6 := sign(6, 66, vols, []*p2p.Node{honest[0], honest[1], sybil}) // two of round 5's three sign
	for _, h := range honest {
		serve(h, 6, c5, c6)
	}
	a.poll(ctx)
	if r := served(); r != 6 {
		t.Fatalf("countersigned round %d, want 6", r)
	}
	for _, tt := range []struct {
		round, hash uint64
		ok          bool
	}{{0, 0, false}, {5, 55, true}, {6, 66, true}, {7, 0, false}} {
		if h, ok := a.certified(tt.round); h != tt.hash || ok != tt.ok {
			t.Errorf("certified(%d) = %d, %v; want %d, %v", tt.round, h, ok, tt.hash, tt.ok)
		}
	}

	// A restarted bootstrap goes on from the certificate it countersigned
	// last; not from a damaged file or another run's certificate.
	log := slog.New(slog.DiscardHandler)
	if r := newAnchors(sw.Opts.RunID, path, log).book.Trusted(); r.Round != 6 || r.Hash != 66 {
		t.Fatalf("restarted at round %d, want the countersigned round 6", r.Round)
	}
	if r := newAnchors("another run", path, log).book.Trusted(); r.Round != 0 || len(r.Group) != 0 {
		t.Fatalf("another run's bootstrap took this run's certificate (round %d)", r.Round)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1 // the last signature
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := newAnchors(sw.Opts.RunID, path, log).book.Trusted(); r.Round != 0 {
		t.Fatalf("restarted at round %d from a damaged certificate", r.Round)
	}
}
