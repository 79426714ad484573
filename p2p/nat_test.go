//go:build linux

package p2p_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/skein-ml/skein/p2p"
)

// The emulated internet is 198.51.100.0/24 (TEST-NET-2), which exists only
// inside the namespaces this test creates. go-libp2p ignores unroutable
// ranges for relays and hole punching, so the helper processes treat it as
// public.
const (
	natNet   = "198.51.100"
	natRunID = "nat"
)

// natTopology is one "public" namespace with a bridge (the relay/seed lives
// there) and two home networks, each a router namespace (masquerade on its WAN
// leg, unsolicited inbound dropped) with a host namespace behind it.
type natTopology struct {
	pub, ra, rb, ha, hb string
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// newNATTopology builds the namespaces; symmetric makes the NATs pick a random
// port per destination (masquerade fully-random), which defeats hole punching.
func newNATTopology(t *testing.T, tag string, symmetric bool) *natTopology {
	sfx := tag + fmt.Sprint(os.Getpid()%100000)
	nt := &natTopology{pub: "skpub" + sfx, ra: "skra" + sfx, rb: "skrb" + sfx, ha: "skha" + sfx, hb: "skhb" + sfx}
	all := []string{nt.pub, nt.ra, nt.rb, nt.ha, nt.hb}
	t.Cleanup(func() {
		for _, ns := range all {
			exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	for _, ns := range all {
		run(t, "ip", "netns", "add", ns)
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "-n", nt.pub, "link", "add", "br0", "type", "bridge")
	run(t, "ip", "-n", nt.pub, "addr", "add", natNet+".1/24", "dev", "br0")
	run(t, "ip", "-n", nt.pub, "link", "set", "br0", "up")
	for i, home := range []struct{ router, host string }{{nt.ra, nt.ha}, {nt.rb, nt.hb}} {
		wanIP := fmt.Sprintf("%s.%d", natNet, i+2)
		lanNet := fmt.Sprintf("10.0.%d", i+1)
		port := fmt.Sprintf("r%d", i)
		run(t, "ip", "-n", home.router, "link", "add", "wan", "type", "veth", "peer", "name", port, "netns", nt.pub)
		run(t, "ip", "-n", nt.pub, "link", "set", port, "master", "br0", "up")
		run(t, "ip", "-n", home.router, "addr", "add", wanIP+"/24", "dev", "wan")
		run(t, "ip", "-n", home.router, "link", "set", "wan", "up")
		run(t, "ip", "-n", home.router, "link", "add", "lan", "type", "veth", "peer", "name", "eth0", "netns", home.host)
		run(t, "ip", "-n", home.router, "addr", "add", lanNet+".1/24", "dev", "lan")
		run(t, "ip", "-n", home.router, "link", "set", "lan", "up")
		run(t, "ip", "-n", home.host, "addr", "add", lanNet+".2/24", "dev", "eth0")
		run(t, "ip", "-n", home.host, "link", "set", "eth0", "up")
		run(t, "ip", "-n", home.host, "route", "add", "default", "via", lanNet+".1")
		run(t, "ip", "netns", "exec", home.router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
		masq := "masquerade"
		if symmetric {
			masq = "masquerade fully-random"
		}
		rules := `
table ip nat {
  chain postrouting_wan {
    type nat hook postrouting priority 100; policy accept;
    oifname "wan" MASQ
  }
}
table inet filter {
  chain forward_lan {
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    iifname "lan" oifname "wan" accept
  }
  chain input_wan {
    type filter hook input priority 0; policy accept;
    iifname "wan" ct state established,related accept
    iifname "wan" drop
  }
}
`
		cmd := exec.Command("ip", "netns", "exec", home.router, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(strings.Replace(rules, "MASQ", masq, 1))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft in %s: %v: %s", home.router, err, out)
		}
	}
	return nt
}

// helper is a child process of this test binary running one node in a namespace.
type helper struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan [2]string
	mu    sync.Mutex
	tail  []string // its last lines of other output, shown if it exits early
}

func startHelper(t *testing.T, ns, role string, env ...string) *helper {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestNATHelper$", "-test.v", "-test.timeout=60s")
	// Its data lives in this test's directory: the helper is killed when
	// the test ends, before its own t.TempDir would be removed.
	cmd.Env = append(append(os.Environ(), "P2P_NAT_ROLE="+role, "P2P_NAT_DIR="+t.TempDir()), env...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, stdin: stdin, lines: make(chan [2]string, 16)}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.SplitN(sc.Text(), " ", 3)
			if len(f) == 3 && f[0] == "P2PNAT" {
				h.lines <- [2]string{f[1], f[2]}
				continue
			}
			h.mu.Lock()
			if h.tail = append(h.tail, sc.Text()); len(h.tail) > 40 {
				h.tail = h.tail[1:]
			}
			h.mu.Unlock()
			if os.Getenv("P2P_TEST_LOG") != "" {
				t.Logf("%s: %s", role, sc.Text())
			}
		}
		close(h.lines)
	}()
	return h
}

// expect waits for the helper's next report and checks its key.
func (h *helper) expect(t *testing.T, key string, timeout time.Duration) string {
	t.Helper()
	select {
	case kv, ok := <-h.lines:
		if !ok {
			h.mu.Lock()
			defer h.mu.Unlock()
			t.Fatalf("helper exited before reporting %q; its last output:\n%s", key, strings.Join(h.tail, "\n"))
		}
		if kv[0] != key {
			t.Fatalf("helper reported %s=%q, want %s", kv[0], kv[1], key)
		}
		return kv[1]
	case <-time.After(timeout):
		t.Fatalf("helper did not report %q within %v", key, timeout)
	}
	return ""
}

// TestNATTraversal: two nodes, each behind its own NAT, join through the
// seed, reach each other through the seed's relay, and hole punch to a
// direct connection (QUIC). Behind symmetric NATs punching fails and the
// relayed path keeps working.
func TestNATTraversal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	if err := exec.Command("ip", "netns", "list").Run(); err != nil {
		t.Skip("ip netns unavailable")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft (nftables) not installed")
	}
	t.Run("cone", func(t *testing.T) { natCase(t, "c", false) })
	t.Run("symmetric", func(t *testing.T) { natCase(t, "s", true) })
}

func natCase(t *testing.T, tag string, symmetric bool) {
	start := time.Now()
	nt := newNATTopology(t, tag, symmetric)
	t.Logf("topology built in %v", time.Since(start))
	relay := startHelper(t, nt.pub, "relay")
	seedAddr := relay.expect(t, "addr", 20*time.Second)
	a := startHelper(t, nt.ha, "a", "P2P_NAT_SEED="+seedAddr)
	aID := a.expect(t, "id", 20*time.Second)
	t.Logf("A reserved a relay slot in %s", a.expect(t, "reserved", 20*time.Second))
	b := startHelper(t, nt.hb, "b", "P2P_NAT_SEED="+seedAddr, "P2P_NAT_PEER="+aID, fmt.Sprintf("P2P_NAT_SYMMETRIC=%v", symmetric))
	b.expect(t, "id", 20*time.Second)
	t.Logf("B reserved a relay slot in %s", b.expect(t, "reserved", 20*time.Second))
	t.Logf("B sees A as a member after %s", b.expect(t, "member", 20*time.Second))
	t.Logf("B reached A: %s", b.expect(t, "reached", 20*time.Second))
	direct := b.expect(t, "direct", 20*time.Second)
	t.Logf("direct connection: %s", direct)
	if !symmetric && !strings.HasPrefix(direct, "yes") {
		t.Errorf("hole punching did not give a direct connection: %s", direct)
	}
	if symmetric && direct != "no" {
		t.Errorf("direct connection through symmetric NATs: %s", direct)
	}
	t.Logf("total %v", time.Since(start))
}

// treatTestNetAsPublic removes natNet from go-multiaddr's unroutable list in
// this (helper) process only.
func treatTestNetAsPublic() {
	var keep []*net.IPNet
	for _, n := range manet.Unroutable4 {
		if !n.Contains(net.ParseIP(natNet + ".1")) {
			keep = append(keep, n)
		}
	}
	manet.Unroutable4 = keep
}

func TestNATHelper(t *testing.T) {
	role := os.Getenv("P2P_NAT_ROLE")
	if role == "" {
		t.Skip("helper process of TestNATTraversal")
	}
	treatTestNetAsPublic()
	say := func(k string, v any) { fmt.Printf("P2PNAT %s %v\n", k, v) }
	ctx := context.Background()
	start := time.Now()
	if role == "relay" {
		dir := os.Getenv("P2P_NAT_DIR")
		if dir == "" {
			dir = t.TempDir()
		}
		cfg := p2p.DefaultSeedConfig(natRunID, dir)
		cfg.ListenAddrs = []string{"/ip4/" + natNet + ".1/udp/4001/quic-v1", "/ip4/" + natNet + ".1/tcp/4001"}
		cfg.Timing = p2p.FastTiming()
		s, err := p2p.NewSeed(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Shutdown()
		say("addr", s.FullAddr())
		io.Copy(io.Discard, os.Stdin) // until the parent is done
		return
	}
	cfg := p2p.DefaultNodeConfig(natRunID)
	cfg.ListenAddrs = []string{"/ip4/0.0.0.0/udp/0/quic-v1", "/ip4/0.0.0.0/tcp/0"}
	cfg.Bootstrap = []string{os.Getenv("P2P_NAT_SEED")}
	cfg.Reachability = p2p.ReachabilityPrivate
	cfg.Timing = p2p.FastTiming()
	cfg.JoinTimeout = 10 * time.Second
	n, err := p2p.NewNode(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Shutdown()
	fcfg := p2p.DefaultFrameConfig()
	n.Handle(p2p.Protocol{Name: "echo", Version: 1}, fcfg, func(ctx context.Context, s *p2p.Stream) error {
		typ, p, err := s.ReadFrame()
		if err != nil {
			return err
		}
		return s.WriteFrame(typ, p)
	})
	say("id", n.ID())
	if err := waitFor(15*time.Second, func() bool {
		for _, a := range n.Host().Addrs() {
			if _, err := a.ValueForProtocol(ma.P_CIRCUIT); err == nil {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatalf("no relay reservation: %v", err)
	}
	say("reserved", time.Since(start).Round(time.Millisecond))
	if role == "b" {
		other, err := peer.Decode(os.Getenv("P2P_NAT_PEER"))
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		// Known to B: a member, or pending while it is reached only through
		// the relay (no bootstrap vouches for relayed members yet).
		known := func() bool {
			_, ok := n.Member(other)
			return ok || slices.ContainsFunc(n.Pending(), func(m p2p.Member) bool { return m.ID == other })
		}
		if err := waitFor(15*time.Second, known); err != nil {
			t.Fatalf("A never became a member: %v", err)
		}
		say("member", time.Since(t0).Round(time.Millisecond))
		t0 = time.Now()
		s, err := n.Open(network.WithAllowLimitedConn(ctx, "test"), other, p2p.Protocol{Name: "echo", Version: 1}, fcfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.WriteFrame(1, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		if _, p, err := s.ReadFrame(); err != nil || string(p) != "hi" {
			t.Fatalf("echo: %q %v", p, err)
		}
		s.Close()
		say("reached", fmt.Sprintf("echo in %v over %s", time.Since(t0).Round(time.Millisecond), s.Raw().Conn().RemoteMultiaddr()))
		t0 = time.Now()
		wait := 10 * time.Second
		if os.Getenv("P2P_NAT_SYMMETRIC") == "true" {
			wait = 4 * time.Second // punching is expected to fail
		}
		err = waitFor(wait, func() bool {
			for _, c := range n.Host().Network().ConnsToPeer(other) {
				if !c.Stat().Limited {
					return true
				}
			}
			return false
		})
		if err != nil {
			say("direct", "no")
		} else {
			var addrs []string
			for _, c := range n.Host().Network().ConnsToPeer(other) {
				if !c.Stat().Limited {
					addrs = append(addrs, c.RemoteMultiaddr().String())
				}
			}
			say("direct", fmt.Sprintf("yes after %v: %v", time.Since(t0).Round(time.Millisecond), addrs))
		}
	}
	io.Copy(io.Discard, os.Stdin)
}

func waitFor(timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
