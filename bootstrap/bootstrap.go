// Package bootstrap runs a training run's entry point: the membership seed
// and relay that volunteers join through, the keeper of the run's manifest,
// and the collector of the volunteers' telemetry behind the public status
// page and its JSON/SSE API (bootstrap/status) and Prometheus metrics.
//
// It is never on the training critical path: an outer round completes
// without it, and volunteers join through any member while it is down. It
// must not train, average or touch tensors; cmd/skein only parses flags and
// calls Run.
package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"

	ma "github.com/multiformats/go-multiaddr"

	"github.com/skein-ml/skein/p2p"
)

// ErrConfig is returned (wrapped) for invalid settings.
var ErrConfig = errors.New("bootstrap: invalid config")

// Config configures Run.
type Config struct {
	RunID   string
	DataDir string // identity key and known peers; required, kept across restarts
	// Listen multiaddrs; default QUIC and TCP on port 4001, all IPv4 interfaces.
	Listen []string
	// Advertise is the public ip:port of the QUIC listener when it differs
	// from the listen address (behind a port forward).
	Advertise string
	Timing    p2p.Timing
	Version   string
	Logger    *slog.Logger
	// Out receives what the operator must see: the addresses to give to
	// volunteers and warnings about them. nil discards.
	Out io.Writer
	// Ready, if set, is called once the server listens.
	Ready func(Info)
}

// Info describes a running bootstrap.
type Info struct {
	PeerID string
	// Addrs are the full multiaddrs (with /p2p/<id>) volunteers can join
	// through, the best first.
	Addrs []string
}

// DefaultConfig returns WAN timing and the default listen addresses.
func DefaultConfig(runID, dataDir string) Config {
	return Config{RunID: runID, DataDir: dataDir, Timing: p2p.WANTiming()}
}

// Validate names the first invalid field.
func (c Config) Validate() error {
	if err := p2p.ValidateRunID(c.RunID); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if c.DataDir == "" {
		return fmt.Errorf("%w: a data directory is required (the identity must survive restarts)", ErrConfig)
	}
	if c.Advertise != "" {
		if _, _, err := net.SplitHostPort(c.Advertise); err != nil {
			return fmt.Errorf("%w: advertise address %q: %v", ErrConfig, c.Advertise, err)
		}
	}
	return nil
}

// Run serves the run until ctx ends, then leaves the membership gracefully.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	sc := p2p.DefaultSeedConfig(cfg.RunID, cfg.DataDir)
	if len(cfg.Listen) > 0 {
		sc.ListenAddrs = cfg.Listen
	}
	sc.AdvertiseAddr, sc.Version, sc.Logger = cfg.Advertise, cfg.Version, log
	if cfg.Timing != (p2p.Timing{}) {
		sc.Timing = cfg.Timing
	}
	seed, err := p2p.NewSeed(ctx, sc)
	if err != nil {
		return err
	}
	defer seed.Close()
	info := Info{PeerID: seed.ID().String()}
	best := seed.FullAddr()
	if best != nil {
		info.Addrs = append(info.Addrs, best.String())
	}
	for _, a := range seed.Addrs() {
		if best == nil || !a.Equal(best) {
			info.Addrs = append(info.Addrs, a.String())
		}
	}
	printAddrs(out, cfg, info)
	if cfg.Ready != nil {
		cfg.Ready(info)
	}

	sub := seed.Subscribe()
	defer sub.Close()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "skein bootstrap: leaving")
			return nil
		case ev, ok := <-sub.C:
			if !ok {
				return nil
			}
			log.Debug("membership", "event", ev.Kind, "peer", ev.Member.ID, "role", ev.Member.Meta.Role,
				"members", seed.NumMembers())
		}
	}
}

// printAddrs tells the operator every address volunteers can use, and warns
// when none of them is reachable from the internet.
func printAddrs(w io.Writer, cfg Config, info Info) {
	fmt.Fprintf(w, "skein bootstrap: run %q, peer %s, listening on:\n", cfg.RunID, info.PeerID)
	public := false
	for _, a := range info.Addrs {
		fmt.Fprintf(w, "  %s\n", a)
		if m, err := ma.NewMultiaddr(a); err == nil && isPublic(m) {
			public = true
		}
	}
	if len(info.Addrs) > 0 {
		fmt.Fprintf(w, "volunteers join with:\n  skein node join --bootstrap %s\n", info.Addrs[0])
	}
	if !public && cfg.Advertise == "" {
		fmt.Fprintln(w, "warning: every address above is private or loopback, so only machines on this network can join;\n"+
			"         give --advertise PUBLIC_IP:PORT when the port is forwarded from a public address")
	}
}

// isPublic reports whether a multiaddr's IP is a global unicast address
// outside the private and shared ranges.
func isPublic(m ma.Multiaddr) bool {
	for _, code := range []int{ma.P_IP4, ma.P_IP6} {
		if v, err := m.ValueForProtocol(code); err == nil {
			ip := net.ParseIP(v)
			return ip != nil && ip.IsGlobalUnicast() && !ip.IsPrivate() && !strings.HasPrefix(v, "100.64.")
		}
	}
	return false
}
