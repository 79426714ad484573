package p2p

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	p2ptestutil "github.com/libp2p/go-libp2p/core/test"
	ma "github.com/multiformats/go-multiaddr"
)

// Tables fed by remote peers stay bounded on a long-running node: each test
// feeds ten times the bound of distinct peers and checks what is kept.

func randPeers(t *testing.T, n int) []peer.ID {
	t.Helper()
	ids := make([]peer.ID, n)
	seen := make(map[peer.ID]bool, n)
	for i := range ids {
		ids[i] = p2ptestutil.RandPeerIDFatal(t)
		if seen[ids[i]] {
			t.Fatalf("duplicate random peer ID %s", ids[i])
		}
		seen[ids[i]] = true
	}
	return ids
}

func TestLeftAtBounded(t *testing.T) {
	ev := newEvents("run", "", nil)
	ids := randPeers(t, 10*maxLeftAt)
	t0 := time.Now()
	// Ten times the bound, all within one leave window: the newest are kept.
	step := leaveWindow / time.Duration(2*len(ids))
	for i, id := range ids {
		ev.markLeft(id, t0.Add(time.Duration(i)*step))
		if n := len(ev.leftAt); n > maxLeftAt {
			t.Fatalf("after %d goodbyes leftAt holds %d, bound %d", i+1, n, maxLeftAt)
		}
	}
	if n := len(ev.leftAt); n != maxLeftAt {
		t.Fatalf("leftAt holds %d, want %d", n, maxLeftAt)
	}
	for _, id := range ids[len(ids)-maxLeftAt:] {
		if _, ok := ev.leftAt[id]; !ok {
			t.Fatalf("a newest goodbye (%s) was dropped", id)
		}
	}

	// A repeated goodbye refreshes its entry without dropping another.
	last := ids[len(ids)-1]
	ev.markLeft(last, t0.Add(leaveWindow/2))
	if n := len(ev.leftAt); n != maxLeftAt {
		t.Fatalf("repeated goodbye: leftAt holds %d, want %d", n, maxLeftAt)
	}

	// Expiry: goodbyes older than the window go, younger ones stay.
	tEnd := t0.Add(time.Duration(len(ids)-1) * step)
	ev.expireLeft(tEnd.Add(leaveWindow - time.Duration(maxLeftAt/2)*step))
	if n := len(ev.leftAt); n == 0 || n >= maxLeftAt {
		t.Fatalf("partial expiry left %d of %d", n, maxLeftAt)
	}
	for id, at := range ev.leftAt {
		if tEnd.Add(leaveWindow-time.Duration(maxLeftAt/2)*step).Sub(at) >= leaveWindow {
			t.Fatalf("goodbye of %s at %v outlived the window", id, at)
		}
	}
	ev.expireLeft(t0.Add(2 * leaveWindow))
	if n := len(ev.leftAt); n != 0 {
		t.Fatalf("after the window leftAt holds %d, want 0", n)
	}

	// When full of unexpired goodbyes, the oldest is dropped for a new one.
	ev2 := newEvents("run", "", nil)
	now := time.Now()
	for i, id := range ids[:maxLeftAt] {
		ev2.markLeft(id, now.Add(time.Duration(i)*time.Millisecond))
	}
	ev2.markLeft(ids[maxLeftAt], now.Add(time.Second))
	if _, ok := ev2.leftAt[ids[0]]; ok {
		t.Fatal("the oldest goodbye was kept when the table was full")
	}
	if _, ok := ev2.leftAt[ids[maxLeftAt]]; !ok || len(ev2.leftAt) != maxLeftAt {
		t.Fatalf("new goodbye kept %v, size %d", ok, len(ev2.leftAt))
	}
}

