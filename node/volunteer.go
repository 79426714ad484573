package node

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/internal/atomicfile"
	"github.com/skein-ml/skein/internal/dirlock"
	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/wan"
	"github.com/skein-ml/skein/telemetry"
	"github.com/skein-ml/skein/trainer"
	"github.com/skein-ml/skein/transport"
)

// VolunteerConfig configures `skein node join`: a volunteer that joins a run
// through its bootstrap (or any known member), fetches the run's manifest
// and corpus, and trains with the optimizer the manifest names. Every
// run-wide setting comes from the manifest; this config holds only what is
// the volunteer's own.
type VolunteerConfig struct {
	RunID     string // the run to join; "": the run Bootstrap serves (p2p.DiscoverRun)
	DataDir   string // identity, known peers, manifest, corpus shards, local checkpoint
	Bootstrap []string
	Listen    []string // default: QUIC and TCP on all interfaces, any port
	Timing    p2p.Timing
	// WAN, if set, emulates this link on every QUIC packet the volunteer
	// sends (the demo shows what the internet costs with it).
	WAN *wan.Link
	// Token is this volunteer's join token (p2p.IssueToken, role
	// volunteer), which a closed run requires; the volunteer learns the
	// run's admission policy from the peers it joins through.
	Token []byte

	// Local holds the run-wide settings given on this volunteer's command
	// line; each one set must agree with the manifest, or the volunteer is
	// refused with the field's name (manifest.ErrMismatch).
	Local manifest.Local
	// Manifest, if set, pins the run: the manifest the members serve must
	// have the same hash.
	Manifest *manifest.Manifest
	// ManifestWait bounds how long to keep asking members for the manifest.
	ManifestWait time.Duration
	// Corpus is the training data of a run whose manifest says source
	// "local" (empty: the Go standard library sources).
	Corpus []string

	Rounds  int // stop after this many rounds (0: until interrupted)
	Threads int // CPU threads to lend (0: all cores)
	// Device trains (kernels.SelectDevice: --device); nil means the CPU
	// with Threads threads. The volunteer does not close it.
	Device kernels.Device
	// MaxUploadMbps and MaxDownloadMbps cap the volunteer's traffic on
	// every stream (megabits per second; 0: no cap), and MaxMemoryMiB what
	// a run may need of its memory (a run that needs more is refused
	// before anything is allocated; 0: the system's available memory).
	MaxUploadMbps, MaxDownloadMbps float64
	MaxMemoryMiB                   int
	MinPeers                       int // volunteers (self included) to wait for before the first round
	// ValBatches is how many fixed held-out batches are evaluated after
	// each round for the validation loss (0: none).
	ValBatches int
	// MetricsAddr, if set, serves Prometheus metrics on http://ADDR/metrics.
	MetricsAddr string
	Version     string
	// Collective tunes the rounds' deadlines and bounds (DiLoCo's
	// butterfly, NoLoCo's gossip); the codec comes from the manifest.
	Collective CollectiveConfig

	Logger   *slog.Logger
	Progress io.Writer
	// OnRound is told about every finished round.
	OnRound func(RoundReport)

	// Hostile makes the volunteer misbehave in the collective, for chaos
	// tests only (optimizer.ButterflyConfig.Hostile; HostileMode maps the
	// command line's names). "" is honest.
	Hostile string

	// beforeStep, a test hook, is called before each inner step with the
	// volunteer's setup and the step (tests poison the weights with it).
	beforeStep func(su *trainer.Setup, step int)
}

// CollectiveConfig tunes a volunteer's rounds.
type CollectiveConfig struct {
	// InitialDeadline bounds a phase of a round until a duration has been
	// observed; later deadlines adapt to observed times, clamped to
	// [MinDeadline, MaxDeadline].
	InitialDeadline, MinDeadline, MaxDeadline time.Duration
	// MaxAbs bounds every element of a decoded contribution or aggregate;
	// larger or non-finite values make their producer an offender.
	MaxAbs float32
	// MaxStashBytes bounds the messages kept for rounds not reached yet
	// (raised to a few rounds' worth of the model's messages).
	MaxStashBytes int64
	// OnReject is told about every offender.
	OnReject func(from transport.PeerID, err error)
	Logger   *slog.Logger
}

// DefaultCollectiveConfig returns WAN-minded defaults: the first phase may
// take 2 minutes (a newcomer's first round over a slow link), later ones
// adapt between 2 s and 10 min.
func DefaultCollectiveConfig() CollectiveConfig {
	return CollectiveConfig{InitialDeadline: 2 * time.Minute, MinDeadline: 2 * time.Second, MaxDeadline: 10 * time.Minute,
		MaxAbs: 1e4, MaxStashBytes: optimizer.DefaultMaxStashBytes}
}

// Validate names the first invalid field.
func (c CollectiveConfig) Validate() error {
	switch {
	case c.InitialDeadline <= 0 || c.MinDeadline <= 0 || c.MaxDeadline < c.MinDeadline:
		return fmt.Errorf("deadlines initial %v, min %v, max %v", c.InitialDeadline, c.MinDeadline, c.MaxDeadline)
	case !(c.MaxAbs > 0):
		return fmt.Errorf("max abs %v must be positive", c.MaxAbs)
	case c.MaxStashBytes <= 0:
		return fmt.Errorf("max stash bytes %d must be positive", c.MaxStashBytes)
	}
	return nil
}

// RoundReport describes one finished outer round of a volunteer.
type RoundReport struct {
	Round     uint64
	Loss      float32 // mean training loss of the inner steps
	ValLoss   float32 // on the run's fixed validation batches after the round; NaN if not measured
	Members   int     // DiLoCo: the round's group; otherwise the volunteers in view
	Stats     optimizer.RoundStats
	StateHash uint64
	// Adopted: this volunteer did not contribute to the round (it joined
	// late, fell behind or was excluded) and took the run's state after it.
	Adopted bool
	// Data, in a run over a packed dataset, is where the run is in its
	// data after the round (nil otherwise).
	Data *DataProgress
	// LandedStep, for a delayed round, is the inner step of the next phase
	// after which its result was applied (0: at that phase's end).
	LandedStep int
}

