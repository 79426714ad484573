package status

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// newTestServer serves a store fed with rounds 1..5 from 3 peers, with the
// clock at the last report plus a few seconds.
func newTestServer(t *testing.T, opts ...Option) (*Server, *Store) {
	t.Helper()
	s, _ := openStore(t, testConfig())
	feedRun(t, s, 3, 1, 5)
	var clock atomic.Int64
	clock.Store(t0.Add(55 * time.Second).UnixMilli())
	info := RunInfo{RunID: "test-run", ManifestHash: "feedbeefcafe0000", Preset: "tiny", ParamCount: 100_000,
		InnerSteps: 50, Optimizer: "diloco", Started: t0}
	opts = append([]Option{WithClock(func() time.Time { return time.UnixMilli(clock.Load()) })}, opts...)
	srv := NewServer(s, info, liveMembers(0, 1, 2), opts...)
	t.Cleanup(srv.Close)
	return srv, s
}

// serve starts an HTTP server for srv; at cleanup srv closes first, which
// ends its streams, then the HTTP server (which waits for its handlers).
func serve(t *testing.T, srv *Server) *httptest.Server {
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	t.Cleanup(srv.Close)
	return ts
}

func get(t *testing.T, h http.Handler, method, target string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	return rec.Result()
}

func TestServerRoutes(t *testing.T) {
	srv, _ := newTestServer(t)
	for _, c := range []struct {
		method, path string
		code         int
		ctype        string
		body         string
	}{
		{"GET", "/", 200, "text/html; charset=utf-8", `<svg id="loss-chart"`},
		{"HEAD", "/", 200, "text/html; charset=utf-8", ""},
		{"GET", "/static/app.js", 200, "text/javascript; charset=utf-8", "EventSource"},
		{"GET", "/static/style.css", 200, "text/css; charset=utf-8", ":root"},
		{"GET", "/static/favicon.svg", 200, "image/svg+xml", "<svg"},
		{"GET", "/static/index.html", 404, "", ""},
		{"GET", "/static/../store.go", 307, "", ""}, // cleaned by the mux, to a 404
		{"GET", "/static/..%2fstore.go", 404, "", ""},
		{"GET", "/static/", 404, "", ""},
		{"GET", "/nothing", 404, "", ""},
		{"GET", "/api/status", 200, "application/json", `"run_id":"test-run"`},
		{"GET", "/api/history?from_round=2&limit=2", 200, "application/json", `"next_from_round":4`},
		{"GET", "/api/history?limit=0", 400, "application/json", "limit"},
		{"GET", "/api/history?limit=99999", 400, "application/json", "limit"},
		{"GET", "/api/history?from_round=-1", 400, "application/json", "from_round"},
		{"GET", "/metrics", 200, "text/plain", "skein_run_round 5"},
		{"HEAD", "/api/events", 200, "text/event-stream", ""},
		{"POST", "/", 405, "", ""},
		{"POST", "/api/status", 405, "", ""},
		{"PUT", "/api/events", 405, "", ""},
		{"DELETE", "/metrics", 405, "", ""},
		{"OPTIONS", "/", 405, "", ""},
	} {
		resp := get(t, srv, c.method, c.path)
		body, _ := io.ReadAll(resp.Body)
		name := c.method + " " + c.path
		if resp.StatusCode != c.code {
			t.Errorf("%s: %d, want %d (%s)", name, resp.StatusCode, c.code, body)
			continue
		}
		if c.ctype != "" && !strings.HasPrefix(resp.Header.Get("Content-Type"), c.ctype) {
			t.Errorf("%s: Content-Type %q, want %q", name, resp.Header.Get("Content-Type"), c.ctype)
		}
		if !strings.Contains(string(body), c.body) {
			t.Errorf("%s: body lacks %q: %.300s", name, c.body, body)
		}
		if c.method == "HEAD" && len(body) != 0 {
			t.Errorf("%s: %d bytes of body", name, len(body))
		}
		h := resp.Header
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("%s: CSP %q", name, csp)
		}
		if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") != "no-referrer" {
			t.Errorf("%s: security headers %v", name, h)
		}
		if c.code == 405 && h.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: Allow %q", name, h.Get("Allow"))
		}
	}
}

