// Package bootstrap runs a training run's entry point: the membership seed
// and relay that volunteers join through, the keeper of the run's manifest,
// and the collector of the volunteers' telemetry behind the public status
// page and its JSON/SSE API (bootstrap/status) and Prometheus metrics.
//
// It is never on the training critical path: an outer round completes
// without it, and volunteers join through any member while it is down. It
// must not train, average or touch tensors; cmd/skein only parses flags and
// calls Run.
package bootstrap

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/skein-ml/skein/bootstrap/status"
	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/internal/atomicfile"
	"github.com/skein-ml/skein/internal/dirlock"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/wan"
	"github.com/skein-ml/skein/telemetry"
)

// ErrConfig is returned (wrapped) for invalid settings.
var ErrConfig = errors.New("bootstrap: invalid config")

// Config configures Run.
type Config struct {
	// Manifest is the run: its id, model, optimizer, data. A manifest whose
	// data source is "shards" and lists none gets the shards of Corpus,
	// packed into DataDir/shards at start.
	Manifest manifest.Manifest
	// Corpus is what to pack for a shards run (empty: the Go standard
	// library sources).
	Corpus []string
	// Dataset, if set, is a packed dataset directory (skein data pack): the
	// run trains on it (data.source = "dataset", its shards listed in the
	// manifest) and the bootstrap serves its shards.
	Dataset string
	DataDir string // identity, known peers, shards, history; required, kept across restarts
	// Listen multiaddrs; default QUIC and TCP on port 4001, all IPv4 interfaces.
	Listen []string
	// Advertise is the public ip:port of the QUIC listener when it differs
	// from the listen address (behind a port forward).
	Advertise string
	// HTTPAddr serves the public status page, its JSON/SSE API and
	// /metrics; "" serves none.
	HTTPAddr string
	Timing   p2p.Timing
	// WAN, if set, emulates this link on every QUIC packet sent (demo).
	WAN     *wan.Link
	Version string
	Logger  *slog.Logger
	// Out receives what the operator must see: the addresses to give to
	// volunteers, the status page's URL, and warnings. nil discards.
	Out io.Writer
	// Ready, if set, is called once the server listens.
	Ready func(Info)
	// PlanTiming is how a staged run's placement reacts to membership
	// (zero: DefaultPlanTiming).
	PlanTiming PlanTiming

	// A closed run's bootstrap is a member like any other and needs a join
	// token of role bootstrap for its peer ID (Token), or the run key
	// (RunKey), with which it issues and renews its own. Both are ignored
	// in an open run.
	Token  []byte
	RunKey ed25519.PrivateKey
}

// Info describes a running bootstrap.
type Info struct {
	PeerID string
	// Addrs are the full multiaddrs (with /p2p/<id>) volunteers can join
	// through, the best first.
	Addrs []string
	// StatusURL is the status page's address ("" when HTTPAddr is "").
	StatusURL string
	// Manifest is the run's manifest as served (shards filled in).
	Manifest manifest.Manifest
}

// DefaultConfig returns the demo run (manifest.Demo), WAN timing and the default
// listen addresses.
func DefaultConfig(dataDir string) Config {
	return Config{Manifest: manifest.Demo(), DataDir: dataDir, Timing: p2p.WANTiming()}
}

