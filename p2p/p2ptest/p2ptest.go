// Package p2ptest builds in-process swarms of p2p nodes on loopback for tests
// of p2p and of the packages above it (optimizer and pipeline adapters, node).
package p2ptest

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skein-ml/skein/p2p"
)

// Loopback listen addresses with kernel-chosen ports.
var Loopback = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}

// Options shape a swarm. The zero value is a usable default.
type Options struct {
	RunID   string                         // default "test"
	Timing  p2p.Timing                     // default p2p.FastTiming()
	Persist bool                           // give each node a DataDir under t.TempDir()
	Node    func(i int, c *p2p.NodeConfig) // last-minute per-node tweaks
	Seed    func(c *p2p.SeedConfig)        // last-minute tweaks of the seed's config
	Logger  *slog.Logger                   // default: discard (P2P_TEST_LOG=1 logs to stderr)
	// ListenUDP replaces every node's UDP socket (WAN emulation).
	ListenUDP func(network string, laddr *net.UDPAddr) (net.PacketConn, error)
	// Listen overrides the loopback listen addresses.
	Listen []string
}

// Swarm is a seed plus nodes, all in this process on loopback.
type Swarm struct {
	T     testing.TB
	Opts  Options
	Seed  *p2p.Seed
	Nodes []*p2p.Node // Nodes[0] is Seed.Node
	Dirs  []string    // data dirs when Persist

	mu sync.Mutex
}

// Timing is p2p.FastTiming, slowed down about 4x under the race detector
// (which makes everything several times slower; probes would time out).
func Timing() p2p.Timing {
	t := p2p.FastTiming()
	if raceEnabled {
		t.ProbeInterval, t.ProbeTimeout = time.Second, 800*time.Millisecond
		t.GossipInterval = 100 * time.Millisecond
		t.SuspicionMult = 4
		t.StreamTimeout = 10 * time.Second
	}
	return t
}

func (o *Options) fill() {
	if o.RunID == "" {
		o.RunID = "test"
	}
	if o.Timing == (p2p.Timing{}) {
		o.Timing = Timing()
	}
	if o.Logger == nil {
		if os.Getenv("P2P_TEST_LOG") != "" {
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		} else {
			o.Logger = slog.New(slog.DiscardHandler)
		}
	}
}

// NewSwarm starts a seed and n-1 nodes joined through it (n members in all)
// and waits until every node sees n members. Everything is closed at the end
// of the test.
func NewSwarm(t testing.TB, n int, opts Options) *Swarm {
	t.Helper()
	opts.fill()
	start := time.Now()
	s := &Swarm{T: t, Opts: opts}
	seed, err := p2p.NewSeed(context.Background(), s.SeedConfig())
	if err != nil {
		t.Fatalf("p2ptest: seed: %v", err)
	}
	s.Seed = seed
	t.Logf("p2ptest: seed started in %v", time.Since(start))
	s.Nodes = append(s.Nodes, seed.Node)
	t.Cleanup(s.Close)
	var wg sync.WaitGroup
	errs := make([]error, n-1)
	nodes := make([]*p2p.Node, n-1)
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i-1], errs[i-1] = p2p.NewNode(context.Background(), s.NodeConfig(i))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("p2ptest: node %d: %v", i+1, err)
		}
	}
	s.Nodes = append(s.Nodes, nodes...)
	t.Logf("p2ptest: %d nodes started in %v", n, time.Since(start))
	s.WaitMembers(n, Slowdown*30*time.Second)
	return s
}

// SeedConfig is the configuration the swarm's seed uses.
func (s *Swarm) SeedConfig() p2p.SeedConfig {
	c := p2p.DefaultSeedConfig(s.Opts.RunID, s.dir(0))
	c.ListenAddrs = Loopback
	if s.Opts.Listen != nil {
		c.ListenAddrs = s.Opts.Listen
	}
	c.Timing = s.Opts.Timing
	c.ListenUDP = s.Opts.ListenUDP
	c.Logger = s.Opts.Logger.With("node", 0)
	if s.Opts.Seed != nil {
		s.Opts.Seed(&c)
	}
	return c
}

// NodeConfig is the configuration node i would get: loopback, fast timing,
// bootstrapped through the seed.
func (s *Swarm) NodeConfig(i int) p2p.NodeConfig {
	c := p2p.DefaultNodeConfig(s.Opts.RunID)
	c.ListenAddrs = Loopback
	if s.Opts.Listen != nil {
		c.ListenAddrs = s.Opts.Listen
	}
	c.ListenUDP = s.Opts.ListenUDP
	c.Timing = s.Opts.Timing
	// The production default: 5 s was too short for a dial and identify
	// on a machine where other test packages starve the swarm of CPU (seen:
	// a seed that took 6.8 s to start).
	c.JoinTimeout = 10 * time.Second
	c.RejoinInterval = time.Second
	c.DataDir = s.dir(i)
	c.Logger = s.Opts.Logger.With("node", i)
	if s.Seed != nil {
		c.Bootstrap = []string{s.Seed.FullAddr().String()}
	}
	if s.Opts.Node != nil {
		s.Opts.Node(i, &c)
	}
	return c
}

func (s *Swarm) dir(i int) string {
	if !s.Opts.Persist {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.Dirs) <= i {
		s.Dirs = append(s.Dirs, s.T.TempDir())
	}
	return s.Dirs[i]
}

// Add starts one more node joined through the seed (or cfg's Bootstrap).
func (s *Swarm) Add(cfg p2p.NodeConfig) (*p2p.Node, error) {
	n, err := p2p.NewNode(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.Nodes = append(s.Nodes, n)
	s.mu.Unlock()
	return n, nil
}

// Adopt makes the swarm close n at the end of the test.
func (s *Swarm) Adopt(n *p2p.Node) {
	s.mu.Lock()
	s.Nodes = append(s.Nodes, n)
	s.mu.Unlock()
}

// Live returns the nodes not yet closed by the swarm.
func (s *Swarm) Live() []*p2p.Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*p2p.Node
	for _, n := range s.Nodes {
		if n != nil {
			out = append(out, n)
		}
	}
	return out
}

// Remove forgets node n (after the test closed it itself).
func (s *Swarm) Remove(n *p2p.Node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range s.Nodes {
		if m == n {
			s.Nodes[i] = nil
		}
	}
}

// WaitMembers waits until every live node sees want members.
func (s *Swarm) WaitMembers(want int, timeout time.Duration) {
	s.T.Helper()
	if err := s.Eventually(timeout, func() error {
		for i, n := range s.Live() {
			if got := n.NumMembers(); got != want {
				return fmt.Errorf("node %d sees %d members, want %d", i, got, want)
			}
		}
		return nil
	}); err != nil {
		s.T.Fatal(err)
	}
}

// Eventually polls cond every 20 ms until it returns nil or timeout passes.
func (s *Swarm) Eventually(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Sees reports whether node n has id among its members.
func Sees(n *p2p.Node, id peer.ID) bool {
	_, ok := n.Member(id)
	return ok
}

// Close shuts every live node down (without leaving; the whole swarm ends).
func (s *Swarm) Close() {
	var wg sync.WaitGroup
	for _, n := range s.Live() {
		wg.Add(1)
		go func() { defer wg.Done(); n.Shutdown() }()
	}
	wg.Wait()
	s.mu.Lock()
	for i := range s.Nodes {
		s.Nodes[i] = nil
	}
	s.mu.Unlock()
}