func TestServerStatusJSON(t *testing.T) {
	srv, _ := newTestServer(t)
	resp := get(t, srv, "GET", "/api/status")
	var fields map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&fields); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"run_id", "manifest", "preset", "params", "optimizer", "started", "now", "round",
		"tokens_trained", "val_loss", "tokens_per_sec", "bytes_per_sec", "bytes_sent", "fp32_dp_bytes",
		"traffic_saved", "bits_per_param", "members_online", "members", "curve", "events"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("/api/status lacks %q", k)
		}
	}
	if _, ok := fields["data"]; ok {
		t.Errorf("/api/status of a run without a dataset has \"data\": %v", fields["data"])
	}
	row := fields["members"].([]any)[0].(map[string]any)
	for _, k := range []string{"peer", "online", "role", "device", "tokens_per_sec", "last_seen", "bytes_sent", "bytes_recv", "round", "state_hash", "agreement"} {
		if _, ok := row[k]; !ok {
			t.Errorf("member row lacks %q: %v", k, row)
		}
	}
	body, _ := json.Marshal(fields)
	for _, private := range []string{"/ip4/", "/ip6/", "127.0.0.1", peerID(0)} {
		if strings.Contains(string(body), private) {
			t.Errorf("/api/status shows %q", private)
		}
	}
	var snap Snapshot
	resp = get(t, srv, "GET", "/api/status")
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
		t.Fatal(err)
	}
	if snap.Round != 5 || snap.MembersOnline != 3 || len(snap.Members) != 3 || len(snap.Curve) != 5 || snap.TrafficSaved <= 0 {
		t.Errorf("snapshot %+v", snap)
	}
	// 1 MiB sent a round by each member, 100,000 parameters.
	if b := snap.BitsPerParam; b == nil || *b != 83.8861 || snap.Curve[4].BitsPerParam == nil || *snap.Curve[4].BitsPerParam != 83.8861 {
		t.Errorf("bits/param %s, curve %+v; want 83.8861", ptrString(b), snap.Curve[4])
	}
}

func TestServerHistoryPages(t *testing.T) {
	srv, _ := newTestServer(t)
	var from uint64
	var rounds []uint64
	for range 10 {
		resp := get(t, srv, "GET", "/api/history?limit=2&from_round="+itoa(from))
		var page historyPage
		if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Rounds {
			rounds = append(rounds, r.Round)
			if r.Reporters != 3 || r.TrainLoss == nil || r.ValLoss == nil || r.ValReporters != 1 || r.MajorityHash == "" ||
				r.BitsPerParam == nil || *r.BitsPerParam != 83.8861 {
				t.Errorf("round %+v", r)
			}
		}
		if page.NextFromRound == nil {
			break
		}
		from = *page.NextFromRound
	}
	if len(rounds) != 5 || rounds[0] != 1 || rounds[4] != 5 {
		t.Errorf("paged rounds %v, want 1..5", rounds)
	}
}

func itoa(v uint64) string { b, _ := json.Marshal(v); return string(b) }