// Validate names the first invalid field.
func (c Config) Validate() error {
	if err := c.Manifest.ValidateTemplate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err := c.Manifest.CheckStaged(); err != nil {
		// Said here, at the operator's terminal, not by every volunteer
		// that would join and refuse.
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if c.DataDir == "" {
		return fmt.Errorf("%w: a data directory is required (the identity must survive restarts)", ErrConfig)
	}
	if c.Advertise != "" {
		if _, _, err := net.SplitHostPort(c.Advertise); err != nil {
			return fmt.Errorf("%w: advertise address %q: %v", ErrConfig, c.Advertise, err)
		}
	}
	if c.RunKey != nil && c.Manifest.Admission.Mode == manifest.AdmissionClosed {
		pub, ok := c.RunKey.Public().(ed25519.PublicKey)
		if len(c.RunKey) != ed25519.PrivateKeySize || !ok || !pub.Equal(c.Manifest.Admission.RunPublicKey()) {
			return fmt.Errorf("%w: the run key given is not the one admission.run_key names (%s)", ErrConfig, c.Manifest.Admission.RunKey)
		}
	}
	return nil
}

// checkAdmission refuses to start a closed run's bootstrap without a token
// or the run key, saying how to get one for its peer ID.
func (s *server) checkAdmission() error {
	if s.run.Admission.Mode != manifest.AdmissionClosed || s.cfg.RunKey != nil || len(s.cfg.Token) > 0 {
		return nil
	}
	key, err := p2p.LoadOrCreateIdentity(s.cfg.DataDir)
	if err != nil {
		return err
	}
	id, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: run %q is closed, so its bootstrap needs a join token too: give it the run key (--run-key) "+
		"or a token for its peer ID %s (skein token issue --key RUN-KEY --peer %s --run %s --role bootstrap)",
		ErrConfig, s.run.RunID, id, id, s.run.RunID)
}

// server is a running bootstrap.
type server struct {
	cfg    Config
	log    *slog.Logger
	out    io.Writer
	run    manifest.Manifest
	seed   *p2p.Seed
	shards *data.ShardStore
	tokens *data.PackedSource // the packed dataset served (Config.Dataset)
	store  *status.Store
	status *status.Server
	limits reportLimits
	plan   *stagePlanner // a staged run's placement; nil otherwise
	// anchors countersigns a whole-model DiLoCo run's round certificates;
	// nil otherwise (NoLoCo and staged members hold no common state).
	anchors *anchors
}

// Run serves the run until ctx ends, then leaves the membership gracefully.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	s := &server{cfg: cfg, log: cfg.Logger, out: cfg.Out, run: cfg.Manifest}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.out == nil {
		s.out = io.Discard
	}
	lock, err := dirlock.Acquire(cfg.DataDir)
	if err != nil {
		return err
	}
	defer lock.Release()
	// Held by this process alone now: what a crash left half written can go.
	removed, err := atomicfile.RemoveStale(cfg.DataDir, atomicfile.ProcessStart())
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if len(removed) > 0 {
		s.log.Info("removed temporary files left by a crash", "dir", cfg.DataDir, "files", removed)
	}
	if err := s.checkAdmission(); err != nil {
		return err
	}
	if err := s.prepareData(); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(cfg.DataDir, "run.toml"), s.run.Canonical(), 0o644); err != nil {
		return err
	}
	storeCfg := storeConfig(s.run)
	if s.run.Optimizer.Kind == manifest.KindDiLoCo && !s.run.Pipeline.Staged() {
		s.anchors = newAnchors(s.run.RunID, filepath.Join(cfg.DataDir, AnchorFile), s.log)
		storeCfg.Certified = s.anchors.certified
	}
	if s.store, err = status.Open(filepath.Join(cfg.DataDir, "history.db"), storeCfg); err != nil {
		return err
	}
	defer s.store.Close()

	sc := p2p.DefaultSeedConfig(s.run.RunID, cfg.DataDir)
	if len(cfg.Listen) > 0 {
		sc.ListenAddrs = cfg.Listen
	}
	sc.AdvertiseAddr, sc.Version, sc.Logger = cfg.Advertise, cfg.Version, s.log
	sc.Admission = s.run.Admission.Policy()
	if sc.Admission.Closed {
		sc.Token, sc.RunKey = cfg.Token, cfg.RunKey
	}
	if cfg.Timing != (p2p.Timing{}) {
		sc.Timing = cfg.Timing
	}
	if cfg.WAN != nil {
		emu, err := wan.New(*cfg.WAN, uint64(time.Now().UnixNano()))
		if err != nil {
			return err
		}
		sc.ListenUDP = emu.ListenUDP
	}
	if s.seed, err = p2p.NewSeed(ctx, sc); err != nil {
		return err
	}
	defer s.seed.Close()
	info := Info{PeerID: s.seed.ID().String(), Manifest: s.run}
	best := s.seed.FullAddr()
	if best != nil {
		info.Addrs = append(info.Addrs, best.String())
	}
	for _, a := range s.seed.Addrs() {
		if best == nil || !a.Equal(best) {
			info.Addrs = append(info.Addrs, a.String())
		}
	}
	if s.run.Pipeline.Staged() {
		timing := cfg.PlanTiming
		if timing == (PlanTiming{}) {
			timing = DefaultPlanTiming()
		}
		if s.plan, err = newStagePlanner(s.run, s.seed, s.log, s.out, timing); err != nil {
			return err
		}
	}
	if cfg.HTTPAddr != "" {
		stop, url, err := s.serveHTTP(info)
		if err != nil {
			return err
		}
		defer stop()
		info.StatusURL = url
	}
	// The protocols go up once the status server exists: the telemetry
	// handler counts refusals on it.
	if err := s.serve(); err != nil {
		return err
	}
	if s.anchors != nil {
		actx, stop := context.WithCancel(ctx)
		defer stop()
		if err := s.anchors.start(actx, s.seed.Node); err != nil {
			return err
		}
	}
	if s.plan != nil {
		if err := s.plan.serve(); err != nil {
			return err
		}
		if s.status != nil {
			s.plan.notify = s.status.Notify
		}
		pctx, stop := context.WithCancel(ctx)
		defer stop()
		go s.plan.loop(pctx)
	}
	printAddrs(s.out, cfg, info)
	if cfg.Ready != nil {
		cfg.Ready(info)
	}
	return s.watch(ctx)
}

