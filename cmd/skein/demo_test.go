package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/internal/browsertest"
)

// demoProc is `skein demo` started by a test, its output collected.
type demoProc struct {
	cmd *exec.Cmd
	out *syncWriter
	dir string
}

// startDemo builds the binary and starts a small, fast demo: 2 volunteers,
// 5 inner steps per round, a few packages of the Go sources as the corpus,
// links emulated at 200 Mbit/s and 5 ms.
func startDemo(t *testing.T) *demoProc {
	t.Helper()
	return startDemoWith(t, "--volunteers", "2", "--duration", "4m")
}

// startDemoWith starts the small, fast demo with extra flags.
func startDemoWith(t *testing.T, extra ...string) *demoProc {
	t.Helper()
	root, err := data.GoRoot()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "skein")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	d := &demoProc{out: &syncWriter{w: &bytes.Buffer{}}, dir: filepath.Join(dir, "run")}
	args := append([]string{"demo", "--inner-steps", "5", "--http", "127.0.0.1:0",
		"--rate", "200", "--latency", "5ms", "--threads", "1", "--dir", d.dir,
		"--corpus", filepath.Join(root, "src", "strings"), "--corpus", filepath.Join(root, "src", "bufio")}, extra...)
	d.cmd = exec.Command(bin, args...)
	d.cmd.Stdout, d.cmd.Stderr = d.out, d.out
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.cmd.Process.Kill()
		d.cmd.Wait()
	})
	return d
}

// wait returns the first group of re in the demo's output, failing the
// test after timeout.
func (d *demoProc) wait(t *testing.T, re *regexp.Regexp, timeout time.Duration) string {
	t.Helper()
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if m := re.FindStringSubmatch(d.out.String()); m != nil {
			return m[len(m)-1]
		}
	}
	t.Fatalf("the demo never printed %s; its output:\n%s", re, d.out)
	return ""
}

// processesUnder lists the live processes whose command line mentions dir.
func processesUnder(dir string) []string {
	var found []string
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(dir)) {
			found = append(found, strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return found
}

// waitNoProcesses fails the test when processes mentioning dir outlive timeout.
func waitNoProcesses(t *testing.T, dir string, timeout time.Duration) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if left = processesUnder(dir); len(left) == 0 {
			return
		}
	}
	t.Fatalf("orphan processes left:\n%s", strings.Join(left, "\n"))
}

// TestDemoStatusPageInBrowser runs `skein demo` and watches its status page
// in headless Chromium: the members and a loss curve with data appear, the
// page updates live, and a screenshot is saved. Then Ctrl-C stops every
// child and the demo prints its summary.
func TestDemoStatusPageInBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a demo: a bootstrap and two volunteers")
	}
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skip("needs /proc to check for orphan processes")
	}
	ctx := browsertest.Start(t) // skips, with the reason, where no Chromium is installed
	consoleErrors := browsertest.WatchConsole(ctx)
	d := startDemo(t)
	url := d.wait(t, regexp.MustCompile(`status page: (\S+)`), 60*time.Second)
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	// The bootstrap and both volunteers, and a curve of two rounds or more.
	browsertest.WaitJS(t, ctx, `document.querySelectorAll('#members tbody tr').length >= 3 &&
		+document.getElementById('loss-chart').dataset.trainPoints >= 2 &&
		document.getElementById('conn-text').textContent === 'live'`, 150*time.Second)
	round, err := browsertest.EvalJS[string](ctx, `document.getElementById('stat-round').textContent`)
	if err != nil {
		t.Fatal(err)
	}
	r, err := strconv.Atoi(strings.TrimSpace(round))
	if err != nil || r < 1 {
		t.Fatalf("round on the page %q", round)
	}
	if _, err := browsertest.EvalJS[chromedp.Void](ctx, `window.__sameDocument = true`); err != nil {
		t.Fatal(err)
	}
	browsertest.WaitJS(t, ctx, `+document.getElementById('stat-round').textContent > `+strconv.Itoa(r), 90*time.Second)
	if same, err := browsertest.EvalJS[bool](ctx, `window.__sameDocument === true`); err != nil || !same {
		t.Errorf("the page reloaded instead of updating live (%v)", err)
	}
	if errs := consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
	browsertest.Screenshot(t, ctx, "demo-status-page")

	// Ctrl-C: every child stops and the demo summarizes the run.
	d.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("demo exited with %v:\n%s", err, d.out)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("demo did not stop 60 s after Ctrl-C:\n%s", d.out)
	}
	out := d.out.String()
	for _, want := range []string{"summary after", "validation loss", "fp32 data-parallel would send", "bits/param a round", "first step", "computing"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	waitNoProcesses(t, d.dir, 5*time.Second)
}

// TestDemoChildrenDieWithIt: kill -9 of the demo leaves no child behind.
func TestDemoChildrenDieWithIt(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a demo")
	}
	if _, err := os.Stat("/proc/self/cmdline"); err != nil {
		t.Skip("needs /proc to check for orphan processes")
	}
	d := startDemo(t)
	d.wait(t, regexp.MustCompile(`(starting 2 volunteers)`), 60*time.Second)
	for deadline := time.Now().Add(30 * time.Second); len(processesUnder(d.dir)) < 4; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("children not running: %q\n%s", processesUnder(d.dir), d.out)
		}
	}
	d.cmd.Process.Kill()
	d.cmd.Wait()
	waitNoProcesses(t, d.dir, 10*time.Second)
}

// TestDemoChaos is the chaos soak in CI: three honest volunteers, one of
// them killed -9 and restarted every 35 s, one paused as a straggler in
// between, and a hostile volunteer forging its aggregates throughout. The
// demo checks the run's invariants itself and fails if one broke; the test
// also wants kills to have happened, the forger to have been caught, and no
// process left behind.
func TestDemoChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("a 2-minute chaos soak")
	}
	chaosSoak(t, "forge")
}

// TestDemoChaosLoneJump: the same soak with a volunteer that announces each
// round one ahead of the run, with weights of its own under their true hash
// and a certificate it signed alone (issue [1/4]: honest members followed
// such a lone jump within two rounds). The honest ones must never take it,
// and must name it.
func TestDemoChaosLoneJump(t *testing.T) {
	if testing.Short() {
		t.Skip("a 2-minute chaos soak")
	}
	chaosSoak(t, "lonejump")
}

func chaosSoak(t *testing.T, hostile string) {
	d := startDemoWith(t, "--volunteers", "3", "--duration", "130s", "--chaos", "--chaos-every", "35s",
		"--chaos-pause", "8s", "--hostile", hostile)
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("chaos demo failed: %v\n%s", err, d.out)
		}
	case <-time.After(6 * time.Minute):
		t.Fatalf("chaos demo did not end:\n%s", d.out)
	}
	out := d.out.String()
	t.Log(out)
	m := regexp.MustCompile(`chaos: (\d+) kill -9 \((\d+) restarted\), (\d+) pauses`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no chaos report:\n%s", out)
	}
	if kills, _ := strconv.Atoi(m[1]); kills < 2 {
		t.Fatalf("only %d kills", kills)
	}
	if !strings.Contains(out, "logged the hostile one") {
		t.Fatalf("the hostile volunteer (%s) was never caught:\n%s", hostile, out)
	}
	if strings.Count(out, "  ok   ") < 5 || strings.Contains(out, "FAIL") {
		t.Fatalf("invariants:\n%s", out)
	}
	waitNoProcesses(t, d.dir, 10*time.Second)
}
