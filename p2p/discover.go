package p2p

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/protocol/identify"
)

// DiscoverRun asks the first reachable of addrs (full multiaddrs of a
// run's bootstrap or members) which run it serves: the run id in its
// /skein/<run>/members-stream/1 protocol. It uses a throwaway host with a
// fresh identity, so a volunteer needs only the bootstrap's address to
// join. listenUDP, if set, replaces the host's UDP socket (WAN emulation).
func DiscoverRun(ctx context.Context, addrs []string, listenUDP func(string, *net.UDPAddr) (net.PacketConn, error)) (string, error) {
	if len(addrs) == 0 {
		return "", fmt.Errorf("%w: no address to ask for the run", ErrNoSeed)
	}
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return "", fmt.Errorf("p2p: discover: %w", err)
	}
	h, err := newHost(hostParams{key: key, listen: []string{"/ip4/0.0.0.0/udp/0/quic-v1"}, limits: DefaultLimits(),
		listenUDP: listenUDP})
	if err != nil {
		return "", err
	}
	defer h.Close()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	// Every address at once: the first that answers wins, a dead one
	// costs nothing.
	type answer struct {
		run string
		err error
	}
	ch := make(chan answer, len(addrs))
	for _, a := range addrs {
		go func() {
			run, err := askRun(ctx, h, a)
			ch <- answer{run, err}
		}()
	}
	var errs []error
	for range addrs {
		ans := <-ch
		if ans.err == nil {
			return ans.run, nil
		}
		errs = append(errs, ans.err)
	}
	return "", fmt.Errorf("%w: could not learn the run: %w", ErrNoSeed, errors.Join(errs...))
}

// askRun connects h to the peer at addr and reads its run from identify.
func askRun(ctx context.Context, h host.Host, addr string) (string, error) {
	ai, err := peer.AddrInfoFromString(addr)
	if err != nil {
		return "", fmt.Errorf("address %q: %w", addr, err)
	}
	if err := h.Connect(network.WithAllowLimitedConn(ctx, "discover"), *ai); err != nil {
		return "", fmt.Errorf("%s: %w", ai.ID, err)
	}
	if ids, ok := h.(interface{ IDService() identify.IDService }); ok {
		for _, c := range h.Network().ConnsToPeer(ai.ID) {
			select {
			case <-ids.IDService().IdentifyWait(c):
			case <-ctx.Done():
			}
		}
	}
	protos, err := h.Peerstore().GetProtocols(ai.ID)
	if err != nil {
		return "", fmt.Errorf("%s: %w", ai.ID, err)
	}
	for _, p := range protos {
		if r := runOfProtocol(p); r != "" && strings.HasSuffix(string(p), "/"+ProtoMembersStream.String()) {
			return r, nil
		}
	}
	return "", fmt.Errorf("%s serves no run's membership", ai.ID)
}
