package p2p

import (
	"fmt"
	"net"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/p2p/host/autorelay"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	relayv2 "github.com/libp2p/go-libp2p/p2p/protocol/circuitv2/relay"
	libp2pquic "github.com/libp2p/go-libp2p/p2p/transport/quic"
	"github.com/libp2p/go-libp2p/p2p/transport/quicreuse"
	"github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
)

func listenOpt(addrs []string) libp2p.Option {
	if len(addrs) == 0 {
		return libp2p.NoListenAddrs
	}
	return libp2p.ListenAddrStrings(addrs...)
}

// Reachability overrides what AutoNAT would conclude about a node.
type Reachability int

// Reachability values.
const (
	ReachabilityAuto    Reachability = iota // AutoNAT decides (slow: tens of seconds)
	ReachabilityPublic                      // a seed with a public address
	ReachabilityPrivate                     // behind NAT: use relays and hole punching at once
)

// Limits are the explicit resource limits of a host.
type Limits struct {
	MaxMemory int64 // bytes the resource manager lets libp2p reserve (scaled limits)
	MaxFD     int   // file descriptors for connections
	ConnLow   int   // connection manager low watermark
	ConnHigh  int   // connection manager high watermark
	ConnGrace time.Duration

	// Relay limits a seed applies to each relayed connection. Relayed
	// connections carry membership and small control traffic; bulk data goes
	// direct.
	RelayDuration time.Duration
	RelayData     int64
	RelayCircuits int // concurrent relayed connections per relay
}

// DefaultLimits returns 1 GiB, 4096 fds, 192..256 connections and relayed
// connections of 10 min / 4 MiB each direction.
func DefaultLimits() Limits {
	return Limits{
		MaxMemory: 1 << 30, MaxFD: 4096, ConnLow: 192, ConnHigh: 256, ConnGrace: 30 * time.Second,
		RelayDuration: 10 * time.Minute, RelayData: 4 << 20, RelayCircuits: 64,
	}
}

// Validate names the offending value.
func (l Limits) Validate() error {
	switch {
	case l.MaxMemory < 64<<20:
		return fmt.Errorf("p2p: Limits.MaxMemory %d below 64 MiB", l.MaxMemory)
	case l.MaxFD < 16:
		return fmt.Errorf("p2p: Limits.MaxFD %d below 16", l.MaxFD)
	case l.ConnLow < 1 || l.ConnHigh < l.ConnLow:
		return fmt.Errorf("p2p: Limits.ConnLow %d / ConnHigh %d: want 1 <= low <= high", l.ConnLow, l.ConnHigh)
	case l.RelayDuration <= 0 || l.RelayData <= 0 || l.RelayCircuits <= 0:
		return fmt.Errorf("p2p: relay limits duration=%v data=%d circuits=%d must be positive", l.RelayDuration, l.RelayData, l.RelayCircuits)
	}
	return nil
}

// hostParams is what newHost needs; NodeConfig fills it.
type hostParams struct {
	key          crypto.PrivKey
	listen       []string
	limits       Limits
	reachability Reachability
	relayService bool
	relays       []peer.AddrInfo // static relays for the relay client
	holePunching bool
	listenUDP    func(network string, laddr *net.UDPAddr) (net.PacketConn, error)
	bw           metrics.Reporter
	addrs        func() []ma.Multiaddr // advertised addresses instead of the listen addresses (lanes)
	peerstore    peerstore.Peerstore   // nil: libp2p's default; the host closes it
	relayACL     relayv2.ACLFilter     // whom the relay service serves; nil: anyone
}

func newHost(p hostParams) (host.Host, error) {
	scaled := rcmgr.DefaultLimits.Scale(p.limits.MaxMemory, p.limits.MaxFD)
	partial := scaled.ToPartialLimitConfig()
	// libp2p allows 8 connections per peer each way; lanes (lanes.go) add
	// up to MaxLanes connections between two nodes.
	perPeer := rcmgr.LimitVal(MaxLanes + 8)
	partial.PeerDefault.ConnsInbound, partial.PeerDefault.ConnsOutbound, partial.PeerDefault.Conns = perPeer, perPeer, 2*perPeer
	limiter := rcmgr.NewFixedLimiter(partial.Build(scaled))
	rm, err := rcmgr.NewResourceManager(limiter)
	if err != nil {
		closePeerstore(p.peerstore)
		return nil, fmt.Errorf("p2p: resource manager: %w", err)
	}
	cm, err := connmgr.NewConnManager(p.limits.ConnLow, p.limits.ConnHigh, connmgr.WithGracePeriod(p.limits.ConnGrace))
	if err != nil {
		rm.Close()
		closePeerstore(p.peerstore)
		return nil, fmt.Errorf("p2p: connection manager: %w", err)
	}
	opts := []libp2p.Option{
		libp2p.Identity(p.key),
		listenOpt(p.listen),
		libp2p.Transport(libp2pquic.NewTransport),
		libp2p.Transport(tcp.NewTCPTransport),
		libp2p.ResourceManager(rm),
		libp2p.ConnectionManager(cm),
		libp2p.BandwidthReporter(p.bw),
		libp2p.DisableMetrics(),
		libp2p.EnableRelay(),
		libp2p.EnableNATService(),
		libp2p.UserAgent("skein"),
	}
	if p.peerstore != nil {
		opts = append(opts, libp2p.Peerstore(p.peerstore)) // libp2p.New closes it if it fails
	}
	if p.addrs != nil {
		opts = append(opts, libp2p.AddrsFactory(func([]ma.Multiaddr) []ma.Multiaddr { return p.addrs() }))
	}
	if p.listenUDP != nil {
		opts = append(opts, libp2p.QUICReuse(quicreuse.NewConnManager, quicreuse.OverrideListenUDP(p.listenUDP)))
	}
	if p.relayService {
		res := relayv2.DefaultResources()
		res.Limit = &relayv2.RelayLimit{Duration: p.limits.RelayDuration, Data: p.limits.RelayData}
		res.MaxCircuits = p.limits.RelayCircuits
		res.MaxReservations = 4 * p.limits.ConnHigh
		ropts := []relayv2.Option{relayv2.WithResources(res)}
		if p.relayACL != nil {
			ropts = append(ropts, relayv2.WithACL(p.relayACL))
		}
		opts = append(opts, libp2p.EnableRelayService(ropts...))
	}
	if len(p.relays) > 0 {
		opts = append(opts, libp2p.EnableAutoRelayWithStaticRelays(p.relays,
			autorelay.WithBootDelay(0), autorelay.WithMinCandidates(1)))
	}
	if p.holePunching {
		// Nodes (not seeds or lanes). The AutoNAT (v1) client is on by
		// default. AutoNAT v2 is left off: in go-libp2p v0.51.0 its Close can
		// hang forever on a loaded machine (seen under -race).
		opts = append(opts, libp2p.EnableHolePunching())
	}
	switch p.reachability {
	case ReachabilityPublic:
		opts = append(opts, libp2p.ForceReachabilityPublic())
	case ReachabilityPrivate:
		opts = append(opts, libp2p.ForceReachabilityPrivate())
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		rm.Close()
		return nil, fmt.Errorf("p2p: libp2p host: %w", err)
	}
	return h, nil
}

func closePeerstore(ps peerstore.Peerstore) {
	if ps != nil {
		ps.Close()
	}
}
