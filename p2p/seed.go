package p2p

import (
	"context"
	"crypto/ed25519"
	"log/slog"
	"net"
	"time"

	ma "github.com/multiformats/go-multiaddr"
)

// SeedConfig configures a bootstrap seed: a long-lived node with a stable
// identity that is the membership entry point and a relay for nodes behind NAT.
type SeedConfig struct {
	RunID       string
	DataDir     string   // required: the identity must survive restarts
	ListenAddrs []string // a fixed port in production, e.g. /ip4/0.0.0.0/udp/4001/quic-v1 and /ip4/0.0.0.0/tcp/4001
	// AdvertiseAddr ("ip:port") is the seed's public QUIC address when it
	// differs from the listen address.
	AdvertiseAddr string
	Version       string
	Timing        Timing
	Limits        Limits
	ListenUDP     func(network string, laddr *net.UDPAddr) (net.PacketConn, error)
	Logger        *slog.Logger
	// PeerBookSize bounds the seed's peer book (see NodeConfig.PeerBookSize);
	// 0 = MaxPeerBookSize.
	PeerBookSize int
	// Admission is the run's admission policy (the zero value admits
	// anyone). A closed run's seed needs a Token (role bootstrap) or the
	// RunKey, with which it issues and renews its own.
	Admission Admission
	Token     []byte
	RunKey    ed25519.PrivateKey
}

// DefaultSeedConfig returns WAN timing, default limits and QUIC+TCP on port 4001.
func DefaultSeedConfig(runID, dataDir string) SeedConfig {
	return SeedConfig{
		RunID: runID, DataDir: dataDir,
		ListenAddrs: []string{"/ip4/0.0.0.0/udp/4001/quic-v1", "/ip4/0.0.0.0/tcp/4001"},
		Timing:      WANTiming(), Limits: DefaultLimits(),
	}
}

// Seed is a running bootstrap seed. It is a Node (role bootstrap) with the
// relay service on and public reachability forced.
type Seed struct {
	*Node
}

// NewSeed starts a seed. On restart it rejoins the members recorded in its
// peer book, so a run survives the seed going down.
func NewSeed(ctx context.Context, cfg SeedConfig) (*Seed, error) {
	nc := DefaultNodeConfig(cfg.RunID)
	nc.DataDir = cfg.DataDir
	if len(cfg.ListenAddrs) > 0 {
		nc.ListenAddrs = cfg.ListenAddrs
	}
	nc.AdvertiseAddr = cfg.AdvertiseAddr
	nc.Meta = Meta{Role: RoleBootstrap, Stage: -1, Version: cfg.Version}
	if cfg.Timing != (Timing{}) {
		nc.Timing = cfg.Timing
	}
	if cfg.Limits != (Limits{}) {
		nc.Limits = cfg.Limits
	}
	nc.Reachability = ReachabilityPublic
	nc.RelayService = true
	nc.HolePunching = false
	nc.JoinAlone = true
	nc.JoinTimeout = 5 * time.Second
	nc.RejoinInterval = time.Minute
	if cfg.Timing.ProbeInterval > 0 && cfg.Timing.ProbeInterval < time.Second {
		nc.RejoinInterval = time.Second // test timing
	}
	nc.ListenUDP = cfg.ListenUDP
	nc.Logger = cfg.Logger
	if cfg.PeerBookSize != 0 {
		nc.PeerBookSize = cfg.PeerBookSize
	}
	adm := cfg.Admission
	nc.Admission, nc.Token, nc.RunKey = &adm, cfg.Token, cfg.RunKey
	n, err := NewNode(ctx, nc)
	if err != nil {
		return nil, err
	}
	return &Seed{Node: n}, nil
}

// FullAddr is the address to print for volunteers: the first full multiaddr,
// preferring a non-loopback QUIC one.
func (s *Seed) FullAddr() ma.Multiaddr {
	addrs := s.Addrs()
	var best ma.Multiaddr
	for _, a := range addrs {
		_, quicErr := a.ValueForProtocol(ma.P_QUIC_V1)
		ip, _ := a.ValueForProtocol(ma.P_IP4)
		loop := ip == "127.0.0.1"
		if quicErr == nil && !loop {
			return a
		}
		if best == nil || quicErr == nil {
			best = a
		}
	}
	return best
}
