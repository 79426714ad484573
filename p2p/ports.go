package p2p

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	ma "github.com/multiformats/go-multiaddr"

	"github.com/skein-ml/skein/internal/atomicfile"
)

// A node with a data directory listens on the ports of its last run when
// its listen addresses leave the port to the system (port 0): a volunteer
// restarted after a crash comes back at the address the others still hold
// for it. memberlist keeps a member's address until the member leaves or
// dies, and the old entry of a volunteer killed -9 never dies (its peer
// ID, on a new port, answers the pings), so a new port would be refused as
// a conflicting address, and with it every metadata update of the restarted
// volunteer (its round, its state hash) until the old entry is reaped. The
// port also keeps NAT mappings and the others' peer books valid.

// PortsFile, in a node's data directory, lists the ports it last listened
// on: one "listen-address port" line per listen address with port 0.
const PortsFile = "listen-ports"

// maxPortsFile bounds what is read of PortsFile.
const maxPortsFile = 4 << 10

// stickyListen returns listen with each port-0 address given the port it
// had in the last run (saved), when that port is free now; the others as
// they are.
func stickyListen(listen []string, saved map[string]int) []string {
	out := make([]string, len(listen))
	for i, a := range listen {
		out[i] = a
		port, ok := saved[a]
		if !ok {
			continue
		}
		if s, ok := withPort(a, port); ok && portFree(s) {
			out[i] = s
		}
	}
	return out
}

// withPort is the listen address a (port 0) with port instead.
func withPort(a string, port int) (string, bool) {
	parts := strings.Split(a, "/")
	for i := 0; i+1 < len(parts); i++ {
		if (parts[i] == "udp" || parts[i] == "tcp") && parts[i+1] == "0" {
			parts[i+1] = strconv.Itoa(port)
			return strings.Join(parts, "/"), true
		}
	}
	return "", false
}

// portFree says whether the multiaddr s's IP and port can be bound now.
func portFree(s string) bool {
	m, err := ma.NewMultiaddr(s)
	if err != nil {
		return false
	}
	ip, err := m.ValueForProtocol(ma.P_IP4)
	if err != nil {
		if ip, err = m.ValueForProtocol(ma.P_IP6); err != nil {
			return false
		}
	}
	if p, err := m.ValueForProtocol(ma.P_UDP); err == nil {
		c, err := net.ListenPacket("udp", net.JoinHostPort(ip, p))
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
	if p, err := m.ValueForProtocol(ma.P_TCP); err == nil {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, p))
		if err != nil {
			return false
		}
		l.Close()
		return true
	}
	return false
}

// loadPorts reads PortsFile in dir; nothing (and no error) when there is
// none. A damaged file only costs the ports: the caller listens anew.
func loadPorts(dir string) (map[string]int, error) {
	f, err := os.Open(filepath.Join(dir, PortsFile))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	b := make([]byte, maxPortsFile+1)
	n, err := readFull(f, b)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if n > maxPortsFile {
		return nil, fmt.Errorf("p2p: %s is larger than %d bytes", PortsFile, maxPortsFile)
	}
	return parsePorts(b[:n])
}

// parsePorts decodes PortsFile's lines.
func parsePorts(b []byte) (map[string]int, error) {
	out := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		port, err := strconv.Atoi(f[len(f)-1])
		if len(f) != 2 || err != nil || port < 1 || port > 65535 {
			return nil, fmt.Errorf("p2p: %s line %d: want \"listen-address port\"", PortsFile, line)
		}
		if _, ok := withPort(f[0], port); !ok {
			return nil, fmt.Errorf("p2p: %s line %d: %q has no port 0 to replace", PortsFile, line, f[0])
		}
		out[f[0]] = port
	}
	return out, sc.Err()
}

// savePorts records, for each port-0 address of listen, the port bound
// for it (among bound, the node's listen addresses now).
func savePorts(dir string, listen []string, bound []ma.Multiaddr) error {
	var b strings.Builder
	for _, a := range listen {
		for _, m := range bound {
			port, ok := portOf(m)
			if !ok {
				continue
			}
			if s, ok := withPort(a, port); ok && s == m.String() {
				fmt.Fprintf(&b, "%s %d\n", a, port)
				break
			}
		}
	}
	if b.Len() == 0 {
		return nil
	}
	return atomicfile.WriteFile(filepath.Join(dir, PortsFile), []byte(b.String()), 0o644)
}

// portOf is m's UDP or TCP port.
func portOf(m ma.Multiaddr) (int, bool) {
	for _, p := range []int{ma.P_UDP, ma.P_TCP} {
		if v, err := m.ValueForProtocol(p); err == nil {
			n, err := strconv.Atoi(v)
			return n, err == nil
		}
	}
	return 0, false
}