// DataProgress is a run's position in its packed dataset.
type DataProgress struct {
	Epoch   uint64  // the epoch being trained
	Trained float64 // the share of its blocks trained (DiLoCo: certified rounds only)
	Block   uint64  // the block this member trained in the round
}

// roundTries is how often a volunteer offers one pseudo-gradient to a round
// that fails before it trains again from the run's state.
const roundTries = 3

// DefaultVolunteerConfig returns a volunteer of run runID with WAN timing.
func DefaultVolunteerConfig(runID string) VolunteerConfig {
	return VolunteerConfig{RunID: runID, Timing: p2p.WANTiming(), MinPeers: 1, ValBatches: 4,
		ManifestWait: 2 * time.Minute, Collective: DefaultCollectiveConfig()}
}

// Validate names the first invalid setting, by its `skein node join` flag
// where it has one, without touching the network: NewVolunteer calls it
// before anything else. A --corpus path must exist and be readable here;
// NewVolunteer then opens the corpus, still before joining.
func (c VolunteerConfig) Validate() error {
	bad := badConfig
	switch {
	case c.RunID == "" && len(c.Bootstrap) == 0:
		return bad("give the run's --bootstrap address (or --run-id to rejoin through known peers)")
	case c.Rounds < 0:
		return bad("--rounds %d must be >= 0 (0: until interrupted)", c.Rounds)
	case c.MinPeers < 1:
		return bad("--min-peers %d must be >= 1 (this volunteer counts)", c.MinPeers)
	case c.Threads < 0:
		return bad("--threads %d must be >= 0 (0: all cores)", c.Threads)
	case !(c.MaxUploadMbps >= 0) || !(c.MaxDownloadMbps >= 0) || math.IsInf(c.MaxUploadMbps, 0) || math.IsInf(c.MaxDownloadMbps, 0):
		return bad("--max-upload %v and --max-download %v must be finite and >= 0 Mbit/s (0: no cap)", c.MaxUploadMbps, c.MaxDownloadMbps)
	case (c.MaxUploadMbps > 0 && c.MaxUploadMbps < 0.1) || (c.MaxDownloadMbps > 0 && c.MaxDownloadMbps < 0.1):
		return bad("--max-upload %v and --max-download %v: below 0.1 Mbit/s membership gossip alone does not get through", c.MaxUploadMbps, c.MaxDownloadMbps)
	case c.MaxMemoryMiB < 0:
		return bad("--max-memory %d must be >= 0 MiB (0: the system's available memory)", c.MaxMemoryMiB)
	case c.ValBatches < 0:
		return bad("--val-batches %d must be >= 0 (0: none)", c.ValBatches)
	case c.ManifestWait <= 0:
		return bad("ManifestWait %v must be positive", c.ManifestWait)
	}
	if c.RunID != "" {
		if err := p2p.ValidateRunID(c.RunID); err != nil {
			return bad("--run-id: %w", err)
		}
	}
	for _, a := range c.Bootstrap {
		if _, err := peer.AddrInfoFromString(a); err != nil {
			return bad("--bootstrap %q: want a multiaddr ending in /p2p/<peer id>: %w", a, err)
		}
	}
	for _, a := range c.Listen {
		if _, err := ma.NewMultiaddr(a); err != nil {
			return bad("--listen %q: %w", a, err)
		}
	}
	if err := c.Timing.Validate(); err != nil {
		return bad("--timing: %w", err)
	}
	if c.WAN != nil {
		if err := c.WAN.Validate(); err != nil {
			return bad("--emulate-rate/--emulate-latency: %w", err)
		}
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			return bad("--metrics %q: want HOST:PORT: %w", c.MetricsAddr, err)
		}
	}
	if c.DataDir != "" {
		if st, err := os.Stat(c.DataDir); err == nil && !st.IsDir() {
			return bad("--data-dir %q is not a directory", c.DataDir)
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return bad("--data-dir %q: %w", c.DataDir, err)
		}
	}
	for _, p := range c.Corpus {
		f, err := os.Open(p)
		if err != nil {
			return bad("--corpus %q: %w", p, err)
		}
		f.Close()
	}
	if err := c.validateLocal(); err != nil {
		return err
	}
	if err := c.Collective.Validate(); err != nil {
		return bad("collective: %w", err)
	}
	return nil
}

// badConfig is an ErrConfig naming what is wrong.
func badConfig(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
}

// validateLocal checks the run-wide settings given to be compared with the
// manifest: a value no run can have is a mistake on this command line.
func (c VolunteerConfig) validateLocal() error {
	l := c.Local
	bad := badConfig
	switch {
	case l.Batch < 0:
		return bad("--batch %d must be >= 0 (0: the run's)", l.Batch)
	case l.SeqLen < 0:
		return bad("--seq-len %d must be >= 0 (0: the run's)", l.SeqLen)
	case l.InnerSteps < 0:
		return bad("--inner-steps %d must be >= 0 (0: the run's)", l.InnerSteps)
	case l.Optimizer != "" && l.Optimizer != manifest.KindDiLoCo && l.Optimizer != manifest.KindNoLoCo:
		return bad("--optimizer %q: want %s or %s", l.Optimizer, manifest.KindDiLoCo, manifest.KindNoLoCo)
	}
	if l.Preset != "" {
		if _, err := model.Preset(l.Preset); err != nil {
			return bad("--preset: %w", err)
		}
	}
	if l.Codec != "" {
		if _, err := compression.ParseCodec(l.Codec); err != nil {
			return bad("--codec: %w", err)
		}
	}
	return nil
}

const volunteerCheckpoint = "volunteer.safetensors"