// prepareData fills in the tokenizer's vocabulary hash, packs the corpus
// into shards when the manifest asks for shards and lists none, and checks
// that every listed shard is here to serve.
func (s *server) prepareData() error {
	m := &s.run
	if m.Data.Tokenized() {
		t := m.Data.Tokenizer
		tok, err := data.NewTokenizer(t)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		hash := tok.(data.Named).VocabHash()
		switch {
		case m.Data.TokenizerHash == "":
			m.Data.TokenizerHash = hash
		case m.Data.TokenizerHash != hash:
			return fmt.Errorf("%w: data.tokenizer_hash %s, but this build's %s tokenizer hashes to %s", ErrConfig, m.Data.TokenizerHash, t, hash)
		}
	}
	if s.cfg.Dataset != "" || m.Data.Source == manifest.SourceDataset {
		return s.prepareDataset()
	}
	if m.Data.Source != manifest.SourceShards {
		return nil
	}
	store, err := data.OpenShardStore(filepath.Join(s.cfg.DataDir, "shards"))
	if err != nil {
		return err
	}
	s.shards = store
	if len(m.Data.Shards) == 0 {
		began := time.Now()
		corpus, err := data.OpenPaths(s.cfg.Corpus, m.Data.ValFraction)
		if err != nil {
			return err
		}
		infos, err := data.PackShards(corpus, store.Dir(), m.Data.ShardBytes)
		corpus.Close()
		if err != nil {
			return err
		}
		var total int64
		for _, in := range infos {
			m.Data.Shards = append(m.Data.Shards, manifest.Shard{Hash: in.Hash, Bytes: in.Bytes, Files: in.Files})
			total += in.Bytes
		}
		fmt.Fprintf(s.out, "skein bootstrap: packed the corpus into %d shards, %.1f MB, in %.1fs\n", len(infos),
			float64(total)/1e6, time.Since(began).Seconds())
		if err := m.Validate(); err != nil {
			return fmt.Errorf("%w: after packing: %w", ErrConfig, err)
		}
	}
	for _, sh := range m.Data.Shards {
		if err := store.Verify(data.ShardInfo{Hash: sh.Hash, Bytes: sh.Bytes, Files: sh.Files}); err != nil {
			return fmt.Errorf("%w: manifest lists shard %s, which %s does not hold intact: %w", ErrConfig, sh.Hash,
				store.Dir(), err)
		}
	}
	return nil
}

