package p2p

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	p2ptestutil "github.com/libp2p/go-libp2p/core/test"
	"github.com/libp2p/go-libp2p/p2p/host/peerstore/pstoremem"
	ma "github.com/multiformats/go-multiaddr"
)

// skewClock is the real clock moved forward by a settable offset: the
// peerstore's view of time, so a test can pass address TTLs in an instant.
type skewClock struct{ off atomic.Int64 }

func (c *skewClock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *skewClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// pastRecentTTL is longer than the TTL libp2p gives recently seen addresses.
var pastRecentTTL = peerstore.RecentlyConnectedAddrTTL + time.Minute

func checkAddrs(t *testing.T, ps peerstore.Peerstore, id peer.ID, step string, present, absent []ma.Multiaddr) {
	t.Helper()
	have := ps.Addrs(id)
	for _, a := range present {
		if !containsAddr(have, a) {
			t.Errorf("%s: %s missing from the peerstore (have %v)", step, a, have)
		}
	}
	for _, a := range absent {
		if containsAddr(have, a) {
			t.Errorf("%s: %s still in the peerstore", step, a)
		}
	}
}

// TestMemberAddrsOutliveRecentTTL: a member's addresses stay in the
// peerstore for as long as it is a member, whatever identify does to them and
// however long its connection has been down (the peerstore's clock is moved
// past libp2p's 15 min RecentlyConnectedAddrTTL); when it moves or goes, its
// old addresses expire like any recently seen peer's.
func TestMemberAddrsOutliveRecentTTL(t *testing.T) {
	clk := &skewClock{}
	seedID := p2ptestutil.RandPeerIDFatal(t)
	// Nothing listens there: the seed only shapes members' relayed addresses.
	seedAddr := ma.StringCast("/ip4/127.0.0.1/tcp/1")
	cfg := DefaultNodeConfig("run")
	cfg.ListenAddrs = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}
	cfg.Timing = LANTiming()
	cfg.JoinAlone = true
	cfg.JoinTimeout = 2 * time.Second
	cfg.RejoinInterval = time.Hour // no rejoin, no sweep: this test is about TTLs
	cfg.Bootstrap = []string{seedAddr.String() + "/p2p/" + seedID.String()}
	cfg.peerstoreClock = clk
	n, err := NewNode(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	ps := n.h.Peerstore()

	// A member known only through membership: no connection, no identify.
	node, move := memberAt(t, Meta{RunID: "run", TCPPort: 10}, "127.0.0.2:9")
	id, _ := peer.Decode(node.Name)
	quic := ma.StringCast("/ip4/127.0.0.2/udp/9/quic-v1")
	tcp := ma.StringCast("/ip4/127.0.0.2/tcp/10")
	relayed := seedAddr.Encapsulate(ma.StringCast("/p2p/" + seedID.String() + "/p2p-circuit"))
	pinned := []ma.Multiaddr{quic, tcp, relayed}
	// The node dials a new member at once; that dial (to nobody here) must
	// be over before the test plays identify's part, or under load it
	// interleaves with the address updates below.
	dialed := make(chan struct{}, 1)
	hook := func(p peer.ID) {
		if p == id {
			dialed <- struct{}{}
		}
	}
	n.memberDialed.Store(&hook)
	n.ev.NotifyJoin(node)
	select {
	case <-dialed:
	case <-time.After(30 * time.Second):
		t.Fatal("the dial to the new member never ended")
	}
	checkAddrs(t, ps, id, "joined", pinned, nil)

	// What identify does to a peer's addresses (go-libp2p v0.51.0,
	// identify/id.go): on each identify message it lowers the connected and
	// recently connected ones to TempAddrTTL, adds those the peer advertises
	// and deletes the other temporary ones; on the last disconnect it turns
	// connected addresses into recently connected ones.
	other := ma.StringCast("/ip4/192.0.2.7/udp/4001/quic-v1")
	identify := func(advertised ...ma.Multiaddr) {
		ps.UpdateAddrs(id, peerstore.RecentlyConnectedAddrTTL, peerstore.TempAddrTTL)
		ps.UpdateAddrs(id, peerstore.ConnectedAddrTTL, peerstore.TempAddrTTL)
		ps.AddAddrs(id, advertised, peerstore.ConnectedAddrTTL)
		ps.UpdateAddrs(id, peerstore.TempAddrTTL, 0)
	}
	disconnect := func() {
		addrs := ps.Addrs(id)
		ps.UpdateAddrs(id, peerstore.ConnectedAddrTTL, peerstore.TempAddrTTL)
		ps.AddAddrs(id, addrs, peerstore.RecentlyConnectedAddrTTL)
		ps.UpdateAddrs(id, peerstore.TempAddrTTL, 0)
	}
	identify(other, quic)
	identify(other) // e.g. behind NAT: memberlist's address is not among its own
	disconnect()
	checkAddrs(t, ps, id, "after identify", []ma.Multiaddr{quic, tcp, relayed, other}, nil)
	clk.advance(pastRecentTTL)
	// other had libp2p's TTL and is gone: the clock did pass it.
	checkAddrs(t, ps, id, "disconnected past the recent TTL", pinned, []ma.Multiaddr{other})

	// The member restarts on another port: the new address is pinned, the
	// old one expires.
	node = move("127.0.0.2:11")
	moved := ma.StringCast("/ip4/127.0.0.2/udp/11/quic-v1")
	n.ev.NotifyUpdate(node)
	checkAddrs(t, ps, id, "moved", []ma.Multiaddr{moved, quic, tcp, relayed}, nil)
	clk.advance(pastRecentTTL)
	checkAddrs(t, ps, id, "moved, past the recent TTL", []ma.Multiaddr{moved, tcp, relayed}, []ma.Multiaddr{quic})

	// It fails: its addresses stay a while (memberlist still gossips to the
	// dead), then expire.
	n.ev.NotifyLeave(node)
	awaitUnlisted(t, n.ev, id) // once the direct check has failed
	checkAddrs(t, ps, id, "failed", []ma.Multiaddr{moved, tcp, relayed}, nil)
	clk.advance(pastRecentTTL)
	if have := ps.Addrs(id); len(have) != 0 {
		t.Errorf("failed member past the recent TTL still has addresses %v", have)
	}

	// A real member whose connection is gone: it is killed, and memberlist
	// has not yet declared it failed (suspicion takes seconds). Its
	// memberlist address is still there past the recent TTL.
	cfg2 := DefaultNodeConfig("run")
	cfg2.ListenAddrs = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg2.Timing = LANTiming()
	cfg2.JoinTimeout = 10 * time.Second
	for _, a := range n.Addrs() {
		if _, err := a.ValueForProtocol(ma.P_QUIC_V1); err == nil {
			cfg2.Bootstrap = []string{a.String()}
		}
	}
	m, err := NewNode(context.Background(), cfg2)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	var member Member
	waitFor("the second node is a member", func() bool {
		var ok bool
		member, ok = n.Member(m.ID())
		return ok
	})
	addr, err := quicAddr(member.Addr)
	if err != nil {
		t.Fatal(err)
	}
	m.Shutdown()
	waitFor("the connection is closed", func() bool { return n.h.Network().Connectedness(m.ID()) != network.Connected })
	time.Sleep(200 * time.Millisecond) // identify's disconnect handler rewrites TTLs
	if _, ok := n.Member(m.ID()); !ok {
		t.Skip("the killed node was declared failed already (machine too slow for this check)")
	}
	clk.advance(pastRecentTTL)
	checkAddrs(t, ps, m.ID(), "member without a connection, past the recent TTL", []ma.Multiaddr{addr}, nil)
}

// TestPeerKeeperForgetsIdlePeers: peers that are neither members nor
// connected leave the peerstore entirely (addresses, keys, protocols,
// metadata) one ForgetAfter after a sweep first found them so; members,
// connected peers, seeds and the node itself stay. Ten times
// maxAddrIndex idle peers are fed, as a flood of ping hints would.
func TestPeerKeeperForgetsIdlePeers(t *testing.T) {
	ps, err := pstoremem.NewPeerstore()
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	ids := randPeers(t, 10*maxAddrIndex)
	self, seed, member, conn, back, flap := ids[0], ids[1], ids[2], ids[3], ids[4], ids[5]
	idle := ids[6:]
	k := newPeerKeeper(ps, self)
	addr := func(i int) ma.Multiaddr {
		return ma.StringCast(fmt.Sprintf("/ip4/10.%d.%d.%d/udp/4001/quic-v1", i>>16&255, i>>8&255, i&255))
	}
	for i, id := range ids {
		// What a disconnected peer leaves (identify: connected, then
		// lowered) and never loses in go-libp2p v0.51.0; plus the keys,
		// protocols and metadata identify records.
		ps.AddAddr(id, addr(i), peerstore.ConnectedAddrTTL)
		ps.UpdateAddrs(id, peerstore.ConnectedAddrTTL, peerstore.RecentlyConnectedAddrTTL)
		if err := ps.AddProtocols(id, "/skein/run/members-stream/1"); err != nil {
			t.Fatal(err)
		}
		if err := ps.Put(id, "AgentVersion", "skein"); err != nil {
			t.Fatal(err)
		}
	}
	k.pin(member, []ma.Multiaddr{addr(2)})
	k.pin(back, []ma.Multiaddr{addr(4)})
	connected := map[peer.ID]bool{conn: true}
	isConn := func(id peer.ID) bool { return connected[id] }
	isSeed := func(id peer.ID) bool { return id == seed }
	const after = time.Minute
	t0 := time.Now()
	sweep := func(at time.Duration) []peer.ID {
		t.Helper()
		gone := k.sweep(t0.Add(at), after, isConn, isSeed)
		if n := len(ps.Peers()); len(k.idle) > n {
			t.Fatalf("idle record holds %d peers, peerstore %d", len(k.idle), n)
		}
		return gone
	}
	// inStore reports, for each of ids, whether anything of it is left:
	// listed as a peer (PeersWithAddrs lists even expired addresses not yet
	// collected), protocols or metadata.
	inStore := func(ids []peer.ID) []bool {
		listed := make(map[peer.ID]bool)
		for _, id := range ps.Peers() {
			listed[id] = true
		}
		for _, id := range ps.PeersWithAddrs() {
			listed[id] = true
		}
		out := make([]bool, len(ids))
		for i, id := range ids {
			_, metaErr := ps.Get(id, "AgentVersion")
			protos, _ := ps.GetProtocols(id)
			out[i] = listed[id] || len(protos) > 0 || !errors.Is(metaErr, peerstore.ErrNotFound)
		}
		return out
	}
	checkGone := func(step string, want ...peer.ID) {
		t.Helper()
		for i, in := range inStore(want) {
			if in {
				t.Fatalf("%s: %s still in the peerstore", step, want[i])
			}
		}
	}
	checkKept := func(step string, want ...peer.ID) {
		t.Helper()
		for i, in := range inStore(want) {
			if !in {
				t.Fatalf("%s: %s was removed", step, want[i])
			}
		}
	}

	if g := sweep(0); len(g) != 0 {
		t.Fatalf("first sweep removed %d peers; it only records them", len(g))
	}
	if len(k.idle) != len(idle)+1 { // idle and flap
		t.Fatalf("idle record holds %d peers, want %d", len(k.idle), len(idle)+1)
	}
	// back leaves and rejoins within ForgetAfter; flap connects for a
	// while: both start over.
	k.unpin(back)
	connected[flap] = true
	if g := sweep(after / 2); len(g) != 0 {
		t.Fatalf("sweep before ForgetAfter removed %d peers", len(g))
	}
	k.pin(back, []ma.Multiaddr{addr(4)})
	connected[flap] = false
	if g := sweep(after); len(g) != len(idle) {
		t.Fatalf("sweep after ForgetAfter removed %d peers, want %d", len(g), len(idle))
	}
	checkGone("after ForgetAfter", idle...)
	checkKept("after ForgetAfter", self, seed, member, conn, back, flap)
	if !containsAddr(ps.Addrs(member), addr(2)) {
		t.Fatal("a member's pinned address was removed")
	}
	if g := sweep(after / 2 * 3); len(g) != 0 {
		t.Fatalf("flap removed %v before ForgetAfter since it disconnected", g)
	}
	if g := sweep(2 * after); len(g) != 1 || g[0] != flap {
		t.Fatalf("flap: removed %v, want only %s", g, flap)
	}

	// A member that leaves is forgotten one ForgetAfter after the next sweep.
	k.unpin(member)
	if g := sweep(3 * after); len(g) != 0 {
		t.Fatalf("a member that just left was removed: %v", g)
	}
	checkKept("member just left", member)
	if g := sweep(4 * after); len(g) != 1 || g[0] != member {
		t.Fatalf("departed member: removed %v, want %s", g, member)
	}
	checkGone("departed member", member)
	checkKept("end", self, seed, conn, back)
	if n := len(ps.Peers()); n != 4 {
		t.Fatalf("peerstore holds %d peers, want 4", n)
	}
}

// TestNodeForgetsFloodedHints drives a real node: addresses that remote
// peers name in memberlist packets (ping sources) enter the peerstore as
// hints; a node forgets all of them, and its address index with them, once
// they have been idle for ForgetAfter.
func TestNodeForgetsFloodedHints(t *testing.T) {
	cfg := DefaultNodeConfig("run")
	cfg.ListenAddrs = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.Timing = FastTiming()
	cfg.JoinAlone = true
	cfg.RejoinInterval = time.Hour // the test sweeps itself
	n, err := NewNode(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	ids := randPeers(t, 10*maxAddrIndex)
	for i, id := range ids {
		if _, err := n.tr.resolve(memberlist.Address{Name: id.String(), Addr: fmt.Sprintf("127.%d.%d.%d:9", i>>16&255, i>>8&255, i&255)}); err != nil {
			t.Fatal(err)
		}
	}
	ps := n.h.Peerstore()
	if got := len(ps.Peers()); got < len(ids) {
		t.Fatalf("peerstore holds %d peers after %d hints", got, len(ids))
	}
	t0 := time.Now()
	n.forgetIdle(t0)
	n.forgetIdle(t0.Add(cfg.ForgetAfter))
	if peers := ps.Peers(); len(peers) != 1 || peers[0] != n.ID() {
		t.Fatalf("peerstore holds %d peers after ForgetAfter, want only the node itself", len(peers))
	}
	n.tr.mu.Lock()
	size := n.tr.byAddr.size()
	n.tr.mu.Unlock()
	if size != 0 {
		t.Fatalf("address index holds %d forgotten addresses", size)
	}
	// A forgotten peer named again is a hint again.
	if _, err := n.tr.resolve(memberlist.Address{Name: ids[0].String(), Addr: "127.0.0.0:9"}); err != nil {
		t.Fatal(err)
	}
	if len(ps.Addrs(ids[0])) != 1 {
		t.Fatal("a forgotten peer's address was not added again")
	}
}
