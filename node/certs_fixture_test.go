package node

import (
	"bytes"
	"context"
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

// certWorld is a libp2p swarm in which the test plays every member but
// me: each announces, serves and certifies whatever state the test
// chooses (honest or not), and me catches up with the production rules.
type certWorld struct {
	t  *testing.T
	sw *p2ptest.Swarm
	me *p2p.Node
}

// certStateLen is the length of the states in a certWorld.
const certStateLen = 64

func newCertWorld(t *testing.T, nodes int) *certWorld {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, nodes, p2ptest.Options{})
	return &certWorld{t: t, sw: sw, me: sw.Nodes[1]}
}

// state is a DiLoCo state at round whose phi starts at v.
func (w *certWorld) state(round uint64, v float32) *optimizer.DiLoCo {
	phi := make([]float32, certStateLen)
	for i := range phi {
		phi[i] = v + float32(i)
	}
	d, _ := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, phi)
	d.Round = round
	return d
}

func nodeID(p *p2p.Node) transport.PeerID { return transport.PeerID(p.ID().String()) }

// sign makes d's certificate over group, signed by signers (all of group
// when none are named).
func (w *certWorld) sign(d *optimizer.DiLoCo, group []*p2p.Node, signers ...*p2p.Node) *replica.Certificate {
	if len(signers) == 0 {
		signers = group
	}
	var ids []transport.PeerID
	for _, g := range group {
		ids = append(ids, nodeID(g))
	}
	slices.Sort(ids)
	c := &replica.Certificate{Run: w.me.RunID(), Round: d.Round, Hash: d.StateHash(), Group: ids, Sigs: make([][]byte, len(ids))}
	for _, s := range signers {
		i, _ := slices.BinarySearch(ids, nodeID(s))
		c.Sigs[i], _ = s.Sign(replica.VoteBytes(c.Run, c.Round, c.Hash, c.Group))
	}
	return c
}

// serve makes p announce d's state, serve it, and serve the certificates
// of chain after the round asked, whatever they are.
func (w *certWorld) serve(p *p2p.Node, d *optimizer.DiLoCo, chain ...*replica.Certificate) {
	w.t.Helper()
	blob, _ := encodeServed(d.State())
	p.ServeBulk(func(context.Context, peer.ID, string) (io.ReaderAt, int64, error) {
		return bytes.NewReader(blob), int64(len(blob)), nil
	}, 0)
	p2ptest.ServeChain(w.t, p, chain...)
	if err := p.UpdateMeta(context.Background(), func(m *p2p.Meta) { m.Round, m.StateHash = d.Round, d.StateHash() }); err != nil {
		w.t.Logf("announcing: %v", err)
	}
}

// waitFor waits until me sees exactly live other volunteers, want of them
// announcing round.
func (w *certWorld) waitFor(live, want int, round uint64) {
	w.t.Helper()
	err := w.sw.Eventually(p2ptest.Slowdown*10*time.Second, func() error {
		got, all := 0, announcements(w.me)
		for _, a := range all {
			if a.round == round {
				got++
			}
		}
		if got < want || (live > 0 && len(all) != live) {
			return fmt.Errorf("%d announcements of round %d among %d volunteers, want %d among %d", got, round, len(all), want, live)
		}
		return nil
	})
	if err != nil {
		w.t.Fatal(err)
	}
}

// volunteer is me as a volunteer holding mine, its chain trusted from
// anchor, with the production rules for certificates taken without an
// earlier group or across a broken chain when vouch is set.
func (w *certWorld) volunteer(mine *optimizer.DiLoCo, anchor *replica.Certificate, vouch bool) *Volunteer {
	w.t.Helper()
	v := &Volunteer{log: testLogger("me"), pn: w.me, dl: mine, n: certStateLen}
	var live func() []transport.PeerID
	if vouch {
		live = func() []transport.PeerID { return ids(announcements(w.me)) }
	}
	var err error
	if v.certs, err = newCerts(w.me, v.log, anchor, "", live); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(v.certs.close)
	return v
}
