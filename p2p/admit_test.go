package p2p_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// identity returns a fresh node key and its peer ID.
func identity(t *testing.T) (crypto.PrivKey, peer.ID) {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return key, id
}

func token(t *testing.T, runKey ed25519.PrivateKey, id peer.ID, role p2p.Role, ttl time.Duration) []byte {
	t.Helper()
	b, err := p2p.IssueToken(runKey, p2p.Token{Peer: id, RunID: "test", Role: role, Expires: time.Now().Add(ttl)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// never checks for a while that cond stays false on every poll.
func never(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if cond() {
			t.Fatal(what)
		}
	}
}

// probeProtocols are the run protocols other packages serve; the test
// serves each of them on the admitted nodes.
var probeProtocols = []p2p.Protocol{p2p.ProtoBulk, p2p.ProtoReduce, p2p.ProtoGossip, p2p.ProtoManifest, p2p.ProtoTelemetry}

// A closed run: a seed holding the run key and two volunteers with tokens
// are members; hosts with no token or a forged one are refused at the door,
// and one that skips the door (memberlist alone) never appears in any
// member list, and none of its streams on the run's protocols reaches a
// handler.
func TestClosedRunAdmitsTokenHoldersOnly(t *testing.T) {
	pub, runKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, forger, _ := ed25519.GenerateKey(rand.Reader)
	closed := p2p.Admission{Closed: true, RunKey: pub}
	s := p2ptest.NewSwarm(t, 3, p2ptest.Options{
		Seed: func(c *p2p.SeedConfig) { c.Admission, c.RunKey = closed, runKey },
		Node: func(i int, c *p2p.NodeConfig) {
			// Volunteers learn the policy from the seed (Admission nil).
			key, id := identity(t)
			c.Identity, c.Token = key, token(t, runKey, id, p2p.RoleVolunteer, time.Hour)
		},
	})
	seedAddr := s.Seed.FullAddr().String()
	for i, n := range s.Nodes[1:] {
		if n.Meta().Token == "" {
			t.Fatalf("node %d carries no token", i+1)
		}
	}

	// Refused at the door, each with its reason.
	for _, c := range []struct {
		name  string
		token func(id peer.ID) []byte
		want  error
	}{
		{"no token", func(peer.ID) []byte { return nil }, p2p.ErrTokenMissing},
		{"forged", func(id peer.ID) []byte { return token(t, forger, id, p2p.RoleVolunteer, time.Hour) }, p2p.ErrTokenForged},
		{"expired", func(id peer.ID) []byte { return token(t, runKey, id, p2p.RoleVolunteer, -time.Hour) }, p2p.ErrTokenExpired},
		{"someone else's", func(peer.ID) []byte {
			_, other := identity(t)
			return token(t, runKey, other, p2p.RoleVolunteer, time.Hour)
		}, p2p.ErrTokenWrongPeer},
		{"observer's, as a volunteer", func(id peer.ID) []byte { return token(t, runKey, id, p2p.RoleObserver, time.Hour) }, p2p.ErrTokenWrongRole},
	} {
		cfg := s.NodeConfig(9)
		key, id := identity(t)
		cfg.Identity, cfg.Token = key, c.token(id)
		n, err := p2p.NewNode(context.Background(), cfg)
		if err == nil {
			n.Shutdown()
			t.Fatalf("%s: joined", c.name)
		}
		var refused *p2p.NotAdmittedError
		if !errors.Is(err, c.want) || !errors.Is(err, p2p.ErrNotAdmitted) || !errors.As(err, &refused) || refused.Self != id {
			t.Fatalf("%s: %v, want %v", c.name, err, c.want)
		}
		t.Logf("%s: %v", c.name, err)
	}

	// Handlers on the admitted volunteers, counting the streams they serve.
	var served atomic.Int64
	for _, n := range s.Nodes[1:] {
		for _, proto := range probeProtocols {
			if err := n.Handle(proto, p2p.MessageFrameConfig(64), func(_ context.Context, st *p2p.Stream) error {
				served.Add(1)
				return st.WriteFrame(1, []byte("member"))
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A member is served.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, proto := range probeProtocols {
		st, err := s.Nodes[2].Open(ctx, s.Nodes[1].ID(), proto, p2p.MessageFrameConfig(64))
		if err != nil {
			t.Fatal(err)
		}
		if _, b, err := st.ReadFrame(); err != nil || string(b) != "member" {
			t.Fatalf("member's %s stream: %q, %v", proto, b, err)
		}
		st.Close()
	}
	if served.Load() != int64(len(probeProtocols)) {
		t.Fatalf("served %d streams, want %d", served.Load(), len(probeProtocols))
	}
	served.Store(0)

	// A host that skips the door: it thinks the run open and joins with
	// memberlist alone, with a forged token in its metadata.
	cfg := s.NodeConfig(10)
	key, id := identity(t)
	cfg.Identity, cfg.Token = key, token(t, forger, id, p2p.RoleVolunteer, time.Hour)
	cfg.Admission, cfg.Bootstrap, cfg.JoinAlone = &p2p.Admission{}, nil, true
	intruder, err := p2p.NewNode(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Adopt(intruder)
	for i, n := range s.Nodes[:3] {
		addr := n.Addrs()[0].String()
		if i == 0 {
			addr = seedAddr
		}
		if k, err := p2p.JoinPastTheDoor(ctx, intruder, addr); err == nil {
			t.Errorf("node %d let the intruder join memberlist (%d)", i, k)
		} else {
			t.Logf("join past node %d's door: %v", i, err)
		}
	}
	never(t, 3*time.Second, "an admitted node lists the intruder", func() bool {
		for _, n := range s.Nodes[:3] {
			if p2ptest.Sees(n, intruder.ID()) || p2p.NumMemberlistMembers(n) != 3 || n.NumMembers() != 3 {
				return true
			}
		}
		return false
	})

	// Its streams are reset before any handler sees them: the probes on
	// the volunteers and membership's own protocols on every node.
	for i, n := range s.Nodes[:3] {
		for _, proto := range probeProtocols {
			st, err := intruder.Open(ctx, n.ID(), proto, p2p.MessageFrameConfig(64))
			if err != nil {
				continue // refused at negotiation: as good
			}
			if _, b, err := st.ReadFrame(); err == nil {
				t.Errorf("node %d served the intruder's %s stream: %q", i, proto, b)
			}
			st.Reset()
		}
		for _, proto := range []p2p.Protocol{p2p.ProtoMembersPacket, p2p.ProtoMembersStream, p2p.ProtoMembersBye} {
			raw, err := intruder.Host().NewStream(ctx, n.ID(), proto.ID("test"))
			if err != nil {
				continue
			}
			_ = raw.SetDeadline(time.Now().Add(5 * time.Second))
			raw.Write([]byte{0, 0, 0, 1, 0})
			raw.CloseWrite()
			_, err = io.ReadAll(raw)
			if !errors.Is(err, network.ErrReset) {
				t.Errorf("node %d: intruder's %s stream ended with %v, want a reset", i, proto, err)
			}
			raw.Reset()
		}
	}
	if served.Load() != 0 {
		t.Errorf("handlers served %d streams of the intruder", served.Load())
	}
	// And it is still nobody's member.
	for i, n := range s.Nodes[:3] {
		if p2ptest.Sees(n, intruder.ID()) {
			t.Errorf("node %d lists the intruder", i)
		}
	}
}

// listenOn is a loopback listen address pair on ip (Linux routes all of
// 127.0.0.0/8 to the loopback interface).
func listenOn(ip string) []string {
	return []string{fmt.Sprintf("/ip4/%s/udp/0/quic-v1", ip), fmt.Sprintf("/ip4/%s/tcp/0", ip)}
}

// An open run caps its members per address prefix and in total: nodes
// past a cap are refused at the door, and one that skips the door is left
// out of every member list.
func TestOpenRunCaps(t *testing.T) {
	// Prefixes of one address (/32), so that loopback addresses differ:
	// at most one member per address, three in all.
	caps := p2p.Admission{MaxMembers: 3, MaxPerPrefix: 1, PrefixV4: 32}
	s := p2ptest.NewSwarm(t, 2, p2ptest.Options{
		Seed: func(c *p2p.SeedConfig) { c.Admission = caps },
		Node: func(i int, c *p2p.NodeConfig) { c.ListenAddrs = listenOn(fmt.Sprintf("127.0.0.%d", i+1)) },
	})
	add := func(ip string) (*p2p.Node, error) {
		cfg := s.NodeConfig(1)
		cfg.ListenAddrs = listenOn(ip)
		return s.Add(cfg)
	}
	if _, err := add("127.0.0.2"); !errors.Is(err, p2p.ErrPrefixFull) || !errors.Is(err, p2p.ErrNotAdmitted) {
		t.Fatalf("second node behind 127.0.0.2/32: %v, want ErrPrefixFull", err)
	} else {
		t.Logf("refused: %v", err)
	}
	third, err := add("127.0.0.3")
	if err != nil {
		t.Fatalf("third member: %v", err)
	}
	s.WaitMembers(3, p2ptest.Slowdown*10*time.Second)
	if _, err := add("127.0.0.4"); !errors.Is(err, p2p.ErrRunFull) {
		t.Fatalf("fourth member: %v, want ErrRunFull", err)
	}

	// One that skips the door is refused by membership itself, by every
	// member (the volunteers learned the caps from the seed).
	cfg := s.NodeConfig(5)
	cfg.ListenAddrs = listenOn("127.0.0.5")
	cfg.Admission, cfg.Bootstrap, cfg.JoinAlone = &p2p.Admission{}, nil, true
	sneak, err := p2p.NewNode(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sneak.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p2p.JoinPastTheDoor(ctx, sneak, third.Addrs()[0].String()); err != nil {
		t.Logf("join past the door: %v", err)
	}
	never(t, 3*time.Second, "a member lists the node past the cap", func() bool {
		for _, n := range s.Live() {
			if n != sneak && (p2ptest.Sees(n, sneak.ID()) || n.NumMembers() != 3) {
				return true
			}
		}
		return false
	})
}

// The default caps count members behind one /24: on loopback, every node.
func TestOpenRunPrefixCap(t *testing.T) {
	s := p2ptest.NewSwarm(t, 2, p2ptest.Options{
		Seed: func(c *p2p.SeedConfig) { c.Admission = p2p.Admission{MaxPerPrefix: 2} },
	})
	if _, err := s.Add(s.NodeConfig(2)); !errors.Is(err, p2p.ErrPrefixFull) {
		t.Fatalf("third node on 127.0.0.0/24: %v, want ErrPrefixFull", err)
	}
	if s.Seed.NumMembers() != 2 {
		t.Errorf("seed sees %d members", s.Seed.NumMembers())
	}
}

// A server serves at most MaxBulkStreamsPerPeer bulk streams of one peer
// at once; the others are reset.
func TestBulkStreamsPerPeer(t *testing.T) {
	s := p2ptest.NewSwarm(t, 2, p2ptest.Options{})
	server, client := s.Nodes[0], s.Nodes[1]
	var inside, most atomic.Int64
	if err := server.ServeBulk(func(ctx context.Context, from peer.ID, key string) (io.ReaderAt, int64, error) {
		k := inside.Add(1)
		defer inside.Add(-1)
		for m := most.Load(); k > m && !most.CompareAndSwap(m, k); m = most.Load() {
		}
		time.Sleep(500 * time.Millisecond)
		return zeroes{}, 1 << 10, nil
	}, 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	streams := p2p.MaxBulkStreamsPerPeer + 8
	_, err := client.Fetch(ctx, server.ID(), "k", discardAt{}, p2p.FetchOptions{Length: int64(streams), ChunkSize: 1, Streams: streams})
	t.Logf("fetch over %d streams: %v; at most %d served at once", streams, err, most.Load())
	if m := most.Load(); m > p2p.MaxBulkStreamsPerPeer || m < 2 {
		t.Errorf("served %d streams of one peer at once, limit %d", m, p2p.MaxBulkStreamsPerPeer)
	}
}

type zeroes struct{}

func (zeroes) ReadAt(p []byte, _ int64) (int, error) { clear(p); return len(p), nil }