// Volunteer is one machine lent to a run: its p2p node, its model and data
// (trainer.Setup), and the outer optimizer the run's manifest names: the
// DiLoCo collective and shared state (diloco.go) or NoLoCo's gossip (noloco.go).
// Its methods are the phases of a volunteer's life: NewVolunteer joins,
// Run trains and contributes round after round (re-syncing when it falls
// behind or diverges), Close checkpoints and leaves.
type Volunteer struct {
	cfg   VolunteerConfig
	log   *slog.Logger
	pn    *p2p.Node
	su    *trainer.Setup
	peers *p2p.Peers
	coll  *optimizer.ButterflyDriver
	dl    *optimizer.DiLoCo
	certs *certs // the DiLoCo state's round certificates (certs.go)
	// early is a delayed round landed during the inner phase in progress,
	// reported at its end (landEarly).
	early *earlyLanding

	theta     []float32             // the stage's weights, host copy
	n         int                   // parameters
	innerStep int                   // inner steps trained so far (the AdamW schedule's clock)
	rollbacks int                   // inner phases dropped in a row for non-finite values (rollback.go)
	ckPath    string                // local checkpoint; "" = none
	ckw       *trainer.Checkpointer // writes it in the background (save)
	// lastReported is the last round told to the user and OnRound, and
	// lastSent the report sent for it (corrected resends it).
	lastReported uint64
	lastSent     telemetry.Report
	// stateHash is the hash of the shared state as last announced (SHA-256
	// over the whole state: computed once per change, in announce).
	stateHash uint64

	run    manifest.Manifest
	lock   *dirlock.Lock
	corpus *data.Corpus
	// localCorpus is the --corpus files, opened before joining; openCorpus
	// splits them with the run's fraction.
	localCorpus *data.Corpus
	shards      *data.ShardStore // nil for a "local" run
	// tempShards is a shard directory made for a volunteer without a data
	// directory; Close removes it.
	tempShards string
	// A run over a packed dataset (dataset.go): the chunk cache, the
	// train split's blocks, the data ledger (DiLoCo; nil otherwise), the
	// slot of the phase in progress and the background fetches.
	tokens     *data.PackedSource
	blocks     data.Blocks
	ledger     *data.Ledger
	slot       data.Slot
	dataCtx    context.Context
	dataCancel context.CancelFunc
	prefetch   sync.WaitGroup // background chunk fetches
	reporter   *reporter
	metrics    *metricsServer
	device     string
	dev        kernels.Device // trains (VolunteerConfig.Device)
	joinedAt   time.Time
	// firstStepAt is when the first inner step finished (join time).
	firstStepAt time.Time
	// runAtStart is the latest round the others announced when this
	// volunteer started its rounds; computed, whether it has computed a
	// round of its own yet (restart-to-first-round, issue [1/4]).
	runAtStart uint64
	computed   bool
	// stats of the last round, for telemetry and metrics
	last roundMeasure

	// outer is the replica group's outer optimiser that runReplica drives:
	// dilocoLoop (diloco.go; the DiLoCo fields above) or *nolocoState
	// (noloco.go). nil for a staged run, which runs its own loop.
	outer outerLoop
	st    *stagedVolunteer // set for a staged run (staged.go)

	cancelRing context.CancelFunc
	// exchange is the context of a delayed round's exchange (diloco.go).
	exchange       context.Context
	cancelExchange context.CancelFunc
	mu             sync.Mutex
	served         servedBlob // the shared state served to joiners
	// spare is the state served before it, still served by its round for
	// a download that began before the round moved on, and its blob
	// reused for the next state once nobody reads it.
	spare servedBlob
}

// Join runs a volunteer until ctx ends or cfg.Rounds are done, then saves
// its state and leaves the run gracefully.
func Join(ctx context.Context, cfg VolunteerConfig) error {
	v, err := NewVolunteer(ctx, cfg)
	if err != nil {
		return err
	}
	err = v.Run(ctx)
	if cerr := v.Close(); err == nil {
		err = cerr
	}
	return err
}

