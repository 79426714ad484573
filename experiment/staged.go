package experiment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/pipeline"
	"github.com/skein-ml/skein/trainer"
	"github.com/skein-ml/skein/transport"
)

// A staged run trains one model split into S pipeline stages, R replicas
// per stage, in process: every microbatch travels its SkipPipe path over
// pipeline.RelayDriver on an transport.MemNetwork (activations forward,
// gradients back, as between volunteers), each stage replica takes an
// AdamW step on the gradient of the microbatches that visited it, and
// every H steps the replicas of each stage average with DiLoCo over the
// butterfly collective, one MemNetwork per stage. A failure can wipe a
// stage mid-run, which is then rebuilt by CheckFree or re-initialized at
// random (ALGORITHMS.md 3, 4).

// Recovery names how a staged run rebuilds a lost stage.
type Recovery string

// The recoveries.
const (
	// CheckFree rebuilds the stage from its neighbours weighted by their
	// last gradient norms (pipeline.Rebuild).
	CheckFree Recovery = "checkfree"
	// RandomInit starts the stage from fresh random weights.
	RandomInit Recovery = "random"
)

// StageFailure wipes every replica of one stage after step Step (1-based:
// after Step steps), which must end a DiLoCo round so that all replicas of
// a stage hold the same weights and one rebuild serves them all. Both
// recoveries start a fresh AdamW at pipeline.RebuildLRFactor times the
// learning rate, so they differ only in the weights they start from.
type StageFailure struct {
	Step     int
	Stage    int
	Recovery Recovery
}

// StagedConfig configures RunStaged.
type StagedConfig struct {
	Preset   string
	Stages   int // S, stage 0 (embedding, head, loss) included
	Replicas int // R, nodes per stage
	// SkipRatio is k: every microbatch visits L = S(1-k) stages, which must
	// be whole (with S = 3: 0 or 1/3).
	SkipRatio    float64
	Microbatches int // per iteration (step)
	Batch        int // sequences per microbatch
	SeqLen       int // 0: the preset's context
	Steps        int
	InnerSteps   int // H: steps between DiLoCo rounds
	// EvalEvery is the steps between validations (0: every InnerSteps,
	// right after each round, when a stage's replicas agree; between
	// rounds the validated model is replica 0's view).
	EvalEvery   int
	EvalBatches int
	Seed        uint64
	Threads     int // per node's CPU device
	// Mu is the most microbatches a node holds at once (0: the fewest that
	// fit the schedule, ceil(Microbatches/Replicas)).
	Mu int

	AdamW optimizer.AdamWConfig // TotalSteps is set to Steps
	// StageOuter is how each stage's replicas average every InnerSteps:
	// DiLoCo (the default; the butterfly all-reduce among them) or NoLoCo
	// (each replica with a random group of its stage, no all-reduce).
	StageOuter Algorithm
	DiLoCo     optimizer.DiLoCoConfig
	// NoLoCo's settings (it holds callbacks: the record, results.json,
	// carries its numbers through writeStaged).
	NoLoCo optimizer.NoLoCoConfig `json:"-"`
	// RandomRouting sends each microbatch to a random replica of each
	// stage on its path (a fresh permutation per stage and iteration,
	// seeded, so every replica still gets its share), as NoLoCo routes
	// between replicas; false: a round robin that rotates each iteration.
	RandomRouting bool
	// Activations is the codec of activations and their gradients on the
	// relay (bf16 by default, ALGORITHMS.md 5).
	Activations compression.Codec
	// Outer is the codec of the DiLoCo pseudo-gradients (fp32 by default:
	// the staged run measures the pipeline, not the compression).
	Outer compression.Codec

	Failure *StageFailure
	// CheckFreePlus swaps the order of stages 1 and 2 (and of the last two,
	// with 5 stages or more) on odd microbatches, so that the edge stages
	// learn their partner's role and a lost one is copied from it
	// (pipeline.CheckFreePlus); without it only stages 2..S-2 can be lost.
	CheckFreePlus bool `json:"checkfree_plus,omitempty"`

	Corpus []string     // nil: the default corpus
	Logger *slog.Logger `json:"-"`
	// Progress, if set, receives a line per validation and per event.
	Progress io.Writer `json:"-"`
	// OnEval is called after each validation.
	OnEval func(p StagedPoint) `json:"-"`
}