// prepareDataset opens the packed dataset the run serves and lists its
// shards in the manifest (or checks them against those it lists).
func (s *server) prepareDataset() error {
	m := &s.run
	if s.cfg.Dataset == "" {
		return fmt.Errorf("%w: the manifest trains on a packed dataset (data.source = %q); name its directory with --dataset DIR", ErrConfig, manifest.SourceDataset)
	}
	if m.Pipeline.Staged() {
		return fmt.Errorf("%w: staged runs (pipeline.stages = %d) do not train on packed datasets yet", ErrConfig, m.Pipeline.Stages)
	}
	began := time.Now()
	src, err := data.OpenPackedDir(s.cfg.Dataset)
	if err != nil {
		return fmt.Errorf("%w: --dataset: %w", ErrConfig, err)
	}
	ds := src.Dataset()
	listed := m.Data.Source == manifest.SourceDataset && len(m.Data.Shards) > 0
	if listed {
		want, err := m.Data.Dataset()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		if !slices.Equal(want.Train, ds.Train) || !slices.Equal(want.Validation, ds.Validation) {
			return fmt.Errorf("%w: the manifest lists other shards than the dataset in %s holds", ErrConfig, s.cfg.Dataset)
		}
	}
	if m.Data.Tokenized() && m.Data.TokenizerName() != ds.Tokenizer {
		return fmt.Errorf("%w: the manifest names tokenizer %s, the dataset in %s was packed with %s", ErrConfig, m.Data.TokenizerName(), s.cfg.Dataset, ds.Tokenizer)
	}
	m.Data.SetDataset(ds)
	if err := m.Validate(); err != nil {
		return fmt.Errorf("%w: with the dataset: %w", ErrConfig, err)
	}
	s.tokens = src
	fmt.Fprintf(s.out, "skein bootstrap: serving dataset %s: %s, %d train tokens in %d shards, %d validation tokens (checked in %.1fs)\n",
		s.cfg.Dataset, ds.Tokenizer, ds.SplitTokens(data.Train), len(ds.Train), ds.SplitTokens(data.Validation), time.Since(began).Seconds())
	return nil
}

// serve registers the run's protocols: the manifest, the shards over bulk
// transfer, and telemetry from volunteers.
func (s *server) serve() error {
	canon := s.run.Canonical()
	if err := s.seed.Handle(p2p.ProtoManifest, p2p.MessageFrameConfig(manifest.MaxSize), func(_ context.Context, st *p2p.Stream) error {
		return st.WriteFrame(manifest.FrameType, canon)
	}); err != nil {
		return err
	}
	if s.shards != nil || s.tokens != nil {
		if err := s.seed.ServeBulk(func(_ context.Context, from peer.ID, key string) (io.ReaderAt, int64, error) {
			if _, member := s.seed.Member(from); !member {
				return nil, 0, fmt.Errorf("bootstrap: %s is not a member of run %q", from, s.run.RunID)
			}
			if name, ok := data.ParseTokenKey(key); ok && s.tokens != nil {
				return s.tokens.ReaderAt(name)
			}
			hash, ok := data.ParseShardKey(key)
			ok = ok && s.shards != nil
			if !ok {
				return nil, 0, fmt.Errorf("bootstrap: no bulk key %q", key)
			}
			return s.shards.Open(hash)
		}, 0); err != nil {
			return err
		}
	}
	if err := s.seed.Handle(p2p.ProtoClock, p2p.MessageFrameConfig(8), func(_ context.Context, st *p2p.Stream) error {
		return st.WriteFrame(p2p.ClockFrame, p2p.AppendClock(nil, time.Now()))
	}); err != nil {
		return err
	}
	probes := make(chan struct{}, 2) // upload probes at once: each reads up to p2p.UploadMaxBytes
	if err := s.seed.Handle(p2p.ProtoUploadProbe, p2p.UploadFrameConfig(), func(_ context.Context, st *p2p.Stream) error {
		if _, member := s.seed.Member(st.Peer()); !member {
			return fmt.Errorf("bootstrap: upload probe from %s, not a member of run %q", st.Peer(), s.run.RunID)
		}
		select {
		case probes <- struct{}{}:
			defer func() { <-probes }()
		default:
			return fmt.Errorf("bootstrap: upload probe from %s: two already running", st.Peer())
		}
		return p2p.ServeUploadProbe(st)
	}); err != nil {
		return err
	}
	return s.seed.Handle(p2p.ProtoTelemetry, p2p.MessageFrameConfig(telemetry.MaxReportSize), s.telemetry)
}