// NewVolunteer joins the run: locks the data directory, starts the p2p
// node, fetches and checks the run's manifest, fetches the corpus shards it
// lists, builds the model and data stream, resumes the local checkpoint if
// there is one, and serves the manifest, the shards and the shared state to
// others. Close undoes it.
func NewVolunteer(ctx context.Context, cfg VolunteerConfig) (_ *Volunteer, err error) {
	v := &Volunteer{cfg: cfg, log: cfg.Logger, joinedAt: time.Now()}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	// Everything that can be checked here is, before the network.
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			v.close()
		}
	}()
	if len(cfg.Corpus) > 0 {
		// Split again with the run's fraction once the manifest is known
		// (openCorpus).
		if v.localCorpus, err = data.OpenPaths(cfg.Corpus, 0); err != nil {
			return nil, fmt.Errorf("%w: --corpus: %w", ErrConfig, err)
		}
	}
	if cfg.DataDir != "" {
		if v.lock, err = dirlock.Acquire(cfg.DataDir); err != nil {
			return nil, err
		}
		// Held by this process alone now: what a crash left half written
		// can go.
		removed, serr := atomicfile.RemoveStale(cfg.DataDir, atomicfile.ProcessStart())
		if serr != nil {
			return nil, fmt.Errorf("node: %w", serr)
		}
		if len(removed) > 0 {
			v.log.Info("removed temporary files left by a crash", "dir", cfg.DataDir, "files", removed)
		}
	}
	if cfg.RunID == "" {
		if cfg.RunID, err = p2p.DiscoverRun(ctx, cfg.Bootstrap, nil); err != nil {
			return nil, err
		}
		v.cfg.RunID = cfg.RunID
	}
	ncfg := p2p.DefaultNodeConfig(cfg.RunID)
	ncfg.DataDir, ncfg.Bootstrap, ncfg.Timing, ncfg.Logger = cfg.DataDir, cfg.Bootstrap, cfg.Timing, v.log
	ncfg.Token = cfg.Token
	ncfg.MaxUploadBps, ncfg.MaxDownloadBps = cfg.MaxUploadMbps*1e6/8, cfg.MaxDownloadMbps*1e6/8
	ncfg.Meta.CapMemMiB = uint32(cfg.MaxMemoryMiB)
	if len(cfg.Listen) > 0 {
		ncfg.ListenAddrs = cfg.Listen
	}
	if cfg.WAN != nil {
		emu, err := wan.New(*cfg.WAN, uint64(time.Now().UnixNano()))
		if err != nil {
			return nil, err
		}
		ncfg.ListenUDP = emu.ListenUDP
	}
	if v.dev = cfg.Device; v.dev == nil {
		v.dev = kernels.NewCPU(cfg.Threads)
	}
	v.device = v.dev.Name()
	if g, ok := v.dev.(interface{ GPU() string }); ok {
		v.device = "cuda " + g.GPU() // the gossiped name is short (p2p.MaxDeviceLen)
	}
	ncfg.Meta.Role, ncfg.Meta.Device, ncfg.Meta.Version = p2p.RoleVolunteer, clip(v.device, p2p.MaxDeviceLen), clip(cfg.Version, p2p.MaxVersionLen)
	if cfg.Hostile == HostileFakeBoot {
		ncfg.Meta.Role = p2p.RoleBootstrap // its own word: nobody checks it in an open run
	}
	if v.pn, err = p2p.NewNode(ctx, ncfg); err != nil {
		return nil, err
	}
	say(cfg.Progress, "joined run %q as %s; %d members", cfg.RunID, v.pn.ID(), v.pn.NumMembers())
	if err := v.takeManifest(ctx); err != nil {
		return nil, err
	}
	m := v.run
	if m.Optimizer.Kind == manifest.KindDiLoCo && !m.Optimizer.Nesterov {
		return nil, fmt.Errorf("%w: run %q asks for DiLoCo without Nesterov momentum (optimizer.nesterov = false); volunteers run Nesterov DiLoCo only",
			ErrUnsupported, m.RunID)
	}
	var corpus *data.Corpus
	if m.Data.Source == manifest.SourceDataset {
		if m.Pipeline.Staged() {
			return nil, fmt.Errorf("%w: run %q is staged and trains on a packed dataset; staged volunteers read a corpus only for now", ErrUnsupported, m.RunID)
		}
		if v.tokens, err = v.openDataset(ctx); err != nil {
			return nil, err
		}
	} else if corpus, err = v.openCorpus(ctx); err != nil {
		return nil, err
	}
	if m.Pipeline.Staged() {
		if err := v.initStaged(corpus); err != nil {
			corpus.Close()
			return nil, err
		}
		return v, v.serveAll(cfg)
	}

	a := optimizer.DefaultAdamW()
	a.LR, a.Warmup, a.TotalSteps, a.WeightDecay, a.Clip = m.Optimizer.InnerLR, m.Optimizer.Warmup,
		m.Optimizer.TotalSteps, m.Optimizer.WeightDecay, m.Optimizer.GradClip
	const slots = 1 << 16
	hostCopies := dilocoHostCopies
	if m.Optimizer.Kind == manifest.KindNoLoCo {
		hostCopies = nolocoHostCopies
	}
	closeCorpus := func() {
		if corpus != nil {
			corpus.Close()
		}
	}
	if err := checkTokenizer(m); err != nil {
		closeCorpus()
		return nil, err
	}
	var source data.TokenSource
	if v.tokens != nil {
		source = v.tokens
	}
	if v.su, err = trainer.NewSetup(trainer.SetupConfig{Preset: m.Model.Preset, Tokenizer: m.Data.Tokenizer, Batch: m.Model.Batch, SeqLen: m.SeqLen(),
		Seed: m.Model.Seed, Dev: v.dev, Corpus: corpus, Source: source, Worker: trainer.WorkerSlot(v.pn.ID().String(), slots),
		Workers: slots, AdamW: a, ValBatches: cfg.ValBatches, HostCopies: hostCopies,
		MemAvailable: uint64(cfg.MaxMemoryMiB) << 20}); err != nil {
		closeCorpus()
		if errors.Is(err, trainer.ErrMemory) && cfg.MaxMemoryMiB > 0 {
			err = fmt.Errorf("%w (the cap this volunteer was given: --max-memory %d MiB)", err, cfg.MaxMemoryMiB)
		}
		return nil, err
	}
	v.corpus = corpus
	if v.tokens != nil {
		if err := v.initBlocks(); err != nil {
			return nil, err
		}
	}
	v.n = v.su.Stage.NumParams()
	v.theta = make([]float32, v.n)
	v.su.Dev.CopyOut(v.theta, v.su.Stage.Params)
	if m.Optimizer.Kind == manifest.KindNoLoCo {
		err = v.initNoLoCo()
	} else {
		err = v.initDiLoCo()
	}
	if err != nil {
		return nil, err
	}
	return v, v.serveAll(cfg)
}

// serveAll serves the bulk keys (state, shards), and starts telemetry and
// the metrics endpoint.
func (v *Volunteer) serveAll(cfg VolunteerConfig) (err error) {
	if err := v.pn.ServeBulk(v.serveBulk, 0); err != nil {
		return err
	}
	v.reporter = newReporter(v.pn, v.log)
	if cfg.MetricsAddr != "" {
		if v.metrics, err = serveMetrics(cfg.MetricsAddr, v); err != nil {
			return err
		}
	}
	return nil
}

// admissionAgrees checks the admission policy this volunteer was let in
// under (learned at the door) against the manifest, the operator's word for
// it: open or closed, and the run key. A disagreement means the members, or
// the one that let this volunteer in, are not running the run the manifest
// describes. The caps (max members, per prefix) are each member's own
// limits on what it accepts and may differ.
func admissionAgrees(learned p2p.Admission, m manifest.Manifest) error {
	want := m.Admission.Policy()
	if learned.Closed != want.Closed || !learned.RunKey.Equal(want.RunKey) {
		return fmt.Errorf("%w: run %q admits members as %s, but its manifest %s says %s", ErrManifest,
			m.RunID, learned, m.ShortHash(), want)
	}
	return nil
}