// DefaultStagedConfig is a small run of the tiny preset: 3 stages of 2
// replicas, no skips, 4 microbatches of 4x64 tokens per step, DiLoCo every
// 10 steps.
func DefaultStagedConfig() StagedConfig {
	a := optimizer.DefaultAdamW()
	a.LR, a.Warmup = 1e-3, 10
	return StagedConfig{Preset: "tiny", Stages: 3, Replicas: 2, SkipRatio: 0, Microbatches: 4, Batch: 4, SeqLen: 64,
		Steps: 100, InnerSteps: 10, EvalBatches: 4, Seed: 1, Threads: 1, AdamW: a, StageOuter: DiLoCo,
		DiLoCo: optimizer.DefaultDiLoCo(), NoLoCo: optimizer.DefaultNoLoCo(),
		Activations: compression.BF16, Outer: compression.FP32}
}

// Skip is the number of stages every microbatch skips, S - L.
func (c StagedConfig) Skip() int { return int(math.Round(c.SkipRatio * float64(c.Stages))) }

func (c StagedConfig) mu() int {
	if c.Mu > 0 {
		return c.Mu
	}
	return (c.Microbatches + c.Replicas - 1) / c.Replicas
}

func (c StagedConfig) evalEvery() int {
	if c.EvalEvery > 0 {
		return c.EvalEvery
	}
	return c.InnerSteps
}

// Validate names the first invalid field.
func (c StagedConfig) Validate() error {
	mc, err := model.Preset(c.Preset)
	if err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: staged run: "+format, append([]any{ErrConfig}, args...)...)
	}
	skip := c.Skip()
	switch {
	case c.Stages < 2 || c.Stages-1 > mc.Layers:
		return bad("stages %d outside [2, %d] (every stage after 0 needs one of the %s preset's layers)", c.Stages, mc.Layers+1, mc.Name)
	case c.Replicas < 1:
		return bad("replicas %d must be positive", c.Replicas)
	case c.SkipRatio < 0 || c.SkipRatio >= 1 || math.Abs(c.SkipRatio*float64(c.Stages)-float64(skip)) > 1e-9:
		return bad("skip ratio %v: L = S(1-k) = %v must be a whole number of stages in [1, %d]", c.SkipRatio, float64(c.Stages)*(1-c.SkipRatio), c.Stages)
	case skip > pipeline.DefaultRules().MaxJump:
		return bad("skip ratio %v skips %d stages, more than one jump may (%d)", c.SkipRatio, skip, pipeline.DefaultRules().MaxJump)
	case c.Microbatches < c.Replicas:
		return bad("%d microbatches for %d replicas: every stage-0 replica needs one", c.Microbatches, c.Replicas)
	case c.Batch < 1 || c.SeqLen < 0 || c.SeqLen > mc.MaxT:
		return bad("microbatch %dx%d (sequence length at most %d)", c.Batch, c.SeqLen, mc.MaxT)
	case c.Steps < 1 || c.InnerSteps < 1 || c.EvalBatches < 1 || c.EvalEvery < 0 || c.Threads < 0:
		return bad("steps %d, inner steps %d, eval batches %d must be positive; eval every %d, threads %d not negative",
			c.Steps, c.InnerSteps, c.EvalBatches, c.EvalEvery, c.Threads)
	case c.Mu < 0 || c.mu() > 1<<16:
		return bad("mu %d outside [0, 65536]", c.Mu)
	case c.mu()*c.Replicas < c.Microbatches:
		return bad("mu %d x %d replicas holds fewer than %d microbatches", c.mu(), c.Replicas, c.Microbatches)
	}
	if f := c.Failure; f != nil {
		switch {
		case f.Step < 1 || f.Step >= c.Steps || f.Step%c.InnerSteps != 0:
			return bad("failure at step %d: must be a round boundary (a multiple of %d) before the last step %d", f.Step, c.InnerSteps, c.Steps)
		case f.Recovery != CheckFree && f.Recovery != RandomInit:
			return bad("recovery %q (want %q or %q)", f.Recovery, CheckFree, RandomInit)
		}
		if _, err := pipeline.Recover(f.Stage, c.Stages, c.CheckFreePlus); err != nil {
			return fmt.Errorf("%w: staged run: failure of stage %d: %w", ErrConfig, f.Stage, err)
		}
	}
	a := c.AdamW
	a.TotalSteps = c.Steps
	if err := a.Validate(); err != nil {
		return err
	}
	switch c.StageOuter {
	case DiLoCo:
		return c.DiLoCo.Validate()
	case NoLoCo:
		return c.NoLoCo.Validate()
	}
	return bad("stage outer optimizer %q (want %q or %q)", c.StageOuter, DiLoCo, NoLoCo)
}

