package status

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"net/http"
	"path"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

//go:embed web
var webFS embed.FS

// Limits and timings of the HTTP surface.
const (
	DefaultMaxStreams  = 256                    // concurrent SSE clients; more get 503
	defaultMinPush     = 500 * time.Millisecond // at most two snapshots a second per SSE client
	defaultHeartbeat   = 15 * time.Second       // SSE comment lines that keep proxies from closing the stream
	defaultRefresh     = 5 * time.Second        // rebuild for membership and freshness changes nobody notified
	streamWriteLimit   = 10 * time.Second       // a stream write that takes longer drops the client
	statusMaxAge       = time.Second            // /api/status and /metrics reuse a snapshot this long
	historyLimit       = 500                    // default rounds per /api/history page
	maxHistoryRequests = 4                      // /api/history requests served at once; 503 beyond
	historyMaxLimit    = 5000                   // largest limit accepted
)

// contentSecurityPolicy allows the page's own scripts, styles and API only.
const contentSecurityPolicy = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Option configures a Server.
type Option func(*options)

type options struct {
	log        *slog.Logger
	now        func() time.Time
	maxStreams int
	minPush    time.Duration
	heartbeat  time.Duration
	refresh    time.Duration
	pipeline   func() *Pipeline
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// WithClock sets the clock snapshots are computed at (tests).
func WithClock(now func() time.Time) Option {
	return func(o *options) {
		if now != nil {
			o.now = now
		}
	}
}

// WithPipeline shows a staged run's pipeline (Pipeline): f is called while
// a snapshot is built, under the same contract as the members callback
// (fast, no network, no calls into Server); nil from f shows none. Call
// Notify when it changes.
func WithPipeline(f func() *Pipeline) Option {
	return func(o *options) { o.pipeline = f }
}

// WithMaxStreams bounds the concurrent SSE clients (default 256); n < 1 keeps
// the default.
func WithMaxStreams(n int) Option {
	return func(o *options) {
		if n >= 1 {
			o.maxStreams = n
		}
	}
}

// WithStreamTiming sets the least time between two snapshots pushed to one
// SSE client (default 500 ms), the heartbeat period (15 s) and how often a
// stream rebuilds the snapshot without a notification to pick up membership
// changes and reports growing old (5 s). Non-positive values keep the default.
func WithStreamTiming(minPush, heartbeat, refresh time.Duration) Option {
	return func(o *options) {
		if minPush > 0 {
			o.minPush = minPush
		}
		if heartbeat > 0 {
			o.heartbeat = heartbeat
		}
		if refresh > 0 {
			o.refresh = refresh
		}
	}
}

// Server serves the status page, the JSON API, the SSE stream and the
// metrics of one run. It is an http.Handler; it only reads.
type Server struct {
	store   *Store
	info    RunInfo
	members func() []Member
	opt     options
	mux     *http.ServeMux
	static  map[string]asset

	refused atomic.Uint64 // CountRefused
	streams atomic.Int64  // open SSE streams
	// history bounds the /api/history requests served at once.
	history chan struct{}

	done      chan struct{}
	closeOnce sync.Once

	notifyMu  sync.Mutex
	notifyGen uint64
	notifyCh  chan struct{}

	cacheMu sync.Mutex // held while building, so concurrent callers share one build
	cache   *built
}

// built is one encoded snapshot.
type built struct {
	storeGen, notifyGen uint64
	at                  time.Time
	snap                Snapshot
	body                []byte // JSON
	content             uint64 // hash of the JSON without Now: did anything change?
}

type asset struct {
	data        []byte
	contentType string
	etag        string
}

// NewServer returns the handler for a run's status. members lists the live
// members (nil: unknown). Close it, or Shutdown the http.Server from
// HTTPServer, to end the open SSE streams.
func NewServer(store *Store, info RunInfo, members func() []Member, opts ...Option) *Server {
	o := options{log: slog.New(slog.DiscardHandler), now: time.Now, maxStreams: DefaultMaxStreams,
		minPush: defaultMinPush, heartbeat: defaultHeartbeat, refresh: defaultRefresh}
	for _, opt := range opts {
		opt(&o)
	}
	s := &Server{store: store, info: info, members: members, opt: o, done: make(chan struct{}),
		notifyCh: make(chan struct{}), static: loadAssets(), history: make(chan struct{}, maxHistoryRequests)}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{s})
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("GET /{$}", s.servePage)
	s.mux.HandleFunc("GET /static/{file}", s.serveStatic)
	s.mux.HandleFunc("GET /api/status", s.serveStatus)
	s.mux.HandleFunc("GET /api/history", s.serveHistory)
	s.mux.HandleFunc("GET /api/events", s.serveEvents)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(o.log.Handler(), slog.LevelWarn), MaxRequestsInFlight: 8, Timeout: 10 * time.Second}))
	return s
}