// TestLeaveAfterBounds: bounding leftAt keeps leave and fail apart.
func TestLeaveAfterBounds(t *testing.T) {
	cases := []struct {
		name string
		bye  time.Duration // goodbye this long before NotifyLeave; < 0 = none
		want EventKind
	}{
		{"fresh goodbye", 0, EventLeave},
		{"goodbye inside the window", leaveWindow / 2, EventLeave},
		{"stale goodbye", 2 * leaveWindow, EventFail},
		{"no goodbye", -1, EventFail},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev := newEvents("run", "", nil)
			sub := ev.subscribe()
			defer sub.Close()
			id, meta := signedMember(t, Meta{RunID: "run"})
			node := &memberlist.Node{Name: id.String(), Meta: meta}
			ev.NotifyJoin(node)
			if tc.bye >= 0 {
				ev.markLeft(id, time.Now().Add(-tc.bye))
			}
			ev.expireLeft(time.Now())
			ev.NotifyLeave(node)
			if len(ev.leftAt) != 0 {
				t.Errorf("leftAt holds %d after NotifyLeave", len(ev.leftAt))
			}
			for _, want := range []EventKind{EventJoin, tc.want} {
				select {
				case e := <-sub.C:
					if e.Kind != want || e.Member.ID != id {
						t.Fatalf("event %v of %s, want %v of %s", e.Kind, e.Member.ID, want, id)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("no %v event", want)
				}
			}
		})
	}
}

func TestAddrIndexBounded(t *testing.T) {
	for _, max := range []int{1, 7, maxAddrIndex} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			x := newAddrIndex(max)
			ids := randPeers(t, 10*max)
			addr := func(i int) string { return fmt.Sprintf("10.%d.%d.%d:4001", i>>16&255, i>>8&255, i&255) }
			for i, id := range ids {
				if !x.put(addr(i), id) {
					t.Fatalf("new address %d not reported as a change", i)
				}
				if x.size() > max || x.lru.Len() != x.size() {
					t.Fatalf("after %d puts: %d entries, list %d, bound %d", i+1, x.size(), x.lru.Len(), max)
				}
			}
			for i := range ids {
				id, ok := x.get(addr(i))
				if newest := i >= len(ids)-max; ok != newest || ok && id != ids[i] {
					t.Fatalf("address %d: found %v (%s), want found %v (%s)", i, ok, id, newest, ids[i])
				}
			}
			if max < 2 {
				return
			}
			// Least recently used goes first: touch the oldest, add one.
			oldest := len(ids) - max
			x.get(addr(oldest))
			x.put("192.0.2.1:1", ids[0])
			if _, ok := x.get(addr(oldest)); !ok {
				t.Fatal("a recently used entry was evicted")
			}
			if _, ok := x.get(addr(oldest + 1)); ok {
				t.Fatal("the least recently used entry was kept")
			}
			// The same mapping again is not a change; a new owner is.
			if x.put("192.0.2.1:1", ids[0]) || !x.put("192.0.2.1:1", ids[1]) {
				t.Fatal("put misreports changes")
			}
			// forget drops every address of a peer and nothing else.
			x.put("192.0.2.2:2", ids[1])
			n := x.size()
			x.forget(ids[1])
			if x.size() != n-2 || x.lru.Len() != x.size() {
				t.Fatalf("forget left %d entries (list %d), want %d", x.size(), x.lru.Len(), n-2)
			}
			for _, a := range []string{"192.0.2.1:1", "192.0.2.2:2"} {
				if _, ok := x.get(a); ok {
					t.Fatalf("forgotten address %s still resolves", a)
				}
			}
		})
	}
}