// StagedPoint is one validation of a staged run.
type StagedPoint struct {
	Step    int     `json:"step"`
	Seconds float64 `json:"seconds"` // training time so far (validations excluded)
	ValLoss float32 `json:"val_loss"`
}

// StagedResult summarizes a staged run.
type StagedResult struct {
	Curve []StagedPoint `json:"curve"`
	// TrainLoss is each step's mean microbatch loss.
	TrainLoss []float32 `json:"train_loss"`
	// StepSeconds is the mean wall time of a step: relay, AdamW and the
	// DiLoCo rounds, not the validations.
	StepSeconds  float64 `json:"step_seconds"`
	Seconds      float64 `json:"seconds"`
	FinalValLoss float32 `json:"final_val_loss"`
	// With a failure: the validation loss just before and just after the
	// stage was wiped and rebuilt, and the first validated step at which
	// the loss was back at or below the one before (-1: not within the run).
	PreFailure  float32 `json:"pre_failure,omitempty"`
	PostFailure float32 `json:"post_failure,omitempty"`
	RecoveredAt int     `json:"recovered_at"`
}

// RunStaged trains cfg.Steps steps and validates the whole model (replica
// 0 of every stage, all stages in order) on fixed held-out batches.
func RunStaged(ctx context.Context, cfg StagedConfig) (*StagedResult, error) {
	r, err := newStagedRun(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer r.close()
	res := &StagedResult{RecoveredAt: -1}
	var trainTime time.Duration
	record := func(step int) (float32, error) {
		vl, err := r.evaluate()
		if err != nil {
			return 0, err
		}
		p := StagedPoint{Step: step, Seconds: trainTime.Seconds(), ValLoss: vl}
		res.Curve = append(res.Curve, p)
		r.log.Info("eval", "step", step, "val_loss", vl, "seconds", p.Seconds)
		if step > 0 {
			say(cfg.Progress, "step %d: validation loss %.4f, %.2fs/step", step, vl, p.Seconds/float64(step))
		} else {
			say(cfg.Progress, "step 0: validation loss %.4f", vl)
		}
		if cfg.OnEval != nil {
			cfg.OnEval(p)
		}
		return vl, nil
	}
	if _, err := record(0); err != nil {
		return nil, err
	}
	failedAt := -1
	for step := 0; step < cfg.Steps; step++ {
		began := time.Now()
		loss, err := r.step(ctx, step)
		if err != nil {
			return res, err
		}
		trainTime += time.Since(began)
		res.TrainLoss = append(res.TrainLoss, loss)
		done := step + 1
		if done%cfg.evalEvery() == 0 || done == cfg.Steps {
			vl, err := record(done)
			if err != nil {
				return res, err
			}
			if failedAt >= 0 && res.RecoveredAt < 0 && done > failedAt && vl <= res.PreFailure {
				res.RecoveredAt = done
			}
		}
		if f := cfg.Failure; f != nil && done == f.Step {
			res.PreFailure = res.Curve[len(res.Curve)-1].ValLoss
			if res.Curve[len(res.Curve)-1].Step != done {
				if res.PreFailure, err = record(done); err != nil {
					return res, err
				}
			}
			if err := r.fail(*f, done); err != nil {
				return res, err
			}
			if res.PostFailure, err = r.evaluate(); err != nil {
				return res, err
			}
			failedAt = done
			r.log.Info("stage rebuilt", "stage", f.Stage, "recovery", f.Recovery, "before", res.PreFailure, "after", res.PostFailure)
			say(cfg.Progress, "step %d: validation loss %.4f before the loss of stage %d, %.4f after its rebuild", done, res.PreFailure, f.Stage, res.PostFailure)
		}
	}
	res.Seconds = trainTime.Seconds()
	res.StepSeconds = res.Seconds / float64(cfg.Steps)
	res.FinalValLoss = res.Curve[len(res.Curve)-1].ValLoss
	return res, nil
}

// stagedRun is a staged run's machinery: the nodes, their relays, the
// per-stage collectives and the evaluation model.
type stagedRun struct {
	cfg     StagedConfig
	log     *slog.Logger
	mc      model.Config
	T       int
	specs   []model.StageSpec
	pl      pipeline.Placement
	rules   pipeline.Rules
	corpus  *data.Corpus
	nodes   []*trainer.StageReplica // node v = stage v/R, replica v%R
	drivers []*pipeline.RelayDriver
	relay   *transport.MemNetwork
	outer   []*transport.MemNetwork // one per stage
	colls   []optimizer.Collective  // per node (DiLoCo)
	outers  []stageOuter            // per node
	eval    *trainer.Setup
	rctx    context.Context // the drivers' context
	cancel  context.CancelFunc
	closers []func()
	// stageClosers stop each stage's collective.
	stageClosers [][]func()
	adamW        optimizer.AdamWConfig
}

// relayTick is the relays' clock; a hop may take relayHopSeconds before
// its microbatch fails, far past any in-process hop even under -race on a
// loaded machine: a staged run has no faults, and any failed microbatch
// is an error of the run.
const (
	relayTick       = 5 * time.Millisecond
	relayHopSeconds = 120.0
)

func newStagedRun(ctx context.Context, cfg StagedConfig) (_ *stagedRun, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &stagedRun{cfg: cfg, log: cfg.Logger}
	if r.log == nil {
		r.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	r.mc, _ = model.Preset(cfg.Preset)
	if r.T = cfg.SeqLen; r.T == 0 {
		r.T = r.mc.MaxT
	}
	if r.specs, err = pipeline.SplitLayers(r.mc, cfg.Stages); err != nil {
		return nil, err
	}
	r.adamW = cfg.AdamW
	r.adamW.TotalSteps = cfg.Steps
	if r.corpus, err = trainer.OpenCorpus(cfg.Corpus); err != nil {
		return nil, err
	}
	r.closers = append(r.closers, func() { r.corpus.Close() })
	S, R := cfg.Stages, cfg.Replicas
	r.pl = pipeline.Placement{Stages: S, StageOf: make([]int, S*R)}
	for v := range r.pl.StageOf {
		r.pl.StageOf[v] = v / R
	}
	rules := pipeline.DefaultRules()
	r.rules = pipeline.Rules{Stages: S, Skip: cfg.Skip(), MaxJump: rules.MaxJump, MaxSwaps: rules.MaxSwaps, Mu: cfg.mu(), MinStageLoad: 1}

	r.rctx, r.cancel = context.WithCancel(ctx)
	for v := range S * R {
		s := v / R
		dev := kernels.NewCPU(max(cfg.Threads, 1))
		mr := pipeline.ModelRunnerConfig{Device: dev, Model: r.mc, Specs: r.specs, Stage: s, B: cfg.Batch, T: r.T, Seed: cfg.Seed, Mu: cfg.mu()}
		if s == 0 {
			if mr.Batch, err = r.batchSource(); err != nil {
				return nil, err
			}
		}
		runner, err := pipeline.NewModelRunner(mr)
		if err != nil {
			return nil, err
		}
		node := trainer.NewStageReplica(s, v%R, dev, runner)
		r.nodes = append(r.nodes, node)
	}
	r.relay = transport.NewMemNetwork()
	if err := r.startRelays(); err != nil {
		return nil, err
	}
	if err := r.startOuter(); err != nil {
		return nil, err
	}
	ec := trainer.SetupConfig{Preset: cfg.Preset, Batch: cfg.Batch, SeqLen: cfg.SeqLen, Seed: cfg.Seed,
		Dev: kernels.NewCPU(max(cfg.Threads, 1)), Corpus: r.corpus, Workers: 1, AdamW: r.adamW, ValBatches: cfg.EvalBatches}
	if r.eval, err = trainer.NewSetup(ec); err != nil {
		return nil, err
	}
	return r, nil
}

// batchSource gives stage 0 microbatch mb of iteration iter: batch
// iter*M + mb of the one training stream, so a step consumes M distinct
// batches whichever stage-0 replica starts them. Each stage-0 runner gets
// its own loader (a Loader is not safe for concurrent use).
func (r *stagedRun) batchSource() (pipeline.BatchSource, error) {
	l, err := data.NewLoader(r.corpus, data.Train, data.LoaderConfig{Seed: r.cfg.Seed, Workers: 1, B: r.cfg.Batch, T: r.T})
	if err != nil {
		return nil, err
	}
	M := r.cfg.Microbatches
	return func(iter uint64, mb int) ([]int32, []int32, error) {
		n := r.cfg.Batch * r.T
		tok, tgt := make([]int32, n), make([]int32, n)
		if err := l.Batch(int(iter)*M+mb, tok, tgt); err != nil {
			return nil, nil, err
		}
		return tok, tgt, nil
	}, nil
}

// relayConfig is node v's relay.
func (r *stagedRun) relayConfig(v int) pipeline.RelayConfig {
	rc := pipeline.DefaultRelayConfig(r.pl, v, r.nodes[v].Runner().ActivationLen(), relayTick.Seconds())
	rc.Codec.Codec, rc.Mu = r.cfg.Activations, r.cfg.mu()
	rc.HopWait = int64(relayHopSeconds / relayTick.Seconds())
	return rc
}

// peerID is how the relay and the collectives name node v.
func (r *stagedRun) peerID(v int) transport.PeerID {
	return transport.PeerID(fmt.Sprintf("stage%d-replica%d", v/r.cfg.Replicas, v%r.cfg.Replicas))
}

// startRelays starts every node's relay driver over the current nodes.
func (r *stagedRun) startRelays() error {
	ids := make([]transport.PeerID, len(r.nodes))
	for v := range ids {
		ids[v] = r.peerID(v)
	}
	for v, node := range r.nodes {
		d, err := pipeline.NewRelayDriver(r.relay.Join(ids[v]), ids, node.Recorder(), r.relayConfig(v), pipeline.RelayOptions{Tick: relayTick, Logger: r.log})
		if err != nil {
			return err
		}
		d.Start(r.rctx)
		r.drivers = append(r.drivers, d)
	}
	return nil
}

// stopRelays stops every relay driver and its transport.
func (r *stagedRun) stopRelays() {
	for _, d := range r.drivers {
		d.Close()
	}
	r.drivers = nil
}

// startOuter builds each stage's DiLoCo: its own MemNetwork per stage, so
// that the butterfly's members are that stage's replicas only, as in the
// swarm.
func (r *stagedRun) startOuter() error {
	r.colls, r.outers = make([]optimizer.Collective, len(r.nodes)), make([]stageOuter, len(r.nodes))
	r.stageClosers = make([][]func(), r.cfg.Stages)
	if r.cfg.Replicas < 2 {
		return nil // a lone replica has nothing to average
	}
	for s := range r.cfg.Stages {
		if err := r.startStageOuter(s); err != nil {
			return err
		}
	}
	return nil
}

// startStageOuter starts stage s's collective and DiLoCo from its replicas'
// current weights, at round 0.
func (r *stagedRun) startStageOuter(s int) error {
	R := r.cfg.Replicas
	net := transport.NewMemNetwork()
	r.outer = append(r.outer, net)
	members := make([]transport.PeerID, R)
	for k := range R {
		members[k] = r.peerID(s*R + k)
	}
	for k := range R {
		v := s*R + k
		node := r.nodes[v]
		p := net.Join(members[k])
		signer := swarmSigner{p.Self()}
		phi := make([]float32, node.Len())
		node.Params(phi)
		if r.cfg.StageOuter == NoLoCo {
			nc := r.cfg.NoLoCo
			nc.DeltaCodec = codecConfig(r.cfg.Outer)
			nc.Logger = r.log
			n, err := optimizer.NewNoLoCo(r.rctx, nc, p, phi)
			if err != nil {
				return err
			}
			r.stageClosers[s] = append(r.stageClosers[s], n.Close)
			r.outers[v] = nolocoOuter{n}
			continue
		}
		bc := optimizer.DefaultButterflyConfig(node.Len(), signer, swarmTick.Seconds())
		bc.Codec = codecConfig(r.cfg.Outer)
		bc.Robust = optimizer.RobustConfig{} // the plain mean, as in the paper
		bc.ReadyWait, bc.LeaderWait = int64(time.Hour/swarmTick), int64(2*time.Hour/swarmTick)
		d, err := optimizer.NewButterflyDriver(p, bc, optimizer.ButterflyOptions{Tick: swarmTick, Logger: r.log})
		if err != nil {
			return err
		}
		d.Start(r.rctx)
		r.stageClosers[s] = append(r.stageClosers[s], d.Close)
		dl, err := optimizer.NewDiLoCo(r.cfg.DiLoCo, d, phi)
		if err != nil {
			return err
		}
		r.outers[v] = &dilocoOuter{d: dl, cfg: r.cfg.DiLoCo, coll: d}
		r.colls[v] = d
	}
	return nil
}

// stageOuter is one replica's outer optimizer among its stage's replicas.
type stageOuter interface {
	// step takes the outer step from theta, the replica's weights after
	// its inner steps, and leaves the new weights in theta.
	step(ctx context.Context, theta []float32) error
	round() uint64
	// restart makes w the outer state at round, with no momentum: a
	// rebuilt stage's replicas start from it.
	restart(round uint64, w []float32) error
}

type dilocoOuter struct {
	d    *optimizer.DiLoCo
	cfg  optimizer.DiLoCoConfig
	coll optimizer.Collective
}

func (o *dilocoOuter) step(ctx context.Context, theta []float32) error {
	_, err := o.d.OuterStep(ctx, theta)
	return err
}

func (o *dilocoOuter) round() uint64 { return o.d.Round }

func (o *dilocoOuter) restart(round uint64, w []float32) error {
	d, err := optimizer.NewDiLoCo(o.cfg, o.coll, w) // fresh: no history of norms
	if err != nil {
		return err
	}
	o.d = d
	return d.SetState(round, w, make([]float32, len(w)))
}

type nolocoOuter struct{ n *optimizer.NoLoCo }

func (o nolocoOuter) step(ctx context.Context, theta []float32) error {
	_, err := o.n.OuterStep(ctx, theta)
	return err
}

func (o nolocoOuter) round() uint64 { return o.n.Step }

func (o nolocoOuter) restart(round uint64, w []float32) error {
	return o.n.SetState(round, w, make([]float32, len(w)))
}

// stopStageOuter stops stage s's collective (its drivers, then their
// transports).
func (r *stagedRun) stopStageOuter(s int) {
	cs := r.stageClosers[s]
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
	r.stageClosers[s] = nil
}

func (r *stagedRun) close() {
	if r.cancel != nil {
		r.cancel()
	}
	r.stopRelays()
	for s := range r.stageClosers {
		r.stopStageOuter(s)
	}
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
	if r.relay != nil {
		r.relay.Close()
	}
	for _, n := range r.outer {
		n.Close()
	}
}

// paths is iteration iter's schedule, a simple round robin that obeys
// every rule of pipeline.Validate (checked): microbatch m skips the Skip
// stages of 1..S-1 starting at m*Skip (cyclically), so that each stage
// gets its share; the k-th microbatch to visit stage s goes to its replica
// (k + s*iter) mod R, which spreads every stage's work evenly over its
// replicas and changes which replicas work together from one iteration
// to the next.
func (r *stagedRun) paths(iter uint64) ([]pipeline.Path, error) {
	rs := pipeline.RotatingSchedule{Microbatches: r.cfg.Microbatches, Skip: r.cfg.Skip(), Seed: r.cfg.Seed,
		Random: r.cfg.RandomRouting, CheckFreePlus: r.cfg.CheckFreePlus}
	paths := rs.Paths(r.pl, iter)
	if err := pipeline.Validate(paths, r.pl, r.rules); err != nil {
		return nil, fmt.Errorf("experiment: the staged schedule of iteration %d: %w", iter, err)
	}
	return paths, nil
}

// step runs 0-based step: the relay's iteration step+1, every replica's
// AdamW step, and a DiLoCo round when step+1 ends one. It returns the mean
// microbatch loss.
func (r *stagedRun) step(ctx context.Context, step int) (float32, error) {
	iter := uint64(step + 1)
	paths, err := r.paths(iter)
	if err != nil {
		return 0, err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	outs := make([][]pipeline.Outcome, len(r.drivers))
	errs := make([]error, len(r.drivers))
	var wg sync.WaitGroup
	for v, d := range r.drivers {
		wg.Go(func() { outs[v], errs[v] = d.Run(rctx, iter, paths) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, fmt.Errorf("experiment: staged step %d: %w", step, err)
	}
	var sum float64
	var n int
	for v, got := range outs {
		for _, o := range got {
			if o.Err != nil {
				return 0, fmt.Errorf("experiment: staged step %d: node %d, microbatch %d: %w", step, v, o.MB, o.Err)
			}
			if o.Hop == 0 {
				sum += float64(o.Loss)
				n++
			}
		}
	}
	if n != r.cfg.Microbatches {
		return 0, fmt.Errorf("experiment: staged step %d: %d of %d microbatches reported a loss", step, n, r.cfg.Microbatches)
	}
	for _, node := range r.nodes {
		if _, err := node.Step(r.adamW, step); err != nil {
			return 0, err
		}
	}
	if (step+1)%r.cfg.InnerSteps == 0 {
		if err := r.outerStep(ctx); err != nil {
			return 0, fmt.Errorf("experiment: staged step %d: %w", step, err)
		}
	}
	return float32(sum / float64(n)), nil
}

// outerStep runs one DiLoCo round in every stage at once; afterwards every
// replica of a stage holds that stage's phi.
func (r *stagedRun) outerStep(ctx context.Context) error {
	if r.cfg.Replicas < 2 {
		return nil
	}
	errs := make([]error, len(r.nodes))
	var wg sync.WaitGroup
	for v, node := range r.nodes {
		wg.Go(func() {
			theta := make([]float32, node.Len())
			node.Params(theta)
			if err := r.outers[v].step(ctx, theta); err != nil {
				errs[v] = fmt.Errorf("stage %d replica %d: %s: %w", node.Stage(), node.Replica(), r.cfg.StageOuter, err)
				return
			}
			node.SetParams(theta)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// wholeParams assembles the whole model from replica 0 of every stage, by
// tensor name, in model.FullSpec's layout.
func (r *stagedRun) wholeParams() ([]float32, error) {
	out := make([]float32, 0, r.mc.NumParams())
	R := r.cfg.Replicas
	for _, t := range model.Layout(r.mc, model.FullSpec(r.mc)) {
		var x []float32
		for s := range r.cfg.Stages {
			if x = r.nodes[s*R].Tensor(t.Name); x != nil {
				break
			}
		}
		if len(x) != t.Size() {
			return nil, fmt.Errorf("experiment: tensor %s of the whole model: %d values on the stages, want %d", t.Name, len(x), t.Size())
		}
		out = append(out, x...)
	}
	return out, nil
}

// evaluate is the whole model's validation loss on the fixed held-out
// batches.
func (r *stagedRun) evaluate() (float32, error) {
	p, err := r.wholeParams()
	if err != nil {
		return 0, err
	}
	if len(p) != r.eval.Stage.NumParams() {
		return 0, fmt.Errorf("experiment: %d assembled parameters, the model has %d", len(p), r.eval.Stage.NumParams())
	}
	r.eval.Dev.CopyIn(r.eval.Stage.Params, p)
	return r.eval.Eval()
}

// rebuilt returns the weights that replace lost stage f.Stage: CheckFree's
// weighted average of its neighbours (replica 0 of each: after a round all
// replicas agree), each weighted by the mean over its replicas of their
// last gradient norms; or a fresh random initialization.
func (r *stagedRun) rebuilt(f StageFailure) ([]float32, error) {
	R := r.cfg.Replicas
	lost := r.nodes[f.Stage*R]
	dst := make([]float32, lost.Len())
	switch f.Recovery {
	case RandomInit:
		// The stage's own tensors, freshly drawn with another seed: what a
		// replacement node with no checkpoint would start from.
		return lost.FreshWeights(r.mc, r.specs[f.Stage], r.cfg.Seed^0x5eed_dead_beef)
	case CheckFree:
		rec, err := pipeline.Recover(f.Stage, r.cfg.Stages, r.cfg.CheckFreePlus)
		if err != nil {
			return nil, err
		}
		if rec.Copy() { // CheckFree+: an edge stage is its swap partner's copy
			w, _, err := r.neighbour(rec.From[0])
			if err != nil {
				return nil, err
			}
			return trainer.CopyLayers(lost, r.specs[f.Stage], r.nodes[rec.From[0]*R], r.specs[rec.From[0]], w)
		}
		prev, next := r.nodes[rec.From[0]*R], r.nodes[rec.From[1]*R]
		if prev.Len() != lost.Len() || next.Len() != lost.Len() {
			return nil, fmt.Errorf("%w: stage %d (%d parameters) cannot be rebuilt from stages %d and %d (%d and %d)",
				ErrConfig, f.Stage, lost.Len(), rec.From[0], rec.From[1], prev.Len(), next.Len())
		}
		pw, pn, err := r.neighbour(rec.From[0])
		if err != nil {
			return nil, err
		}
		nw, nn, err := r.neighbour(rec.From[1])
		if err != nil {
			return nil, err
		}
		if err := pipeline.Rebuild(dst, pw, nw, pn, nn); err != nil {
			return nil, err
		}
		return dst, nil
	}
	return nil, fmt.Errorf("%w: recovery %q", ErrConfig, f.Recovery)
}

// neighbour is stage s's weights (replica 0's) and the mean of its
// replicas' last gradient norms.
func (r *stagedRun) neighbour(s int) ([]float32, float64, error) {
	R := r.cfg.Replicas
	w := make([]float32, r.nodes[s*R].Len())
	var sum float64
	for k := range R {
		sum += r.nodes[s*R+k].LastNorm()
	}
	r.nodes[s*R].Params(w)
	return w, sum / float64(R), nil
}

// fail wipes every replica of stage f.Stage after step done and installs
// the rebuilt weights with a fresh optimizer; the stage's DiLoCo members
// restart from the rebuilt weights (zero momentum) at the current round,
// as a replacement node would after taking the run's state.
func (r *stagedRun) fail(f StageFailure, done int) error {
	R := r.cfg.Replicas
	round := uint64(0)
	if o := r.outers[f.Stage*R]; o != nil {
		round = o.round()
	}
	began := time.Now()
	w, err := r.rebuilt(f)
	if err != nil {
		return err
	}
	if f.Recovery == CheckFree {
		rec, _ := pipeline.Recover(f.Stage, r.cfg.Stages, r.cfg.CheckFreePlus)
		if rec.Copy() {
			say(r.cfg.Progress, "step %d: stage %d rebuilt by CheckFree+ as a copy of its swap partner, stage %d, in %.2fs", done, f.Stage, rec.From[0], time.Since(began).Seconds())
		} else {
			say(r.cfg.Progress, "step %d: stage %d rebuilt by CheckFree from stages %d and %d in %.2fs", done, f.Stage, rec.From[0], rec.From[1], time.Since(began).Seconds())
		}
	}
	for k := range R {
		node := r.nodes[f.Stage*R+k]
		node.SetParams(w)
		node.FreshOptimizer(done, pipeline.RebuildLRFactor)
	}
	for k := range R {
		if o := r.outers[f.Stage*R+k]; o != nil {
			if err := o.restart(round, w); err != nil {
				return err
			}
		}
	}
	return nil
}
