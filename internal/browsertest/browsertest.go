// Package browsertest drives the system's headless Chromium from Go tests
// (through chromedp): start a browser, wait for a JavaScript condition,
// evaluate an expression, collect console errors, save a screenshot. A test
// that finds no Chromium is skipped with a reason (Debian: apt-get install
// chromium; scripts/test.sh installs it).
//
// It is test support only: no production code imports it.
package browsertest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// ChromiumPath returns the system Chromium, or "" when none is installed.
func ChromiumPath() string {
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Start starts a headless Chromium for the test (skipping the test
// when none is installed) and returns the context of its first tab. The
// browser stops at the end of the test.
func Start(t testing.TB) context.Context {
	t.Helper()
	path := ChromiumPath()
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

// WatchConsole collects the page's console errors and uncaught exceptions
// (CSP violations included); call the returned func to read them.
func WatchConsole(ctx context.Context) func() []string {
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

// WaitJS waits until the JavaScript expression is truthy in the page, and
// fails the test with the page's text when it is not within timeout.
func WaitJS(t testing.TB, ctx context.Context, expr string, timeout time.Duration) {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, timeout+time.Second)
	defer cancel()
	_, err := chromedp.Run(cctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
	if err != nil {
		text, _ := EvalJS[string](ctx, `document.body ? document.body.innerText : ""`)
		t.Fatalf("waiting for %s: %v\npage text:\n%s", expr, err, text)
	}
}

// EvalJS evaluates a JavaScript expression in the page.
func EvalJS[T any](ctx context.Context, expr string) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return chromedp.Run(cctx, chromedp.Evaluate[T](expr))
}

// Screenshot saves a PNG of the whole page as name.png in
// $SKEIN_SCREENSHOT_DIR (or the test's temporary directory) and logs the path.
func Screenshot(t testing.TB, ctx context.Context, name string) string {
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