// TestTransportAddrsBounded drives a real node's transport: remote-chosen
// (name, address) pairs, as a ping's source fields are, stay within the
// bound, and a member's address is dropped when it leaves or fails.
func TestTransportAddrsBounded(t *testing.T) {
	cfg := DefaultNodeConfig("run")
	cfg.ListenAddrs = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.Timing = FastTiming()
	cfg.JoinAlone = true
	n, err := NewNode(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	tr := n.tr
	ids := randPeers(t, 10*maxAddrIndex)
	addr := func(i int) string { return fmt.Sprintf("127.%d.%d.%d:9", i>>16&255, i>>8&255, i&255) }
	for i, id := range ids {
		if _, err := tr.resolve(memberlist.Address{Name: id.String(), Addr: addr(i)}); err != nil {
			t.Fatal(err)
		}
	}
	tr.mu.Lock()
	size := tr.byAddr.size()
	tr.mu.Unlock()
	if size > maxAddrIndex {
		t.Fatalf("address index holds %d, bound %d", size, maxAddrIndex)
	}
	for _, i := range []int{len(ids) - 1, len(ids) - maxAddrIndex} {
		if id, err := tr.resolve(memberlist.Address{Addr: addr(i)}); err != nil || id != ids[i] {
			t.Fatalf("recent address %d resolves to %s (%v), want %s", i, id, err, ids[i])
		}
	}
	if _, err := tr.resolve(memberlist.Address{Addr: addr(0)}); err == nil {
		t.Fatal("the oldest address still resolves")
	}

	for _, kind := range []EventKind{EventLeave, EventFail} {
		node, _ := memberAt(t, Meta{RunID: "run"}, "127.0.0.2:9")
		id, _ := peer.Decode(node.Name)
		n.ev.NotifyJoin(node)
		if got, err := tr.resolve(memberlist.Address{Addr: "127.0.0.2:9"}); err != nil || got != id {
			t.Fatalf("joined member's address resolves to %s (%v), want %s", got, err, id)
		}
		if kind == EventLeave {
			n.ev.markLeft(id, time.Now())
		}
		n.ev.NotifyLeave(node)
		awaitUnlisted(t, n.ev, id) // a failure: once the direct check has failed
		if _, err := tr.resolve(memberlist.Address{Addr: "127.0.0.2:9"}); err == nil {
			t.Fatalf("address of a member gone with %v still resolves", kind)
		}
	}
}

func TestPeerBookBounded(t *testing.T) {
	for _, max := range []int{1, 16, MaxPeerBookSize} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			dir := t.TempDir()
			pb, err := loadPeerBook(dir, max)
			if err != nil {
				t.Fatal(err)
			}
			ids := randPeers(t, 10*max)
			t0 := time.Unix(1_700_000_000, 0)
			seen := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
			addr := ma.StringCast("/ip4/127.0.0.1/udp/4001/quic-v1")
			// Out of order, as a restart's book and new joins mix.
			order := rand.New(rand.NewPCG(1, 2)).Perm(len(ids))
			for k, i := range order {
				pb.put(PeerRecord{ID: ids[i], Addrs: []ma.Multiaddr{addr}, LastSeen: seen(i)})
				if len(pb.recs) > max {
					t.Fatalf("after %d puts the book holds %d, bound %d", k+1, len(pb.recs), max)
				}
			}
			checkNewest := func(t *testing.T, recs []PeerRecord, keep int) {
				t.Helper()
				if len(recs) != keep {
					t.Fatalf("book holds %d, want %d", len(recs), keep)
				}
				for j, r := range recs {
					i := len(ids) - 1 - j
					if r.ID != ids[i] || !r.LastSeen.Equal(seen(i)) {
						t.Fatalf("record %d is %s seen %v, want %s seen %v", j, r.ID, r.LastSeen, ids[i], seen(i))
					}
				}
			}
			checkNewest(t, pb.list(), max)
			// Seeing a kept peer again updates it in place.
			top := ids[len(ids)-1]
			pb.put(PeerRecord{ID: top, LastSeen: seen(len(ids) + 1)})
			if len(pb.recs) != max || !pb.recs[top].LastSeen.Equal(seen(len(ids)+1)) {
				t.Fatalf("refresh: %d records, %v", len(pb.recs), pb.recs[top].LastSeen)
			}
			pb.put(PeerRecord{ID: top, LastSeen: seen(len(ids) - 1)})

			// The bound holds across a save and a load with a smaller bound.
			if err := pb.save(); err != nil {
				t.Fatal(err)
			}
			small := max/2 + 1
			pb2, err := loadPeerBook(dir, small)
			if err != nil {
				t.Fatal(err)
			}
			checkNewest(t, pb2.list(), small)
		})
	}
}

