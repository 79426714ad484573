package status

// The status page in headless Chromium: live data, a drawn loss curve, live
// updates without reload, and a screenshot. The helpers (chromiumPath,
// startBrowser, watchConsole, waitJS, evalJS, screenshot) depend on nothing
// else in this package, so a multi-process test can copy them.

import (
	"context"
	"fmt"
	"math"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/skein-ml/skein/bootstrap/telemetry"
)

// chromiumPath returns the system Chromium, or "" when none is installed.
func chromiumPath() string {
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// startBrowser starts a headless Chromium for the test (skipping the test
// when none is installed) and returns the context of its first tab. The
// browser stops at the end of the test.
func startBrowser(t testing.TB) context.Context {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		t.Skip("browser test skipped: no Chromium at /usr/bin/chromium or on PATH (Debian: apt-get install chromium)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser to exit, before TempDir is removed
	})
	// The first Run starts the browser; it must not carry a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	return ctx
}

// watchConsole collects the page's console errors and uncaught exceptions
// (CSP violations included); call the returned func to read them.
func watchConsole(ctx context.Context) func() []string {
	var mu sync.Mutex
	var errs []string
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				mu.Lock()
				errs = append(errs, m.String())
				mu.Unlock()
			}
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), errs...)
	}
}

// waitJS waits until the JavaScript expression is truthy in the page, and
// fails the test with the page's text when it is not within timeout.
func waitJS(t testing.TB, ctx context.Context, expr string, timeout time.Duration) {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, timeout+time.Second)
	defer cancel()
	_, err := chromedp.Run(cctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
	if err != nil {
		text, _ := evalJS[string](ctx, `document.body ? document.body.innerText : ""`)
		t.Fatalf("waiting for %s: %v\npage text:\n%s", expr, err, text)
	}
}

// evalJS evaluates a JavaScript expression in the page.
func evalJS[T any](ctx context.Context, expr string) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return chromedp.Run(cctx, chromedp.Evaluate[T](expr))
}

