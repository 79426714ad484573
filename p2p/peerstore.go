package p2p

import (
	"net"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
)

// The libp2p peerstore and membership.
//
// libp2p keeps a peer's addresses with a TTL and rewrites those TTLs itself:
// identify holds the addresses a peer advertises at ConnectedAddrTTL while
// connected, lowers them to RecentlyConnectedAddrTTL (15 min) on disconnect
// and deletes, on every identify message, the RecentlyConnected ones the peer
// did not advertise again. A member is reached through addresses memberlist
// told us (its QUIC address, its TCP port, relayed addresses through the
// seeds), so they must not depend on that: while a peer is a member they are
// pinned at PermanentAddrTTL, which identify never lowers (it rewrites only
// the exact TTLs it set, and never evicts a permanent address). A member
// whose connection dropped an hour ago can still be probed and dialed.
//
// When the member leaves or fails, its pinned addresses are lowered to
// RecentlyConnectedAddrTTL, like those of any peer recently seen.
//
// libp2p removes nothing else for good: its peerstore manager drops a
// disconnected peer's keys, protocols and metadata after a minute but never
// its addresses, and (go-libp2p v0.51.0) an address lowered from a connected
// or permanent TTL is left out of the address book's expiry heap, so it
// stays in memory, and the peer in Peerstore().Peers(), forever. So on every
// RejoinInterval tick the node removes (ClearAddrs and RemovePeer) every peer
// that has been neither a member nor connected for NodeConfig.ForgetAfter.
// Seeds are kept; peers of the peer book need nothing in the peerstore, since
// a rejoin dials them with the addresses the book stores.

// peerKeeper keeps a host's peerstore in step with membership: it pins
// members' addresses and forgets peers that are neither members nor
// connected.
type peerKeeper struct {
	ps   peerstore.Peerstore
	self peer.ID

	mu     sync.Mutex
	pinned map[peer.ID][]ma.Multiaddr // current members -> addresses held at PermanentAddrTTL
	// idle: peers of the peerstore, neither member nor connected at the last
	// sweep -> the first sweep that saw them so. Rebuilt from the peerstore
	// on every sweep, so it is as bounded as the peerstore.
	idle map[peer.ID]time.Time
}

func newPeerKeeper(ps peerstore.Peerstore, self peer.ID) *peerKeeper {
	return &peerKeeper{ps: ps, self: self, pinned: make(map[peer.ID][]ma.Multiaddr), idle: make(map[peer.ID]time.Time)}
}

// pin makes id a member whose addresses are addrs: they are held at
// PermanentAddrTTL, and addresses pinned before but not in addrs (the member
// moved) are lowered.
func (k *peerKeeper) pin(id peer.ID, addrs []ma.Multiaddr) {
	if id == k.self {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var moved []ma.Multiaddr
	for _, a := range k.pinned[id] {
		if !containsAddr(addrs, a) {
			moved = append(moved, a)
		}
	}
	k.lower(id, moved)
	k.ps.AddAddrs(id, addrs, peerstore.PermanentAddrTTL)
	k.pinned[id] = addrs
	delete(k.idle, id)
}

// unpin records that id is no longer a member and lowers its pinned addresses.
func (k *peerKeeper) unpin(id peer.ID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lower(id, k.pinned[id])
	delete(k.pinned, id)
}

// lower gives addrs of id RecentlyConnectedAddrTTL. It deletes and re-adds
// them: in go-libp2p v0.51.0's pstoremem, SetAddrs or UpdateAddrs from a
// permanent TTL to a finite one leaves the address out of the expiry heap, so
// its garbage collector would never drop it. Called with mu held.
func (k *peerKeeper) lower(id peer.ID, addrs []ma.Multiaddr) {
	if len(addrs) == 0 {
		return
	}
	k.ps.SetAddrs(id, addrs, 0)
	k.ps.AddAddrs(id, addrs, peerstore.RecentlyConnectedAddrTTL)
}

// sweep removes from the peerstore (addresses, keys, protocols, metadata)
// every peer that a sweep at least forgetAfter before now already found
// neither a member nor connected, and that is still neither, nor this node,
// nor kept. It returns the peers removed. Peers found idle for the first time
// are only recorded; a peer that is a member or connected again starts over.
func (k *peerKeeper) sweep(now time.Time, forgetAfter time.Duration, connected, keep func(peer.ID) bool) []peer.ID {
	k.mu.Lock()
	defer k.mu.Unlock()
	idle := make(map[peer.ID]time.Time)
	var gone []peer.ID
	for _, id := range k.ps.Peers() {
		if _, member := k.pinned[id]; member || id == k.self || keep(id) || connected(id) {
			continue
		}
		since, ok := k.idle[id]
		if !ok {
			since = now
		}
		if now.Sub(since) >= forgetAfter {
			k.ps.ClearAddrs(id)
			k.ps.RemovePeer(id)
			gone = append(gone, id)
			continue
		}
		idle[id] = since
	}
	k.idle = idle
	return gone
}

func containsAddr(l []ma.Multiaddr, a ma.Multiaddr) bool {
	for _, b := range l {
		if b.Equal(a) {
			return true
		}
	}
	return false
}

// memberAddrs are the addresses membership gives for m: its memberlist
// (QUIC) address, its TCP fallback (same IP, Meta.TCPPort) and, for members
// behind NAT, a relayed address through each seed.
func (n *Node) memberAddrs(m Member) []ma.Multiaddr {
	var out []ma.Multiaddr
	if h, _, err := net.SplitHostPort(m.Addr); err == nil {
		if ip := net.ParseIP(h); ip != nil && !ip.IsUnspecified() {
			if a, err := quicAddr(m.Addr); err == nil {
				out = append(out, a)
			}
			if m.Meta.TCPPort != 0 {
				if a, err := manet.FromNetAddr(&net.TCPAddr{IP: ip, Port: int(m.Meta.TCPPort)}); err == nil {
					out = append(out, a)
				}
			}
		}
	}
	for _, s := range n.seeds {
		if s.ID == m.ID {
			continue
		}
		c, err := ma.NewMultiaddr("/p2p/" + s.ID.String() + "/p2p-circuit")
		if err != nil {
			continue
		}
		for _, sa := range s.Addrs {
			out = append(out, sa.Encapsulate(c))
		}
	}
	return out
}

// isSeed reports whether id is one of this node's bootstrap seeds.
func (n *Node) isSeed(id peer.ID) bool { return containsPeer(n.seeds, id) }

// forgetIdle removes from the peerstore the peers that have been neither
// members nor connected for NodeConfig.ForgetAfter (seeds excepted), and
// their addresses from memberlist's address index.
func (n *Node) forgetIdle(now time.Time) {
	connected := func(id peer.ID) bool {
		c := n.h.Network().Connectedness(id)
		return c == network.Connected || c == network.Limited
	}
	gone := n.keeper.sweep(now, n.cfg.ForgetAfter, connected, n.isSeed)
	if len(gone) > 0 {
		n.tr.forget(gone...)
		n.log.Debug("peers forgotten", "count", len(gone))
	}
}