func TestPeerBookSizeValidated(t *testing.T) {
	for _, tc := range []struct {
		size int
		ok   bool
	}{{-1, false}, {0, false}, {1, true}, {MaxPeerBookSize, true}, {MaxPeerBookSize + 1, false}} {
		c := DefaultNodeConfig("run")
		c.PeerBookSize = tc.size
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("PeerBookSize %d: err %v, want ok %v", tc.size, err, tc.ok)
		}
	}
	if c := DefaultNodeConfig("run"); c.PeerBookSize != MaxPeerBookSize {
		t.Errorf("default PeerBookSize %d, want %d", c.PeerBookSize, MaxPeerBookSize)
	}
}

func TestTrafficPairsBounded(t *testing.T) {
	const max = 64
	a := newAccounting(max)
	ids := randPeers(t, 10*max)
	protos := []protocol.ID{"/skein/run/bulk/1", "/ipfs/id/1.0.0"}
	var in, out int64
	for i, id := range ids {
		for j, p := range protos {
			a.LogRecvMessageStream(int64(i+j+1), p, id)
			a.LogSentMessageStream(int64(2*i+j+1), p, id)
			in += int64(i + j + 1)
			out += int64(2*i + j + 1)
		}
		if len(a.pairs) > max {
			t.Fatalf("after %d peers %d pairs, bound %d", i+1, len(a.pairs), max)
		}
	}
	check := func(t *testing.T, wantPairs int) Traffic {
		t.Helper()
		tr := a.snapshot()
		if tr.Total.In != in || tr.Total.Out != out {
			t.Fatalf("total %d/%d, want %d/%d", tr.Total.In, tr.Total.Out, in, out)
		}
		var pin, pout int64
		for _, b := range tr.ByProtocol {
			pin, pout = pin+b.In, pout+b.Out
		}
		if pin != in || pout != out {
			t.Fatalf("per-protocol sums %d/%d, want %d/%d", pin, pout, in, out)
		}
		if len(tr.ByPeerProtocol) != wantPairs || len(a.pairs) != wantPairs {
			t.Fatalf("%d pairs (snapshot %d), want %d", len(a.pairs), len(tr.ByPeerProtocol), wantPairs)
		}
		for p := range tr.ByPeer {
			found := false
			for k := range tr.ByPeerProtocol {
				found = found || k.Peer == p
			}
			if !found {
				t.Fatalf("ByPeer lists %s without a pair", p)
			}
		}
		return tr
	}
	// Full: the first pairs are kept (live peers are never evicted by a
	// flood), the rest are counted per protocol only.
	tr := check(t, max)
	if _, ok := tr.ByPeer[ids[0]]; !ok {
		t.Fatal("the first peer lost its counters")
	}
	if _, ok := tr.ByPeer[ids[len(ids)-1]]; ok {
		t.Fatal("a peer over the bound has its own counters")
	}

	// trim folds pairs idle for a whole interval whose peer is gone.
	connected := func(p peer.ID) bool { return p == ids[1] }
	a.trim(connected) // marks: every pair changed since creation
	check(t, max)
	a.LogRecvMessageStream(5, protos[0], ids[2]) // ids[2] is active
	in += 5
	rates := a.rates.Load()
	a.trim(connected)
	check(t, 3) // ids[1] (connected, two protocols) and ids[2]'s active pair
	if a.rates.Load() != rates {
		t.Fatal("rates replaced before max pairs were trimmed")
	}
	// Room again for new peers.
	fresh := p2ptestutil.RandPeerIDFatal(t)
	a.LogSentMessageStream(7, protos[1], fresh)
	out += 7
	if tr := check(t, 4); tr.ByPeer[fresh].Out != 7 {
		t.Fatalf("new peer counted %d, want 7", tr.ByPeer[fresh].Out)
	}
	// After max pairs were trimmed, libp2p's per-peer rate meters are
	// replaced too.
	for range 3 {
		a.trim(func(peer.ID) bool { return false })
	}
	check(t, 0)
	if a.rates.Load() == rates {
		t.Fatal("rates not replaced after max pairs were trimmed")
	}
}
