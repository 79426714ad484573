package node

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skein-ml/skein/bootstrap"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// The doctor against a real bootstrap of a shards run: it joins as an
// observer, every check but reachability passes on loopback (no public
// address there), and a --max-memory below the run's need fails the memory
// check, which makes the report an error.
func TestDoctor(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a bootstrap and times training steps")
	}
	m, root := smallRun(t, "doctor-test")
	m.Data.Source = manifest.SourceShards
	ctx, cancel := context.WithTimeout(context.Background(), p2ptest.Slowdown*2*time.Minute)
	defer cancel()
	info, _ := startBootstrap(ctx, t, bootstrap.Config{Manifest: m, Corpus: []string{filepath.Join(root, "src", "strings")}})
	cfg := DoctorConfig{Bootstrap: info.Addrs[:1], Listen: []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, Timing: testTiming(), Threads: 1, BenchSteps: 1}
	checks, err := Doctor(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, c := range checks {
		status[c.Name] = c.Status
	}
	for _, name := range []string{"bootstrap", "manifest", "connection", "latency", "clock", "device", "memory"} {
		if status[name] != CheckPass {
			t.Errorf("%s: %q, want pass: %+v", name, status[name], checks)
		}
	}
	if status["download"] == CheckFail || status["download"] == "" || status["reachability"] != CheckWarn {
		t.Errorf("download %q, reachability %q (loopback only)", status["download"], status["reachability"])
	}
	// The bootstrap answered the dial-back request: on loopback it
	// declines (it dials public addresses only), and the report says so.
	for _, c := range checks {
		if c.Name == "reachability" && !strings.Contains(c.Detail, "did not try to dial back") {
			t.Errorf("reachability: %q, want the bootstrap's refusal to dial back a loopback address", c.Detail)
		}
	}
	var report bytes.Buffer
	if err := WriteChecks(&report, checks); err != nil {
		t.Fatalf("%v\n%s", err, report.String())
	}
	cfg.MaxMemoryMiB = 1
	if checks, err = Doctor(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	report.Reset()
	err = WriteChecks(&report, checks)
	if err == nil || !strings.Contains(report.String(), "fail  memory") || !strings.Contains(report.String(), "allowed by --max-memory") {
		t.Fatalf("--max-memory 1: %v\n%s", err, report.String())
	}
	t.Logf("\n%s", report.String())
}