// takeManifest fetches the run's manifest from its members and checks it
// against what this volunteer was given and what its data directory trained
// under; then serves it to others.
func (v *Volunteer) takeManifest(ctx context.Context) error {
	m, err := FetchManifest(ctx, v.pn, v.cfg.RunID, v.cfg.ManifestWait, v.log)
	if err != nil {
		return err
	}
	if learned, ok := v.pn.Admission(); ok {
		if err := admissionAgrees(learned, m); err != nil {
			return err
		}
	}
	if p := v.cfg.Manifest; p != nil && p.Hash() != m.Hash() {
		return fmt.Errorf("%w: run %q serves manifest %s, not the %s this volunteer was given", ErrManifest,
			m.RunID, m.ShortHash(), p.ShortHash())
	}
	cached, err := loadCachedManifest(v.cfg.DataDir)
	if err != nil {
		v.log.Warn("ignoring unreadable cached manifest", "err", err)
	} else if cached != nil && cached.Hash() != m.Hash() {
		return fmt.Errorf("%w: %s trained under manifest %s, but run %q now serves %s; use a new --data-dir to join it",
			ErrManifest, v.cfg.DataDir, cached.ShortHash(), m.RunID, m.ShortHash())
	}
	if err := m.Check(v.cfg.Local); err != nil {
		return fmt.Errorf("refused by run %q: %w", m.RunID, err)
	}
	if err := m.CheckStaged(); err != nil {
		return fmt.Errorf("%w: run %q: %w", ErrStagedRun, m.RunID, err)
	}
	if err := saveManifest(v.cfg.DataDir, m); err != nil {
		return err
	}
	v.run = m
	say(v.cfg.Progress, "run %q: manifest %s: %s, batch %d x %d, %s H=%d, %s on the wire, data: %s", m.RunID, m.ShortHash(),
		m.Model.Preset, m.Model.Batch, m.SeqLen(), m.Optimizer.Kind, m.Optimizer.InnerSteps, m.Wire.Codec, m.Data.Source)
	return ServeManifest(v.pn, m)
}

// Copies of the parameters a volunteer keeps beside its stage, for the
// memory check: the host copy of the weights, the encoded state it serves
// (two), and the optimizer's: DiLoCo's phi, momentum, pseudo-gradient and
// average; NoLoCo's phi, outer gradient and four buffers.
const (
	dilocoHostCopies = 3 + 4
	nolocoHostCopies = 3 + 6
)

// openCorpus opens the run's corpus: the manifest's shards (fetched into
// the data directory first) or, for a "local" run, this machine's files
// (opened before joining, split here with the run's fraction).
func (v *Volunteer) openCorpus(ctx context.Context) (*data.Corpus, error) {
	m := v.run
	if m.Data.Source != manifest.SourceShards {
		if v.localCorpus != nil {
			return v.localCorpus.Resplit(m.Data.ValFraction)
		}
		return data.OpenPaths(v.cfg.Corpus, m.Data.ValFraction)
	}
	if v.localCorpus != nil {
		v.log.Warn("ignoring --corpus: the run brings its own shards", "corpus", v.cfg.Corpus)
	}
	dir := filepath.Join(v.cfg.DataDir, "shards")
	if v.cfg.DataDir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "skein-shards-*"); err != nil {
			return nil, fmt.Errorf("node: %w", err)
		}
		v.tempShards = dir // removed on Close
	}
	store, err := data.OpenShardStore(dir)
	if err != nil {
		return nil, err
	}
	v.shards = store
	infos := shardInfos(m.Data.Shards)
	for try := 0; ; try++ {
		if err := fetchShards(ctx, v.pn, store, infos, v.cfg.Progress, v.log); err != nil {
			return nil, err
		}
		c, err := data.OpenShards(store, infos, data.ShardCorpusConfig{ValFraction: m.Data.ValFraction})
		// A shard found corrupt on disk was deleted: fetch it again.
		if errors.Is(err, data.ErrShardCorrupt) && try < 2 {
			v.log.Warn("a cached shard was corrupt; fetching it again", "err", err)
			continue
		}
		return c, err
	}
}

// serveBulk serves the shared state to joining volunteers and to
// observers (bulk key stateKey: skein node pull) and the corpus shards this volunteer holds (data.ShardKey) to
// members of the run.
func (v *Volunteer) serveBulk(_ context.Context, from peer.ID, key string) (io.ReaderAt, int64, error) {
	// Only the run's members are served: a stranger must not be able to
	// spend a volunteer's uplink on shards and states.
	m, ok := v.pn.Member(from)
	if !ok {
		return nil, 0, fmt.Errorf("node: %s is not a member of run %q", from, v.run.RunID)
	}
	if hash, ok := data.ParseShardKey(key); ok && v.shards != nil {
		return v.shards.Open(hash)
	}
	if name, ok := data.ParseTokenKey(key); ok && v.tokens != nil {
		return v.tokens.ReaderAt(name) // the chunks this volunteer holds
	}
	if v.st != nil {
		if m.Meta.Role != p2p.RoleVolunteer {
			return nil, 0, fmt.Errorf("node: a stage's weights are for volunteers, not %s (%s)", from, m.Meta.Role)
		}
		r, n, ok, err := v.st.serve(key)
		if !ok {
			return nil, 0, fmt.Errorf("node: no bulk key %q", key)
		}
		return r, n, err
	}
	if _, _, ok := parseStateKey(key); !ok {
		return nil, 0, fmt.Errorf("node: no bulk key %q", key)
	}
	// Volunteers joining, and observers pulling the run's weights (skein
	// node pull; in a closed run an observer holds the operator's token).
	if m.Meta.Role != p2p.RoleVolunteer && m.Meta.Role != p2p.RoleObserver {
		return nil, 0, fmt.Errorf("node: the run's state is for volunteers and observers, not %s (%s)", from, m.Meta.Role)
	}
	return v.openServed(key)
}