// telemetry takes one report: only from a volunteer that is a member of
// the run, well-formed and within the store's bounds.
func (s *server) telemetry(ctx context.Context, st *p2p.Stream) error {
	from := st.Peer()
	if m, ok := s.seed.Member(from); !ok || m.Meta.Role != p2p.RoleVolunteer {
		s.countRefused()
		return fmt.Errorf("bootstrap: telemetry from %s, not a volunteer of this run", from)
	}
	if !s.limits.allow(from, time.Now()) {
		s.countRefused()
		return fmt.Errorf("bootstrap: telemetry from %s faster than %v per report", from, reportInterval)
	}
	typ, b, err := st.ReadFrame()
	if err != nil {
		s.countRefused()
		return err
	}
	var rep telemetry.Report
	if typ != telemetry.FrameType {
		err = fmt.Errorf("%w: frame type %d", telemetry.ErrBadReport, typ)
	} else {
		err = rep.UnmarshalBinary(b)
	}
	if err != nil {
		s.countRefused()
		return err
	}
	if err := s.store.Record(from.String(), rep, time.Now()); err != nil {
		lvl := slog.LevelDebug
		if errors.Is(err, status.ErrRoundAhead) || errors.Is(err, status.ErrTooManyTokens) {
			lvl = slog.LevelInfo // a claim past what the run allows: a liar, or a run that lost most members
		}
		s.log.Log(ctx, lvl, "telemetry refused by the store", "peer", from, "err", err)
		return err
	}
	return nil
}

// storeConfig bounds the history by the manifest: in one round a member
// trains at most H inner steps of batch x seq_len tokens (in a staged run,
// H iterations of all the microbatches).
func storeConfig(m manifest.Manifest) status.StoreConfig {
	c := status.DefaultStoreConfig()
	c.MaxRoundTokens = uint64(m.Optimizer.InnerSteps) * uint64(m.Model.Batch) * uint64(m.SeqLen())
	if m.Pipeline.Staged() {
		c.MaxRoundTokens *= uint64(max(m.Pipeline.Microbatches, 1))
	}
	return c
}

func (s *server) countRefused() {
	if s.status != nil {
		s.status.CountRefused()
	}
}

// members lists the live members for the status page.
func (s *server) members() []status.Member {
	var out []status.Member
	for _, m := range s.seed.Members() {
		out = append(out, status.Member{Peer: m.ID.String(), Role: m.Meta.Role.String(), Device: m.Meta.Device,
			Round: m.Meta.Round, StateHash: m.Meta.StateHash})
	}
	return out
}

// serveHTTP starts the status page; stop shuts it down.
func (s *server) serveHTTP(info Info) (stop func(), url string, err error) {
	ln, err := net.Listen("tcp", s.cfg.HTTPAddr)
	if err != nil {
		return nil, "", fmt.Errorf("bootstrap: status page: %w", err)
	}
	params := 0
	if mc, err := s.run.ModelConfig(); err == nil {
		params = mc.NumParams()
	}
	s.status = status.NewServer(s.store, status.RunInfo{RunID: s.run.RunID, ManifestHash: s.run.HashString(),
		Preset: s.run.Model.Preset, ParamCount: params, InnerSteps: s.run.Optimizer.InnerSteps,
		Optimizer: s.run.Optimizer.Kind, BootstrapAddrs: publicAddrs(info.Addrs), Started: time.Now()}, s.members, s.statusOptions()...)
	hs := s.status.HTTPServer(s.cfg.HTTPAddr)
	go func() {
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("status page stopped", "err", err)
		}
	}()
	host := ln.Addr().String()
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && tcp.IP.IsUnspecified() {
		host = net.JoinHostPort("127.0.0.1", fmt.Sprint(tcp.Port))
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		hs.Shutdown(ctx)
	}, "http://" + host + "/", nil
}