func TestServerMetrics(t *testing.T) {
	srv, s := newTestServer(t)
	srv.CountRefused()
	_ = s.Record("bad id", fakeReport(1, 1, 1, 1), t0)
	body, _ := io.ReadAll(get(t, srv, "GET", "/metrics").Body)
	for _, want := range []string{
		"skein_run_round 5", "skein_run_members_online 3", "skein_run_tokens_total 61440",
		"skein_run_reports_total 15", "skein_run_reports_refused_total 2", "skein_run_validation_loss",
		"skein_run_bytes_sent_total", "skein_run_tokens_per_second 3000", "skein_run_bits_per_param 83.8861", `skein_run_info{manifest="feedbeefcafe",optimizer="diloco",preset="tiny",run_id="test-run"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(string(body), "go_goroutines") {
		t.Errorf("/metrics uses the global registry")
	}
}

// sseReader reads "event: snapshot" messages from a stream.
type sseReader struct {
	r     *bufio.Reader
	beats int
}

func (r *sseReader) next() (Snapshot, error) {
	var data string
	for {
		line, err := r.r.ReadString('\n')
		if err != nil {
			return Snapshot{}, err
		}
		line = strings.TrimRight(line, "\n")
		switch {
		case strings.HasPrefix(line, ": "):
			r.beats++
		case strings.HasPrefix(line, "data: "):
			data = line[len("data: "):]
		case line == "" && data != "":
			var s Snapshot
			err := json.Unmarshal([]byte(data), &s)
			return s, err
		}
	}
}

func openStream(t *testing.T, url string) (*http.Response, *sseReader) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", url+"/api/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp, &sseReader{r: bufio.NewReader(resp.Body)}
}

func TestServerEventsStream(t *testing.T) {
	srv, s := newTestServer(t, WithStreamTiming(20*time.Millisecond, 50*time.Millisecond, time.Hour))
	ts := serve(t, srv)
	resp, r := openStream(t, ts.URL)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("%d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	first, err := r.next()
	if err != nil || first.Round != 5 {
		t.Fatalf("first snapshot: round %d, %v", first.Round, err)
	}
	feedRun(t, s, 3, 6, 6)
	for {
		snap, err := r.next()
		if err != nil {
			t.Fatal(err)
		}
		if snap.Round == 6 {
			break
		}
	}
	// Quiet: heartbeats only.
	time.Sleep(150 * time.Millisecond)
	srv.Notify() // nothing changed in content: no new snapshot, but the stream lives
	srv.Close()
	if _, err := r.next(); !errors.Is(err, io.EOF) && err == nil {
		t.Errorf("stream after Close: %v, want EOF", err)
	}
	if r.beats == 0 {
		t.Errorf("no heartbeat seen")
	}
}

func TestServerEventsRateLimit(t *testing.T) {
	srv, s := newTestServer(t, WithStreamTiming(300*time.Millisecond, time.Hour, time.Hour))
	ts := serve(t, srv)
	_, r := openStream(t, ts.URL)
	if _, err := r.next(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	fed := make(chan error, 1)
	go func() { fed <- feedRounds(s, 3, 6, 30) }() // 75 changes as fast as the disk allows
	defer func() {
		if err := <-fed; err != nil {
			t.Error(err)
		}
	}()
	n := 0
	for {
		snap, err := r.next()
		if err != nil {
			t.Fatal(err)
		}
		n++
		if snap.Round == 30 {
			break
		}
	}
	if el := time.Since(start); n > int(el/(300*time.Millisecond))+2 {
		t.Errorf("%d snapshots in %v at one per 300 ms", n, el)
	}
}

func TestServerEventsLimit(t *testing.T) {
	srv, _ := newTestServer(t, WithMaxStreams(1))
	ts := serve(t, srv)
	_, r := openStream(t, ts.URL)
	if _, err := r.next(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(ts.URL + "/api/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("second stream: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

func TestHTTPServerTimeouts(t *testing.T) {
	srv, _ := newTestServer(t)
	hs := srv.HTTPServer("127.0.0.1:0")
	if hs.ReadHeaderTimeout == 0 || hs.ReadTimeout == 0 || hs.WriteTimeout == 0 || hs.IdleTimeout == 0 || hs.MaxHeaderBytes == 0 {
		t.Errorf("timeouts %+v", hs)
	}
	// Shutdown ends open streams instead of waiting for them.
	ln := httptest.NewUnstartedServer(nil).Listener
	go hs.Serve(ln)
	_, r := openStream(t, "http://"+ln.Addr().String())
	if _, err := r.next(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown with an open stream: %v", err)
	}
}

// TestHTTPServerStreamOutlivesTimeouts: a stream lives longer than the
// server's WriteTimeout (it moves its write deadline at every write) and
// ReadTimeout (net/http clears the read deadline for its background read).
func TestHTTPServerStreamOutlivesTimeouts(t *testing.T) {
	srv, s := newTestServer(t, WithStreamTiming(10*time.Millisecond, 50*time.Millisecond, time.Hour))
	hs := srv.HTTPServer("127.0.0.1:0")
	hs.ReadTimeout, hs.WriteTimeout = 100*time.Millisecond, 100*time.Millisecond
	ln := httptest.NewUnstartedServer(nil).Listener
	go hs.Serve(ln)
	defer hs.Close()
	_, r := openStream(t, "http://"+ln.Addr().String())
	if _, err := r.next(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond)
	feedRun(t, s, 3, 6, 6)
	for {
		snap, err := r.next()
		if err != nil {
			t.Fatalf("stream ended after the read and write timeouts: %v", err)
		}
		if snap.Round == 6 {
			break
		}
	}
	if r.beats < 3 {
		t.Errorf("%d heartbeats in 400 ms at one per 50 ms", r.beats)
	}
}

func TestFetchAndFormat(t *testing.T) {
	srv, s := newTestServer(t)
	if err := s.RecordEvent(Event{At: t0, Peer: peerID(0), Kind: Join, Role: "trainer", Device: "cpu"}); err != nil {
		t.Fatal(err)
	}
	ts := serve(t, srv)
	for _, base := range []string{ts.URL, strings.TrimPrefix(ts.URL, "http://"), ts.URL + "/"} {
		snap, err := Fetch(context.Background(), base)
		if err != nil {
			t.Fatalf("Fetch(%q): %v", base, err)
		}
		if snap.RunID != "test-run" || snap.Round != 5 {
			t.Errorf("Fetch(%q): %+v", base, snap)
		}
	}
	snap, _ := Fetch(context.Background(), ts.URL)
	var b strings.Builder
	FormatText(&b, snap)
	out := b.String()
	t.Logf("\n%s", out)
	for _, want := range []string{"run test-run", "round 5", "members online 3", "fake0000", "agree", "x less", "join",
		"received, 83.9 bits/param per round;"} {
		if !strings.Contains(out, want) {
			t.Errorf("FormatText lacks %q", want)
		}
	}
	if strings.Contains(out, "epoch") {
		t.Errorf("FormatText of a run without a dataset mentions an epoch")
	}
	snap.Data = &DataProgress{Epoch: 0, Trained: 0.125}
	b.Reset()
	FormatText(&b, snap)
	if !strings.Contains(b.String(), "\nepoch 0, 12.5% trained\n") {
		t.Errorf("FormatText with data progress:\n%s", b.String())
	}
	for _, c := range []struct {
		bits *float64
		want string
	}{
		{ptr(0.4237), ", 0.42 bits/param per round"},
		{ptr(0.0031), ", 0.0031 bits/param per round"},
		{ptr(0.0), ", 0.00 bits/param per round"},
		{ptr(-1.0), " received\n"}, // a hostile server's: not shown
		{nil, " received\n"},
	} {
		snap.BitsPerParam, snap.TrafficSaved = c.bits, 0
		b.Reset()
		FormatText(&b, snap)
		if !strings.Contains(b.String(), c.want) {
			t.Errorf("FormatText with bits/param %s lacks %q:\n%s", ptrString(c.bits), c.want, b.String())
		}
	}

	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"run_id":"`))
		w.Write([]byte(strings.Repeat("x", MaxSnapshotBytes)))
	}))
	defer big.Close()
	if _, err := Fetch(context.Background(), big.URL); !errors.Is(err, ErrTooLarge) {
		t.Errorf("Fetch of a huge body: %v, want ErrTooLarge", err)
	}
	if _, err := Fetch(context.Background(), ts.URL+"/nothing"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("Fetch of a 404: %v", err)
	}
	if _, err := Fetch(context.Background(), "ftp://x"); err == nil {
		t.Errorf("Fetch of ftp:// succeeded")
	}
}

