package demo

import (
	"net"
	"testing"
)

func TestPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if busy, alt := portInUse(ln.Addr().String()); !busy || alt != "127.0.0.1:0" {
		t.Fatalf("busy port: %v, %q", busy, alt)
	}
	ln2, _ := net.Listen("tcp", "127.0.0.1:0")
	free := ln2.Addr().String()
	ln2.Close()
	if busy, alt := portInUse(free); busy || alt != free {
		t.Fatalf("free port: %v, %q", busy, alt)
	}
	if busy, _ := portInUse("127.0.0.1:0"); busy {
		t.Fatal("port 0 reported busy")
	}
}

// The volunteers' command line carries --device when one is set, and
// leaves node join's default otherwise.
func TestJoinArgsDevice(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Dir = t.TempDir()
	has := func(args []string) string {
		for i, a := range args {
			if a == "--device" && i+1 < len(args) {
				return args[i+1]
			}
		}
		return ""
	}
	if d := has(cfg.joinArgs("addr", "volunteer-1", nil)); d != "" {
		t.Fatalf("no device set, but --device %q", d)
	}
	cfg.Device = "cuda:1,flash"
	if d := has(cfg.joinArgs("addr", "volunteer-1", nil, "--hostile", "scale")); d != "cuda:1,flash" {
		t.Fatalf("--device %q, want cuda:1,flash", d)
	}
}