// openServed opens the served state for a bulk key, or the spare for its
// round, counted among the blob's readers until the bulk server closes it.
func (v *Volunteer) openServed(key string) (io.ReaderAt, int64, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	r, n, err := v.served.open(key)
	if err != nil {
		if sr, sn, serr := v.spare.open(key); serr == nil {
			return sr, sn, nil
		}
	}
	return r, n, err
}

// serve makes a state what this volunteer serves to joiners and returns
// its hash.
func (v *Volunteer) serve(round uint64, phi, mom []float32) uint64 {
	return v.serveHashed(round, phi, mom, optimizer.StateChunkHashes(phi, mom))
}

// serveDiLoCo serves the DiLoCo state as it is (the blob is the copy),
// with the chunk hashes it keeps, which the next round's state hash reuses.
func (v *Volunteer) serveDiLoCo() uint64 {
	return v.serveHashed(v.dl.Round, v.dl.Phi, v.dl.Mom, v.dl.StateChunkHashes())
}

// serveHashed encodes the state into the spare blob when no download
// still reads it (a fresh 1 GB allocation at 124M parameters took 2 s of
// page faults on a VM, the copy into warm memory 0.04 s), else into a new
// one; the blob it replaces becomes the spare. A blob being read is never
// written: openServed counts its readers, under v.mu, and the spare taken
// for writing is no longer opened.
func (v *Volunteer) serveHashed(round uint64, phi, mom []float32, chunks [][sha256.Size]byte) uint64 {
	v.mu.Lock()
	var dst []byte
	if v.spare.blob != nil && v.spare.readers.Load() == 0 {
		dst, v.spare = v.spare.blob[:0], servedBlob{}
	}
	v.mu.Unlock()
	blob, hash := encodeServedInto(dst, round, phi, mom, chunks, v.tail())
	v.mu.Lock()
	v.spare = v.served
	v.served = servedBlob{servedState{blob: blob, round: round}, new(atomic.Int32)}
	v.mu.Unlock()
	return hash
}

func (v *Volunteer) closeReporter() {
	if v.reporter != nil {
		v.reporter.close()
	}
}

func (v *Volunteer) closeOuter() {
	if v.outer != nil {
		v.outer.close()
	}
}

func (v *Volunteer) closeMetrics() {
	if v.metrics != nil {
		v.metrics.close()
	}
}

// Close saves the local checkpoint and leaves the run gracefully.
func (v *Volunteer) Close() error {
	saved := v.save(true)
	v.mu.Lock()
	m := v.last
	v.mu.Unlock()
	if m.wallTotal > 0 {
		what := fmt.Sprintf("trained %d tokens", m.tokensTotal)
		if v.st != nil && m.tokensTotal == 0 {
			what = "trained its stage" // a staged run counts tokens where they enter, at stage 0
		}
		say(v.cfg.Progress, "%s in %d rounds (%d adopted); computing %.0f%% of the time (%.1fs of %.1fs)",
			what, m.contributed+m.adopted, m.adopted, 100*m.computeTotal/m.wallTotal, m.computeTotal, m.wallTotal)
	}
	err := v.close()
	switch {
	case saved && err == nil:
		say(v.cfg.Progress, "saved the checkpoint (%s, round %d) and left the run; the same command resumes it", v.ckPath, v.round())
	case err == nil:
		say(v.cfg.Progress, "left the run")
	}
	return err
}

func (v *Volunteer) close() error {
	// The last report, the outer loop and the metrics stop side by side (a
	// volunteer must be gone within seconds of Ctrl-C), then the node
	// leaves the run (at most about 4 s: p2p.Node.Close).
	var wg sync.WaitGroup
	for _, stop := range []func(){v.closeReporter, v.closeOuter, v.closeMetrics} {
		wg.Go(stop)
	}
	wg.Wait()
	if v.peers != nil {
		v.peers.Close()
	}
	if v.su != nil {
		v.su.Close()
	}
	if v.corpus != nil {
		v.corpus.Close()
	}
	if v.localCorpus != nil {
		v.localCorpus.Close()
	}
	v.closeDataset()
	var err error
	if v.pn != nil {
		err = v.pn.Close() // graceful leave
	}
	if v.tempShards != "" {
		os.RemoveAll(v.tempShards)
	}
	v.lock.Release()
	return err
}

// Run trains until ctx ends (nil error) or cfg.Rounds rounds are done:
// first it waits for enough volunteers, then runs the manifest's optimizer
// round after round.
func (v *Volunteer) Run(ctx context.Context) error {
	if v.cfg.Hostile == HostileFakeBoot {
		return v.fakeBoot(ctx)
	}
	if v.st != nil {
		return v.runStaged(ctx) // the bootstrap's plan waits for the volunteers
	}
	if !v.waitForPeers(ctx) {
		return nil
	}
	return v.runReplica(ctx)
}

// waitForPeers waits for cfg.MinPeers volunteers and for the view to settle
// (unchanged for a second), so that the first round's group is the same
// everywhere. It reports false when ctx ended first.
func (v *Volunteer) waitForPeers(ctx context.Context) bool {
	var last []transport.PeerID
	for stable := 0; stable < 2; {
		cur := v.peers.Members()
		slices.Sort(cur)
		switch {
		case len(cur) < v.cfg.MinPeers:
			stable = 0
			say(v.cfg.Progress, "waiting for volunteers: %d of %d", len(cur), v.cfg.MinPeers)
		case slices.Equal(cur, last):
			stable++
		default:
			stable = 1
		}
		last = cur
		if stable >= 2 {
			break
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(500 * time.Millisecond):
		}
	}
	return true
}