func (s *server) statusOptions() []status.Option {
	opts := []status.Option{status.WithLogger(s.log)}
	if s.plan != nil {
		opts = append(opts, status.WithPipeline(s.plan.pipelineView))
	}
	return opts
}

// watch records membership changes until ctx ends.
func (s *server) watch(ctx context.Context) error {
	sub := s.seed.Subscribe()
	defer sub.Close()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(s.out, "skein bootstrap: leaving")
			return nil
		case ev, ok := <-sub.C:
			if !ok {
				return nil
			}
			s.log.Debug("membership", "event", ev.Kind, "peer", ev.Member.ID, "role", ev.Member.Meta.Role,
				"members", s.seed.NumMembers())
			if kind := eventKind(ev.Kind); kind != "" && ev.Member.ID != s.seed.ID() {
				if err := s.store.RecordEvent(status.Event{At: time.Now(), Peer: ev.Member.ID.String(), Kind: kind,
					Role: ev.Member.Meta.Role.String(), Device: ev.Member.Meta.Device}); err != nil {
					s.log.Debug("recording membership event", "err", err)
				}
			} else if s.status != nil {
				s.status.Notify() // metadata update: round, state hash
			}
		}
	}
}

// printAddrs tells the operator every address volunteers can use, and warns
// when none of them is reachable from the internet.
func printAddrs(w io.Writer, cfg Config, info Info) {
	fmt.Fprintf(w, "skein bootstrap: run %q (manifest %s), peer %s, listening on:\n", info.Manifest.RunID, info.Manifest.ShortHash(), info.PeerID)
	public := false
	for _, a := range info.Addrs {
		fmt.Fprintf(w, "  %s\n", a)
		if m, err := ma.NewMultiaddr(a); err == nil && isPublic(m) {
			public = true
		}
	}
	closed := info.Manifest.Admission.Mode == manifest.AdmissionClosed
	if len(info.Addrs) > 0 {
		token := ""
		if closed {
			token = " --token TOKEN"
		}
		fmt.Fprintf(w, "volunteers join with:\n  skein node join --bootstrap %s%s\n", info.Addrs[0], token)
	}
	if closed {
		fmt.Fprintf(w, "the run is closed: each volunteer needs a token for its peer ID, from the holder of the run key:\n"+
			"  skein token issue --key RUN-KEY --peer PEER-ID --run %s --role volunteer\n", info.Manifest.RunID)
	}
	if info.StatusURL != "" {
		fmt.Fprintf(w, "status page: %s\n", info.StatusURL)
	}
	if !public && cfg.Advertise == "" {
		fmt.Fprintln(w, "warning: every address above is private or loopback, so only machines on this network can join;\n"+
			"         give --advertise PUBLIC_IP:PORT when the port is forwarded from a public address")
	}
}

// publicAddrs keeps the addresses reachable from the internet: the public
// status page must not reveal the bootstrap's private or loopback ones.
func publicAddrs(addrs []string) []string {
	var out []string
	for _, a := range addrs {
		if m, err := ma.NewMultiaddr(a); err == nil && isPublic(m) {
			out = append(out, a)
		}
	}
	return out
}

// sharedAddressSpace is carrier-grade NAT's range (RFC 6598), not reachable
// from the internet.
var sharedAddressSpace = &net.IPNet{IP: net.IPv4(100, 64, 0, 0), Mask: net.CIDRMask(10, 32)}

// isPublic reports whether a multiaddr's IP is a global unicast address
// outside the private and shared ranges.
func isPublic(m ma.Multiaddr) bool {
	for _, code := range []int{ma.P_IP4, ma.P_IP6} {
		if v, err := m.ValueForProtocol(code); err == nil {
			ip := net.ParseIP(v)
			return ip != nil && ip.IsGlobalUnicast() && !ip.IsPrivate() && !sharedAddressSpace.Contains(ip)
		}
	}
	return false
}

// eventKind maps a membership event to the status page's timeline kinds;
// "" for a metadata update.
func eventKind(k p2p.EventKind) string {
	switch k {
	case p2p.EventJoin:
		return status.Join
	case p2p.EventLeave:
		return status.Leave
	case p2p.EventFail:
		return status.Fail
	}
	return ""
}
