package p2p

import (
	"context"
	"errors"
	"fmt"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/protocol"
	ma "github.com/multiformats/go-multiaddr"
)

// Lanes: libp2p keeps one connection per peer, and one QUIC connection is one
// congestion controller and one event loop. On a lossy long fat pipe a single
// loss-based connection fills only a fraction of the link, and on fast links
// one connection is bound to about one core. A lane is an extra dial-only
// libp2p host with this node's identity: its connection to a peer is a second
// (third, ...) connection between the same two peer IDs, which libp2p accepts.
// Lanes advertise the main host's addresses and serve the same protocol
// handlers, so whichever connection a peer picks for its own streams works.
// Fetch uses lanes when FetchOptions.Conns > 1.

// MaxLanes bounds the extra connections per node.
const MaxLanes = 32

// setHandler registers a protocol handler on the host and on every lane.
// Every handler but the admission handshake's passes the admission gate
// first (admit.go): the one place where a run's streams are accepted.
func (n *Node) setHandler(pid protocol.ID, h network.StreamHandler) {
	if pid != n.admID {
		h = n.gate(pid, h)
	}
	inner := h
	h = func(s network.Stream) { inner(n.limit(s)) } // the bandwidth caps (ratelimit.go)
	n.handlersMu.Lock()
	defer n.handlersMu.Unlock()
	n.handlers[pid] = h
	n.h.SetStreamHandler(pid, h)
	for _, l := range n.lanes {
		l.SetStreamHandler(pid, h)
	}
}

func (n *Node) removeHandler(pid protocol.ID) {
	n.handlersMu.Lock()
	defer n.handlersMu.Unlock()
	delete(n.handlers, pid)
	n.h.RemoveStreamHandler(pid)
	for _, l := range n.lanes {
		l.RemoveStreamHandler(pid)
	}
}

// laneHosts returns k lanes, creating missing ones.
func (n *Node) laneHosts(k int) ([]host.Host, error) {
	if k > MaxLanes {
		return nil, fmt.Errorf("p2p: %d lanes, limit %d", k, MaxLanes)
	}
	n.handlersMu.Lock()
	defer n.handlersMu.Unlock()
	if n.ctx.Err() != nil {
		return nil, ErrClosed
	}
	for len(n.lanes) < k {
		l, err := newHost(hostParams{key: n.key, limits: n.cfg.Limits, reachability: n.cfg.Reachability,
			listenUDP: n.cfg.ListenUDP, bw: n.bw, addrs: n.h.Addrs})
		if err != nil {
			return nil, fmt.Errorf("p2p: lane: %w", err)
		}
		for pid, h := range n.handlers {
			l.SetStreamHandler(pid, h)
		}
		n.lanes = append(n.lanes, l)
	}
	return n.lanes[:k], nil
}

func (n *Node) closeLanes() {
	n.handlersMu.Lock()
	lanes := n.lanes
	n.lanes = nil
	n.handlersMu.Unlock()
	for _, l := range lanes {
		l.Close()
	}
}

// openOn opens a framed stream to p on host h (the main host or a lane),
// teaching a lane the peer's direct addresses first.
func (n *Node) openOn(ctx context.Context, h host.Host, p peer.ID, proto Protocol, cfg FrameConfig) (*Stream, error) {
	if h == n.h {
		return n.Open(ctx, p, proto, cfg)
	}
	var direct []ma.Multiaddr
	addrs := n.h.Peerstore().Addrs(p)
	for _, c := range n.h.Network().ConnsToPeer(p) {
		addrs = append(addrs, c.RemoteMultiaddr())
	}
	for _, a := range addrs {
		if _, err := a.ValueForProtocol(ma.P_CIRCUIT); err != nil {
			direct = append(direct, a)
		}
	}
	if len(direct) == 0 {
		return nil, errors.New("p2p: lane: no direct address for peer")
	}
	h.Peerstore().AddAddrs(p, direct, peerstore.TempAddrTTL)
	raw, err := h.NewStream(ctx, p, proto.ID(n.cfg.RunID))
	if err != nil {
		return nil, fmt.Errorf("p2p: lane open %s to %s: %w", proto, p, err)
	}
	s := n.limit(raw)
	return &Stream{FrameStream: NewFrameStream(s, cfg), s: s}, nil
}