// roundMeasure is what a volunteer measured of its last round.
type roundMeasure struct {
	round                uint64
	trainLoss, valLoss   float32
	tokens, tokensTotal  uint64
	tokensPerSec         float64
	computeSec, wallSec  float64
	contributed, adopted uint64
	// totals since the first round: inner-step time and round wall time
	computeTotal, wallTotal float64
	sentTotal, recvTotal    int64 // traffic counters at the last report
}

// phase is one round's inner phase as measured.
type phase struct {
	lossSum    float64
	steps      int
	computeSec float64
	began      time.Time
}

func (p phase) meanLoss() float32 {
	if p.steps == 0 {
		return float32(math.NaN())
	}
	return float32(p.lossSum / float64(p.steps))
}

// trainPhase runs the round's inner steps.
func (v *Volunteer) trainPhase(ctx context.Context) (phase, error) {
	ph := phase{began: time.Now()}
	v.assignBlock()
	for s := 0; s < v.run.Optimizer.InnerSteps; s++ {
		if ctx.Err() != nil {
			break
		}
		if v.cfg.beforeStep != nil {
			v.cfg.beforeStep(v.su, v.innerStep)
		}
		r, err := v.su.Step(v.innerStep)
		if err != nil {
			return ph, err
		}
		if v.firstStepAt.IsZero() {
			v.firstStepAt = time.Now()
			say(v.cfg.Progress, "first training step %.1fs after starting, on %s", v.firstStepAt.Sub(v.joinedAt).Seconds(), v.dev.Name())
		}
		v.innerStep++
		ph.steps++
		ph.lossSum += float64(r.Loss)
		if v.dl != nil && v.dl.ExchangeDone() {
			v.landEarly(ph.steps)
		}
	}
	ph.computeSec = time.Since(ph.began).Seconds()
	if ph.steps > 0 {
		v.rollbacks = 0
	}
	return ph, nil
}

// ErrUnsupported is returned (wrapped) for a run this volunteer cannot
// train (an optimizer variant not yet run over the network).
var ErrUnsupported = errors.New("node: run not supported by this volunteer")

// validate returns the loss of the run's state (phi) on the fixed
// validation batches, NaN when there are none. The stage's weights are phi
// after a plain round; after a delayed one they are the eager start plus
// the local progress since, so phi is swapped in for the measurement.
func (v *Volunteer) validate() float32 {
	if v.su.Val == nil {
		return float32(math.NaN())
	}
	swap := v.dl != nil && v.dl.InFlight()
	if swap {
		v.su.Dev.CopyIn(v.su.Stage.Params, v.dl.Phi)
		defer v.su.Dev.CopyIn(v.su.Stage.Params, v.theta)
	}
	vl, err := v.su.Eval()
	if err != nil {
		v.log.Warn("validation", "err", err)
		return float32(math.NaN())
	}
	return vl
}

// clip cuts s to at most n bytes (metadata fields are bounded).
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// measured maps a loss that is no number (a diverged step) to NaN, which
// telemetry reads as "not measured"; an infinite one would get the whole
// report refused.
func measured(loss float32) float32 {
	if math.IsInf(float64(loss), 0) {
		return float32(math.NaN())
	}
	return loss
}

// account records a round in the metrics (v.last) and returns the bytes
// sent and received since the last one.
func (v *Volunteer) account(rep RoundReport, tokens uint64, tps, computeSec, wall float64) (sent, recv int64) {
	traffic := v.pn.Traffic().Total
	v.mu.Lock()
	defer v.mu.Unlock()
	m := &v.last
	sent, recv = traffic.Out-m.sentTotal, traffic.In-m.recvTotal
	m.round, m.trainLoss, m.valLoss, m.tokens, m.tokensPerSec = rep.Round, rep.Loss, rep.ValLoss, tokens, tps
	m.tokensTotal += tokens
	m.computeSec, m.wallSec, m.sentTotal, m.recvTotal = computeSec, wall, traffic.Out, traffic.In
	m.computeTotal += computeSec
	m.wallTotal += wall
	if rep.Adopted {
		m.adopted++
	} else {
		m.contributed++
	}
	return sent, recv
}