// screenshot saves a PNG of the whole page as name.png in
// $SKEIN_SCREENSHOT_DIR (or the test's temporary directory) and logs the path.
func screenshot(t testing.TB, ctx context.Context, name string) string {
	t.Helper()
	dir := os.Getenv("SKEIN_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(cctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	return path
}

// fakeSwarm feeds the store like a small run would: members with their own
// devices and throughput, one outer round at a time.
type fakeSwarm struct {
	t     testing.TB
	store *Store
	peers []string
	round uint64
}

var fakeDevices = []string{"cuda: NVIDIA RTX 4090", "cpu (16 threads)", "cuda: NVIDIA A100 80GB", "cpu (8 threads)"}

func (f *fakeSwarm) members() []Member {
	var out []Member
	for i, p := range f.peers {
		out = append(out, Member{Peer: p, Role: "trainer", Device: fakeDevices[i%len(fakeDevices)], Round: f.round,
			StateHash: (f.round + 1) * 0x9e3779b97f4a7c15})
	}
	return out
}

// rounds records n more rounds from every member, ending now.
func (f *fakeSwarm) rounds(n int) {
	end := time.Now()
	for k := range n {
		f.round++
		r := f.round
		at := end.Add(-time.Duration(n-1-k) * 20 * time.Second)
		for i, p := range f.peers {
			val := float32(math.NaN())
			if i == 0 || r%3 == 0 {
				val = float32(1.45 + 2.8*math.Exp(-float64(r)/6) + 0.02*float64(i))
			}
			hash := (r + 1) * 0x9e3779b97f4a7c15
			if i == len(f.peers)-1 && r%4 == 0 {
				hash ^= 1 // a member out of step now and then
			}
			rep := telemetry.Report{
				Round: r, StateHash: hash,
				TrainLoss:    float32(1.35 + 2.9*math.Exp(-float64(r)/5) + 0.05*math.Sin(float64(r*7+uint64(i)))),
				ValLoss:      val,
				Tokens:       uint64(120_000 * (i + 1)),
				TokensPerSec: 6000 * float64(i+1),
				BytesSent:    16_700_000, BytesRecv: 16_500_000, // int8 pseudo-gradients of 12.6M parameters
				ComputeSeconds: 18, WallSeconds: 20,
				Members: len(f.peers), Device: fakeDevices[i%len(fakeDevices)], Version: "v0.4.0",
				UnixMS: at.UnixMilli(),
			}
			if err := f.store.Record(p, rep, at.Add(time.Duration(i)*time.Millisecond)); err != nil {
				f.t.Fatalf("record round %d: %v", r, err)
			}
		}
	}
}

func TestBrowserStatusPage(t *testing.T) {
	ctx := startBrowser(t)
	consoleErrors := watchConsole(ctx)

	s, _ := openStore(t, testConfig())
	swarm := &fakeSwarm{t: t, store: s}
	for i := range 3 {
		swarm.peers = append(swarm.peers, fmt.Sprintf("12D3KooW%s%02dNodeQm7xKpV4cZbWnS2dEuFy9", []string{"Hx3q", "Lm8v", "Rt2c"}[i], i))
	}
	start := time.Now().Add(-20 * time.Minute)
	for i, p := range swarm.peers {
		if err := s.RecordEvent(Event{At: start.Add(time.Duration(i) * 40 * time.Second), Peer: p, Kind: Join, Role: "trainer", Device: fakeDevices[i]}); err != nil {
			t.Fatal(err)
		}
	}
	late := "12D3KooWZz9LateJoinerPeerXq4sT8uVwY"
	for _, e := range []Event{{Peer: late, Kind: Join, Role: "trainer", Device: "cpu (4 threads)"}, {Peer: late, Kind: Fail}} {
		e.At = time.Now().Add(-5 * time.Minute)
		if err := s.RecordEvent(e); err != nil {
			t.Fatal(err)
		}
	}
	swarm.rounds(12)

	info := RunInfo{RunID: "shakespeare-demo", ManifestHash: "9f2c41d07be35a6e", Preset: "gpt-small", ParamCount: 12_582_912,
		InnerSteps: 500, Optimizer: "diloco", BootstrapAddrs: []string{"/dns4/boot.skein.example/udp/4001/quic-v1"}, Started: start}
	srv := NewServer(s, info, swarm.members, WithStreamTiming(100*time.Millisecond, 15*time.Second, time.Second))
	ts := httptest.NewServer(srv) // 127.0.0.1
	t.Cleanup(ts.Close)
	t.Cleanup(srv.Close)

	if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, `document.querySelectorAll('#members tbody tr').length === 3 &&
		+document.getElementById('loss-chart').dataset.trainPoints === 12 &&
		document.getElementById('conn-text').textContent === 'live'`, 10*time.Second)
	for _, c := range []struct{ expr, want string }{
		{`document.getElementById('stat-round').textContent`, "12"},
		{`[...document.querySelectorAll('#members tbody tr code')].map(e => e.textContent).join(' ')`, "Hx3q00No"},
		{`document.querySelector('#timeline li').textContent`, "failed"},
		{`document.getElementById('stat-saved').textContent`, "less"},
	} {
		got, err := evalJS[string](ctx, c.expr)
		if err != nil || !strings.Contains(got, c.want) {
			t.Errorf("%s = %q (%v), want it to contain %q", c.expr, got, err, c.want)
		}
	}
	length, err := evalJS[float64](ctx, `document.querySelector('#loss-chart path.line.train').getTotalLength()`)
	if err != nil || length < 200 {
		t.Errorf("train curve is %v px long (%v)", length, err)
	}

	// Live: more rounds arrive; the same page (no reload) shows them.
	if _, err := evalJS[chromedp.Void](ctx, `window.__sameDocument = true`); err != nil {
		t.Fatal(err)
	}
	swarm.rounds(4)
	srv.Notify() // the member list moved to round 16
	waitJS(t, ctx, `document.getElementById('stat-round').textContent === '16' &&
		+document.getElementById('loss-chart').dataset.trainPoints === 16`, 10*time.Second)
	if same, err := evalJS[bool](ctx, `window.__sameDocument === true`); err != nil || !same {
		t.Errorf("the page reloaded instead of updating live (%v)", err)
	}
	if errs := consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
	waitJS(t, ctx, `!document.getAnimations().some(a => a.animationName === 'flash')`, 5*time.Second)
	screenshot(t, ctx, "status-page")

	// A phone-sized viewport.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2))); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, `document.getElementById('loss-chart').getBoundingClientRect().width < 390`, 5*time.Second)
	screenshot(t, ctx, "status-page-narrow")
}
