package node

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// A member whose state hash differs from the majority's at the same round
// finds the majority through the gossiped metadata and adopts their state.
func TestDivergedMemberResyncs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 6, p2ptest.Options{})
	me, others := sw.Nodes[1], sw.Nodes[2:]
	ctx := context.Background()
	const n = 64
	mine, err := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	mine.Round = 3
	// The majority's state: round 3, other weights.
	phi := make([]float32, n)
	for i := range phi {
		phi[i] = float32(i)
	}
	theirs, _ := optimizer.NewDiLoCo(optimizer.DefaultDiLoCo(), nil, phi)
	theirs.Round = 3
	blob := encodeState(theirs.State())
	for i, o := range others {
		hash := theirs.StateHash()
		if i == 3 {
			hash = mine.StateHash() // one member agrees with us: 2 against 3
		}
		if err := o.UpdateMeta(ctx, func(m *p2p.Meta) { m.Round, m.StateHash = 3, hash }); err != nil {
			t.Fatal(err)
		}
		o.ServeBulk(func(context.Context, peer.ID, string) (io.ReaderAt, int64, error) {
			return bytes.NewReader(blob), int64(len(blob)), nil
		}, 0)
	}
	peers := &P2PPeers{n: me}
	var majority []optimizer.PeerID
	deadline := time.Now().Add(10 * time.Second)
	for len(majority) != 3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		majority = divergedFrom(me, peers, mine)
	}
	if len(majority) != 3 {
		t.Fatalf("majority %v, want the 3 members that agree with each other", majority)
	}
	if err := adoptFrom(ctx, me, mine, n, majority); err != nil {
		t.Fatal(err)
	}
	if mine.StateHash() != theirs.StateHash() {
		t.Fatal("state not adopted")
	}
	// Now with the majority: nothing to do.
	if got := divergedFrom(me, peers, mine); len(got) != 0 {
		t.Fatalf("still diverged from %v", got)
	}
}