// report measures the round's validation loss, prints the round's line,
// sends telemetry, updates the metrics, tells OnRound and checkpoints.
func (v *Volunteer) report(rep RoundReport, ph phase, group int) {
	// The round's wall time: inner steps plus the outer step (communication
	// and waiting). Validation, below, is measurement, not training: it is
	// counted in neither.
	wall := time.Since(ph.began).Seconds()
	rep.ValLoss = v.validate()
	if v.tokens != nil {
		rep.Data = &DataProgress{Block: v.blocks.Block(v.slot)}
		if e, done, ok := v.dataProgress(); ok {
			rep.Data.Epoch, rep.Data.Trained = e, done
		}
	}
	tokens := uint64(ph.steps * v.su.TokensPerStep())
	tps := 0.0
	if ph.computeSec > 0 {
		tps = float64(tokens) / ph.computeSec
	}
	sent, recv := v.account(rep, tokens, tps, ph.computeSec, wall)

	val := ""
	if !math.IsNaN(float64(rep.ValLoss)) {
		val = fmt.Sprintf(", val %.4f", rep.ValLoss)
	}
	state := "" // NoLoCo members hold different weights by design: no state to compare
	if rep.StateHash != 0 {
		state = fmt.Sprintf(" (state %016x)", rep.StateHash)
	}
	if rep.Adopted {
		say(v.cfg.Progress, "round %d: adopted the run's state%s", rep.Round, state)
	} else {
		if !v.computed {
			v.computed = true
			say(v.cfg.Progress, "first round computed %.1fs after starting: round %d, %d after the run's round when this volunteer began",
				time.Since(v.joinedAt).Seconds(), rep.Round, int64(rep.Round)-int64(v.runAtStart))
		}
		epoch := ""
		if d := rep.Data; d != nil && v.ledger != nil {
			epoch = fmt.Sprintf(", epoch %d %.1f%% trained (block %d)", d.Epoch, 100*d.Trained, d.Block)
		} else if d != nil {
			epoch = fmt.Sprintf(", block %d", d.Block)
		}
		// bits/param: everything this host sent since the last round line
		// (every protocol, framing included) over the parameter count.
		bits := ""
		if v.n > 0 {
			bits = fmt.Sprintf(", bits/param %.2f", 8*float64(max(sent, 0))/float64(v.n))
		}
		landed := ""
		if rep.LandedStep > 0 {
			landed = fmt.Sprintf(", landed at step %d/%d", rep.LandedStep, v.run.Optimizer.InnerSteps)
		}
		loss := "-" // no inner step since the last round (a stop right after one: landOnStop)
		if !math.IsNaN(float64(rep.Loss)) {
			loss = fmt.Sprintf("%.4f", rep.Loss)
		}
		say(v.cfg.Progress, "round %d: loss %s%s, %s tok/s, %d in group, %.1f kB sent%s, %.1fs%s%s%s", rep.Round,
			loss, val, trainer.HumanRate(tps), group, float64(rep.Stats.BytesSent)/1e3, bits, wall, landed, epoch, state)
	}
	v.lastSent = telemetry.Report{Round: rep.Round, StateHash: rep.StateHash, Adopted: rep.Adopted,
		TrainLoss: measured(rep.Loss), ValLoss: measured(rep.ValLoss), Tokens: tokens, TokensPerSec: tps,
		BytesSent: uint64(max(sent, 0)), BytesRecv: uint64(max(recv, 0)), ComputeSeconds: ph.computeSec, WallSeconds: wall,
		Members: rep.Members, Device: v.device, Version: v.cfg.Version, UnixMS: time.Now().UnixMilli(),
		HasData: rep.Data != nil && v.ledger != nil} // a NoLoCo member keeps no ledger: no progress to show
	if v.lastSent.HasData {
		v.lastSent.Epoch, v.lastSent.EpochTrained = rep.Data.Epoch, float32(min(max(rep.Data.Trained, 0), 1))
	}
	if v.cfg.Hostile == HostileTelemetry {
		v.reporter.send(lyingReport(v.lastSent))
	} else {
		v.reporter.send(v.lastSent)
	}
	if v.cfg.OnRound != nil {
		v.cfg.OnRound(rep)
	}
	v.save(false)
}

// gossipRound announces in this member's metadata the round it is at and
// the hash of its state (0: none to compare). It does not wait for the
// broadcast (p2p.Node.AnnounceMeta): the wait held every round back by
// 100-400 ms (up to 5 s after a departure) and made no one hear it sooner.
func (v *Volunteer) gossipRound(round, hash uint64) {
	if err := v.pn.AnnounceMeta(func(m *p2p.Meta) { m.Round, m.StateHash = round, hash }); err != nil {
		v.log.Debug("announcing round", "round", round, "err", err)
	}
}

// round is the number of outer rounds this volunteer's state has seen.
func (v *Volunteer) round() uint64 {
	if v.outer == nil {
		return 0
	}
	return v.outer.round()
}

// save starts writing the local checkpoint, if there is one, in the
// background (trainer.Checkpointer: the round waits only for the copies),
// and reports whether it did; a failed earlier write is logged. wait
// also waits for the write to land (leaving the run).
func (v *Volunteer) save(wait bool) bool {
	if v.outer == nil {
		return false // a staged volunteer saves its stage itself
	}
	st := v.outer.state()
	if v.ckPath == "" || v.su == nil || st == nil {
		return false
	}
	if v.ckw == nil {
		v.ckw = trainer.NewCheckpointer(v.ckPath)
	}
	err := v.ckw.SaveWith(v.su.Stage, v.innerStep, map[string]string{model.MetaTokenizer: v.su.Tokenizer}, func(ck *model.Checkpoint) func() error {
		round, phi, mom := st.State()
		tail := v.tail()
		var resid []float32 // copied now (the next round changes it), encoded in the background
		if v.dl != nil && v.dl.Residual() != nil {
			resid = slices.Clone(v.dl.Residual())
		}
		return func() error {
			if err := writeState(v.ckPath, ck, round, phi, mom); err != nil {
				return err
			}
			if resid != nil {
				if err := atomicfile.WriteFile(v.ckPath+residualFile, encodeResidual(round, resid), 0o644); err != nil {
					return err
				}
			}
			if tail == nil {
				return nil
			}
			return atomicfile.WriteFile(v.ckPath+".tail", tail, 0o644)
		}
	})
	if err != nil {
		v.log.Error("saving checkpoint", "err", err)
	}
	if wait {
		if err := v.ckw.Wait(); err != nil {
			v.log.Error("saving checkpoint", "err", err)
			return false
		}
	}
	return true
}

// checkTokenizer refuses a run whose tokenizer this build does not have,
// or has with another vocabulary (data.tokenizer_hash).
func checkTokenizer(m manifest.Manifest) error {
	if !m.Data.Tokenized() {
		return nil
	}
	t := m.Data.Tokenizer
	tok, err := data.NewTokenizer(t)
	if err != nil {
		return fmt.Errorf("%w: data.tokenizer: %w", ErrConfig, err)
	}
	if h := tok.(data.Named).VocabHash(); m.Data.TokenizerHash != "" && h != m.Data.TokenizerHash {
		return fmt.Errorf("%w: data.tokenizer_hash: the run's %s vocabulary hashes to %s, this build's to %s", ErrConfig, t, m.Data.TokenizerHash, h)
	}
	return nil
}

func say(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// lyingReport is HostileTelemetry's report for a round: in turn a
// validation loss of 200002, 1e13 tokens, and the round 1000 rounds ahead
// (the status page attack of issue [1/4]).
func lyingReport(r telemetry.Report) telemetry.Report {
	switch r.Round % 3 {
	case 0:
		r.ValLoss, r.TrainLoss = 200002, 200002
	case 1:
		r.Tokens = 1e13
	default:
		r.Round += 1000
	}
	return r
}
