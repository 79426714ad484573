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
