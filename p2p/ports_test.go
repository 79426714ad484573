package p2p

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// udpPort is the port of n's first QUIC listen address.
func udpPort(t *testing.T, n *Node) int {
	t.Helper()
	for _, a := range n.h.Network().ListenAddresses() {
		if p, err := a.ValueForProtocol(0x0111); err == nil { // udp
			port, _ := strconv.Atoi(p)
			return port
		}
	}
	t.Fatal("no UDP listen address")
	return 0
}

// A node restarted on its data directory listens on the port of its last
// run (the others' memberlist still holds that address for it); when the
// port is taken, or the file is damaged, on a new one.
func TestRestartKeepsPort(t *testing.T) {
	dir := t.TempDir()
	start := func() *Node {
		cfg := DefaultNodeConfig("ports")
		cfg.ListenAddrs, cfg.DataDir, cfg.JoinAlone, cfg.Timing = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, dir, true, FastTiming()
		n, err := NewNode(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	n := start()
	first := udpPort(t, n)
	n.Close()
	n = start()
	if got := udpPort(t, n); got != first {
		t.Fatalf("restarted on port %d, the last run's was %d", got, first)
	}
	n.Close()

	// Taken by another program: a new port, and the node still starts.
	c, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(first)))
	if err != nil {
		t.Fatal(err)
	}
	n = start()
	if got := udpPort(t, n); got == first {
		t.Fatalf("listening on port %d, which another socket holds", got)
	}
	n.Close()
	c.Close()

	// A damaged file costs only the port.
	if err := os.WriteFile(filepath.Join(dir, PortsFile), []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n = start()
	n.Close()
}

func TestParsePorts(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"", true},
		{"/ip4/0.0.0.0/udp/0/quic-v1 4001\n/ip4/0.0.0.0/tcp/0 4002\n", true},
		{"/ip4/0.0.0.0/udp/0/quic-v1 0\n", false},
		{"/ip4/0.0.0.0/udp/0/quic-v1 70000\n", false},
		{"/ip4/0.0.0.0/udp/4001/quic-v1 4001\n", false}, // no port 0 to replace
		{"4001\n", false},
		{"a b c\n", false},
	} {
		m, err := parsePorts([]byte(tc.in))
		if (err == nil) != tc.ok {
			t.Errorf("parsePorts(%q) = %v, %v; ok %v", tc.in, m, err, tc.ok)
		}
	}
}

func FuzzParsePorts(f *testing.F) {
	f.Add([]byte("/ip4/0.0.0.0/udp/0/quic-v1 4001\n"))
	f.Add([]byte("/ip6/::/tcp/0 1\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parsePorts(b)
		if err != nil {
			return
		}
		for a, p := range m {
			if p < 1 || p > 65535 {
				t.Fatalf("port %d for %q", p, a)
			}
			if _, ok := withPort(a, p); !ok {
				t.Fatalf("%q has no port 0", a)
			}
		}
	})
}