func loadAssets() map[string]asset {
	types := map[string]string{".html": "text/html; charset=utf-8", ".css": "text/css; charset=utf-8",
		".js": "text/javascript; charset=utf-8", ".svg": "image/svg+xml"}
	out := make(map[string]asset)
	entries, err := fs.ReadDir(webFS, "web")
	if err != nil {
		panic(err) // embedded at build time
	}
	for _, e := range entries {
		data, err := webFS.ReadFile("web/" + e.Name())
		if err != nil {
			panic(err)
		}
		sum := sha256.Sum256(data)
		out[e.Name()] = asset{data: data, contentType: types[path.Ext(e.Name())],
			etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
	}
	return out
}

// ServeHTTP sets the security headers, refuses every method but GET and
// HEAD, and routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "read-only: GET and HEAD only", http.StatusMethodNotAllowed)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// HTTPServer returns an http.Server for s on addr with its timeouts set:
// 5 s to read the request header, 10 s for the whole request, 30 s to write
// a response (SSE streams extend their own deadline write by write, 10 s
// each), 120 s for an idle keep-alive connection, 16 KiB of headers. Its
// Shutdown closes s, which ends the SSE streams.
func (s *Server) HTTPServer(addr string) *http.Server {
	hs := &http.Server{
		Addr:              addr,
		Handler:           s,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(s.opt.log.Handler(), slog.LevelWarn),
	}
	hs.RegisterOnShutdown(s.Close)
	return hs
}

// Close ends the open SSE streams; the other routes keep working.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.done) })
}

// Notify tells the SSE streams that something outside the store changed
// (membership). Record and RecordEvent notify by themselves.
func (s *Server) Notify() {
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	s.notifyGen++
	close(s.notifyCh)
	s.notifyCh = make(chan struct{})
}

func (s *Server) notified() (uint64, <-chan struct{}) {
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()
	return s.notifyGen, s.notifyCh
}

// CountRefused counts a report that the bootstrap refused before it reached
// the store (skein_run_reports_refused_total; the store's own refusals are
// counted there too).
func (s *Server) CountRefused() { s.refused.Add(1) }

// Snapshot returns the current snapshot (built at most a second ago).
func (s *Server) Snapshot() (Snapshot, error) {
	b, err := s.current(statusMaxAge)
	if err != nil {
		return Snapshot{}, err
	}
	return b.snap, nil
}

// current returns a snapshot built after the latest change and at most
// maxAge ago, building one if needed.
func (s *Server) current(maxAge time.Duration) (*built, error) {
	sg := s.store.generation()
	ng, _ := s.notified()
	s.cacheMu.Lock()
	defer s.cacheMu.Unlock()
	now := s.opt.now()
	if c := s.cache; c != nil && c.storeGen == sg && c.notifyGen == ng {
		if age := now.Sub(c.at); age >= 0 && age < maxAge {
			return c, nil
		}
	}
	snap, err := s.store.Snapshot(s.info, s.members, now)
	if err != nil {
		return nil, err
	}
	if s.opt.pipeline != nil {
		snap.Pipeline = s.opt.pipeline().bounded()
	}
	body, err := json.Marshal(snap)
	if err != nil {
		return nil, fmt.Errorf("status: encode snapshot: %w", err)
	}
	timeless := snap
	timeless.Now = time.Time{}
	content, err := json.Marshal(timeless)
	if err != nil {
		return nil, fmt.Errorf("status: encode snapshot: %w", err)
	}
	h := fnv.New64a()
	h.Write(content)
	s.cache = &built{storeGen: sg, notifyGen: ng, at: now, snap: snap, body: body, content: h.Sum64()}
	return s.cache, nil
}

func (s *Server) servePage(w http.ResponseWriter, r *http.Request) {
	s.serveAsset(w, r, "index.html")
}

func (s *Server) serveStatic(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	if name == "index.html" {
		http.NotFound(w, r)
		return
	}
	s.serveAsset(w, r, name)
}

func (s *Server) serveAsset(w http.ResponseWriter, r *http.Request, name string) {
	a, ok := s.static[name]
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", a.contentType)
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("ETag", a.etag)
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(a.data))
}

func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) {
	b, err := s.current(statusMaxAge)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSONBytes(w, http.StatusOK, b.body)
}

// historyPage is the body of GET /api/history.
type historyPage struct {
	Rounds        []RoundStats `json:"rounds"`
	NextFromRound *uint64      `json:"next_from_round,omitempty"` // from_round of the next page; absent on the last
}

func (s *Server) serveHistory(w http.ResponseWriter, r *http.Request) {
	select {
	case s.history <- struct{}{}:
		defer func() { <-s.history }()
	default:
		writeError(w, http.StatusServiceUnavailable, "too many history requests at once; try again")
		return
	}
	q := r.URL.Query()
	var from uint64
	if v := q.Get("from_round"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("from_round %q: not a round number", trimParam(v)))
			return
		}
		from = n
	}
	limit := historyLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > historyMaxLimit {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q: want 1 to %d", trimParam(v), historyMaxLimit))
			return
		}
		limit = n
	}
	rounds, err := s.store.History(from, limit+1)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	for i := range rounds {
		rounds[i].setParams(s.info.ParamCount)
	}
	page := historyPage{Rounds: rounds}
	if len(rounds) > limit {
		page.NextFromRound = ptr(rounds[limit].Round)
		page.Rounds = rounds[:limit]
	}
	body, err := json.Marshal(page)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSONBytes(w, http.StatusOK, body)
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	s.opt.log.Warn("status: request failed", "path", r.URL.Path, "err", err)
	writeError(w, http.StatusServiceUnavailable, "history unavailable")
}

func trimParam(v string) string { return cleanString(v, 32) }

func writeError(w http.ResponseWriter, code int, msg string) {
	body, _ := json.Marshal(map[string]string{"error": msg})
	writeJSONBytes(w, code, body)
}

func writeJSONBytes(w http.ResponseWriter, code int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Access-Control-Allow-Origin", "*") // public, read-only, no credentials
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(code)
	w.Write(body)
	w.Write([]byte{'\n'})
}
