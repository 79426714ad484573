package bootstrap

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/bootstrap/status"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/telemetry"
)

// startRun runs a bootstrap in this process (a "local" run: nothing to
// pack) with its status page, and returns what it announced.
func startRun(t *testing.T) Info {
	t.Helper()
	return startRunIn(t, t.TempDir())
}

// startRunIn is startRun on data directory dir.
func startRunIn(t *testing.T, dir string) Info {
	t.Helper()
	cfg := DefaultConfig(dir)
	cfg.Manifest = manifest.Default()
	cfg.Manifest.RunID = "bootstrap-test"
	cfg.Listen, cfg.HTTPAddr, cfg.Timing = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, "127.0.0.1:0", p2p.FastTiming()
	ready := make(chan Info, 1)
	cfg.Ready = func(i Info) { ready <- i }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case i := <-ready:
		return i
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("bootstrap not ready after 30 s")
	}
	return Info{}
}

// member joins the run with a role and returns its node.
func member(t *testing.T, info Info, role p2p.Role) *p2p.Node {
	t.Helper()
	nc := p2p.DefaultNodeConfig(info.Manifest.RunID)
	nc.Bootstrap, nc.ListenAddrs, nc.Timing = info.Addrs[:1], []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, p2p.FastTiming()
	nc.Meta.Role = role
	n, err := p2p.NewNode(context.Background(), nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// report sends one telemetry frame of payload from n to the bootstrap.
func report(t *testing.T, n *p2p.Node, info Info, payload []byte) {
	t.Helper()
	id, err := peer.Decode(info.PeerID)
	if err != nil {
		t.Fatal(err)
	}
	fc := p2p.DefaultFrameConfig()
	fc.MaxSize = telemetry.MaxReportSize
	s, err := n.Open(context.Background(), id, p2p.ProtoTelemetry, fc)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WriteFrame(telemetry.FrameType, payload); err != nil {
		t.Fatal(err)
	}
	s.CloseWrite()
	io.Copy(io.Discard, s.Raw()) // until the bootstrap has handled it
	s.Close()
}

func refusedTotal(t *testing.T, info Info) int {
	t.Helper()
	resp, err := http.Get(info.StatusURL + "metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^skein_run_reports_refused_total (\d+)`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no skein_run_reports_refused_total in /metrics:\n%s", body)
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// The bootstrap keeps reports from the run's volunteers only: one from a
// member that is not a volunteer, and a malformed one, are refused and
// counted; a volunteer's lands in the history behind the status page.
func TestTelemetryOnlyFromVolunteers(t *testing.T) {
	info := startRun(t)
	good := telemetry.Report{Round: 1, StateHash: 7, TrainLoss: 5, ValLoss: 4.5, Tokens: 1024, TokensPerSec: 100,
		ComputeSeconds: 1, WallSeconds: 1.2, Members: 1, Device: "cpu", Version: "test", UnixMS: time.Now().UnixMilli()}
	b, err := good.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	observer := member(t, info, p2p.RoleObserver)
	report(t, observer, info, b)
	vol := member(t, info, p2p.RoleVolunteer)
	report(t, vol, info, []byte("not a report"))
	// Memberlist may take a moment to show the volunteer to the bootstrap.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		report(t, vol, info, b)
		s, err := status.Fetch(ctx, info.StatusURL)
		if err != nil {
			t.Fatal(err)
		}
		if s.Reports >= 1 {
			if s.Reports != 1 || s.TokensTrained != 1024 {
				t.Fatalf("history: %d reports, %d tokens; want the volunteer's one report", s.Reports, s.TokensTrained)
			}
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := refusedTotal(t, info); n < 2 {
		t.Fatalf("%d reports refused, want at least 2 (the observer's and the malformed one)", n)
	}
}

// A bootstrap removes the temporary files a crash left in its data
// directory, and only those.
func TestBootstrapRemovesStaleTempFiles(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-time.Hour)
	mk := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, old, old)
		return p
	}
	stale, kept := mk(".run.toml.31337.tmp"), mk("notes.tmp")
	startRunIn(t, dir)
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temporary file kept: %v", err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("%s removed: %v", kept, err)
	}
}

// A staged DiLoCo run is served (the bootstrap places its volunteers); a
// staged run the volunteers cannot run yet is refused at the operator's
// terminal with what to do instead, not by every volunteer one by one.
func TestConfigStagedRuns(t *testing.T) {
	c := DefaultConfig(t.TempDir())
	if err := c.Validate(); err != nil {
		t.Fatalf("default: %v", err)
	}
	c.Manifest.Pipeline.Stages, c.Manifest.Pipeline.SkipRatio = 3, 1.0/3
	if err := c.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "wire.outer") {
		t.Fatalf("staged DiLoCo with the demo's compacted wire: %v, want ErrConfig naming wire.outer", err)
	}
	c.Manifest.UseDense() // a staged run's replicas average every coordinate
	if err := c.Validate(); err != nil {
		t.Fatalf("staged DiLoCo: %v", err)
	}
	c.Manifest.Optimizer.Kind = manifest.KindNoLoCo
	err := c.Validate()
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "skein bench staged") {
		t.Fatalf("staged NoLoCo: %v, want ErrConfig naming where it runs", err)
	}
	c.Manifest.Optimizer.Kind, c.Manifest.Optimizer.Delayed = manifest.KindDiLoCo, true
	if err := c.Validate(); !errors.Is(err, ErrConfig) {
		t.Fatalf("staged delayed DiLoCo: %v, want ErrConfig", err)
	}
}