// The snapshot carries the pipeline WithPipeline gives, with peer IDs
// shortened and everything bounded; without the option there is none.
func TestSnapshotPipeline(t *testing.T) {
	s, _ := openStore(t, testConfig())
	big := fakePipeline()
	for len(big.Paths) <= maxPipelinePaths {
		big.Paths = append(big.Paths, big.Paths[0])
	}
	big.Stages[1].Holds = strings.Repeat("x", 1000) + "\u202e"
	big.Paths[0].Peers = big.Paths[0].Peers[:1] // fewer peers than stages: cut to the shorter
	srv := NewServer(s, RunInfo{RunID: "staged"}, nil, WithPipeline(func() *Pipeline { return big }))
	defer srv.Close()
	b, err := srv.current(0)
	if err != nil {
		t.Fatal(err)
	}
	p := b.snap.Pipeline
	switch {
	case p == nil:
		t.Fatal("no pipeline in the snapshot")
	case len(p.Paths) != maxPipelinePaths || len(p.Stages) != 3 || p.Iteration != 41:
		t.Fatalf("%d paths, %d stages, iteration %d", len(p.Paths), len(p.Stages), p.Iteration)
	case p.Stages[0].Replicas[0] != "Stage0Re" || len(p.Stages[1].Holds) > maxPipelineText || strings.ContainsRune(p.Stages[1].Holds, '\u202e'):
		t.Fatalf("stage rows not cleaned: %+v", p.Stages[:2])
	case len(p.Paths[0].Stages) != 1 || len(p.Paths[0].Peers) != 1:
		t.Fatalf("path 0: %+v", p.Paths[0])
	}
	if !strings.Contains(string(b.body), `"pipeline":{"skip_ratio":0.333`) {
		t.Fatalf("JSON: %s", b.body)
	}
	plain := NewServer(s, RunInfo{RunID: "dp"}, nil)
	defer plain.Close()
	if b, err := plain.current(0); err != nil || b.snap.Pipeline != nil || strings.Contains(string(b.body), "pipeline") {
		t.Fatalf("a run without a pipeline shows one (%v)", err)
	}
}
