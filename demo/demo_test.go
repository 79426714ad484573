package demo

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skein-ml/skein/bootstrap/status"
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

// TestStopMarksKilled: a child that leaves at SIGINT is reported with the
// time it took; one that ignores SIGINT is killed after the wait and
// reported as killed (it used to be reported as having left, since the
// kill ended it before the report's own timer).
func TestStopMarksKilled(t *testing.T) {
	dir := t.TempDir()
	var k children
	for _, c := range []struct{ name, script string }{
		{"bootstrap.log", "exec sleep 30"},
		{"volunteer-1.log", "exec sleep 30"},
		{"volunteer-2.log", `trap "" INT; exec sleep 30`},
	} {
		if _, err := k.start("/bin/sh", filepath.Join(dir, c.name), false, "-c", c.script); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // the trap is set
	var out strings.Builder
	st := k.stopWithin(&out, 300*time.Millisecond, nil)
	want := map[string]bool{"bootstrap.log": false, "volunteer-1.log": false, "volunteer-2.log": true}
	for _, s := range st {
		if s.Killed != want[s.Name] {
			t.Errorf("%s: killed %v, want %v (after %v)", s.Name, s.Killed, want[s.Name], s.After)
		}
	}
	if len(st) != 3 || !strings.Contains(out.String(), "killing them") {
		t.Fatalf("stopped %+v; said %q", st, out.String())
	}
	r := &Result{Stopped: st, Rounds: 1}
	if got := r.Summary(); !strings.Contains(got, "volunteer-2.log did not leave within 15s of Ctrl-C and was killed") {
		t.Fatalf("summary:\n%s", got)
	}
}

// TestStopThenBetween: the summary's snapshot is taken once every
// volunteer has exited and while the bootstrap still runs.
func TestStopThenBetween(t *testing.T) {
	dir := t.TempDir()
	var k children
	var kids []*child
	for _, name := range []string{"bootstrap.log", "volunteer-1.log", "volunteer-2.log"} {
		c, err := k.start("/bin/sh", filepath.Join(dir, name), false, "-c", "exec sleep 30")
		if err != nil {
			t.Fatal(err)
		}
		kids = append(kids, c)
	}
	exited := func(c *child) bool {
		select {
		case <-c.done:
			return true
		default:
			return false
		}
	}
	called := false
	k.stopWithin(io.Discard, 5*time.Second, func() {
		called = true
		if !exited(kids[1]) || !exited(kids[2]) || exited(kids[0]) {
			t.Errorf("between ran with volunteers exited %v %v, bootstrap exited %v", exited(kids[1]), exited(kids[2]), exited(kids[0]))
		}
	})
	if !called || !exited(kids[0]) {
		t.Fatalf("between called %v, bootstrap exited %v", called, exited(kids[0]))
	}
}

// TestAllReported: the first progress line waits while an online
// volunteer has not reported; the bootstrap and members that left do not
// hold it.
func TestAllReported(t *testing.T) {
	vol := func(online bool, tps float64) status.MemberRow {
		return status.MemberRow{Online: online, Role: "volunteer", TokensPerSec: tps}
	}
	tests := []struct {
		name string
		rows []status.MemberRow
		want bool
	}{
		{"all reported", []status.MemberRow{vol(true, 7000), vol(true, 6900)}, true},
		{"one not yet", []status.MemberRow{vol(true, 7000), vol(true, 0)}, false},
		{"the bootstrap reports nothing", []status.MemberRow{{Online: true, Role: "bootstrap"}, vol(true, 7000)}, true},
		{"a member that left", []status.MemberRow{vol(false, 0), vol(true, 7000)}, true},
		{"no members", nil, true},
	}
	for _, tt := range tests {
		if got := allReported(status.Snapshot{Members: tt.rows}); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
