package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/pipeline"
	"github.com/skein-ml/skein/telemetry"
	"github.com/skein-ml/skein/trainer"
	"github.com/skein-ml/skein/transport"
)

// The staged side of a volunteer (a manifest with [pipeline] stages > 1):
// the bootstrap places the volunteers in stages (bootstrap/stageplan.go)
// and publishes the placement as a pipeline.Assignment; this volunteer asks
// for it every half second, holds the stage it is given, and runs the
// run's iterations in step with the others: every member computes the same
// schedule for an iteration (the manifest's RotatingSchedule over the
// placement), the SkipPipe relay carries activations and their gradients
// along the paths over p2p.ProtoActivations, and each member takes an
// AdamW step on the gradient of the microbatches that visited it. Every H
// iterations the replicas of a stage average with DiLoCo among themselves
// (a butterfly over p2p.ProtoStageReduce(s)).
//
// A re-plan takes effect at the iteration the Assignment names. A member
// new to its stage takes the stage's outer state from the members that
// held it before (bulk key stageStateKey; pickState: a strict majority of
// the holders the bootstrap's plan names must serve the same state); when the stage lost every
// member, the newcomers rebuild it with CheckFree from the weights and last
// gradient norms the neighbouring stages' survivors serve (stageWeightsKey;
// pipeline.Combine takes their medians), with a fresh optimizer at
// pipeline.RebuildLRFactor times the learning rate.
//
// Trust: plans come only from the bootstrap this volunteer dialled (its
// --bootstrap peer IDs), never from a member that calls itself one, and a
// plan's epoch moves by one. The relay refuses a neighbour's tensor that is
// not finite or is outsized (pipeline.TensorBounds), and an iteration whose
// gradient is not finite anyway is dropped (rollback): the volunteer never
// exits for what a neighbour sends. A rebuild takes the medians of what
// the neighbouring stages' survivors serve (combineServed), leaving out
// weights that are not finite and capping claimed norms at the run's
// clip; the relay and the rebuild name the member that sent either as an
// offender in the log.
//
// The chaos soak's hostile volunteers (VolunteerConfig.Hostile) lie only
// where they send: HostileStagedGrad through its relay's outgoing tensors
// (pipeline.RelayConfig.Hostile), HostileCheckFreeNorm in the stage
// weights it serves (checkFreeLie).
//
// Not built yet: local checkpoints of a stage (a restarted volunteer is a
// newcomer), NoLoCo between a stage's replicas, and the whole model's
// validation loss (no member holds it).

// Bulk keys of a staged volunteer.
const (
	stageWeightsKey = "stage-weights" // pipeline.EncodeStageWeights: last gradient norm, parameters
	stageStateKey   = "stage-state"   // encodeState: the stage's DiLoCo round, phi, momentum
)

// Timing of a staged volunteer.
const (
	planPoll      = 500 * time.Millisecond // how often the bootstrap is asked for the plan
	relayTick     = 5 * time.Millisecond
	minHopWait    = 1500 * time.Millisecond // the least budget of one hop (hopWait)
	failedPause   = time.Second             // the wait after an iteration where every microbatch failed
	announceEvery = 500 * time.Millisecond
	stagedOuterW  = 2 * time.Minute // a stage's collective: how long a message may take
)

// stagedVolunteer is a volunteer's part in a staged run.
type stagedVolunteer struct {
	v      *Volunteer
	mc     model.Config
	specs  []model.StageSpec
	adamW  optimizer.AdamWConfig
	sched  pipeline.RotatingSchedule
	loader *data.Loader // stage 0's microbatches
	T      int

	newest  atomic.Pointer[pipeline.Assignment] // the newest plan the bootstrap served
	boots   []peer.ID                           // the bootstraps whose plans are taken (--bootstrap)
	refused uint64                              // the last epoch refused as a jump (logged once)

	plan  *pipeline.Assignment // the plan iterations run under now
	self  int                  // this member's node index in plan
	rep   *trainer.StageReplica
	relay *pipeline.RelayDriver
	relP  *p2p.Peers
	outP  *p2p.Peers
	coll  *optimizer.ButterflyDriver
	ctx   context.Context // the stage's drivers run under it (runCtx)
	stopC context.CancelFunc
	dl    *optimizer.DiLoCo
	iter  uint64 // the last iteration run
	// stalled is set while a member of the plan is gone (gone).
	stalled   bool
	announced time.Time // the last announce

	mu      sync.Mutex
	weights []byte // served under stageWeightsKey
	state   []byte // served under stageStateKey
	lies    int    // stage weights served by a HostileCheckFreeNorm volunteer (checkFreeLie)

	reports int // rounds reported (report)

	// Since the last report.
	losses   []float32
	started  int // microbatches started here
	failed   int
	compute  float64
	reportAt time.Time
}

// initStaged prepares a staged run's volunteer: the model's stages and the
// data stream; the stage itself waits for the bootstrap's plan.
func (v *Volunteer) initStaged(corpus *data.Corpus) error {
	m := v.run
	if err := m.CheckStaged(); err != nil {
		return fmt.Errorf("%w: run %q: %w", ErrUnsupported, m.RunID, err)
	}
	mc, err := model.Preset(m.Model.Preset)
	if err != nil {
		return err
	}
	specs, err := pipeline.SplitLayers(mc, m.Pipeline.Stages)
	if err != nil {
		return err
	}
	// Any stage may be this volunteer's: refuse now if the largest does not
	// fit (stage DiLoCo keeps its outer state beside the replica).
	if err := trainer.CheckStageMemory(mc, specs, m.Model.Batch, m.SeqLen(), dilocoHostCopies,
		uint64(v.cfg.MaxMemoryMiB)<<20, v.dev); err != nil {
		if v.cfg.MaxMemoryMiB > 0 {
			err = fmt.Errorf("%w (the cap this volunteer was given: --max-memory %d MiB)", err, v.cfg.MaxMemoryMiB)
		}
		return err
	}
	boots, err := planSources(v.cfg.Bootstrap)
	if err != nil {
		return err
	}
	st := &stagedVolunteer{v: v, mc: mc, specs: specs, sched: m.Schedule(), T: m.SeqLen(), reportAt: time.Now(), boots: boots}
	st.adamW = optimizer.DefaultAdamW()
	st.adamW.LR, st.adamW.Warmup, st.adamW.TotalSteps, st.adamW.WeightDecay, st.adamW.Clip = m.Optimizer.InnerLR,
		m.Optimizer.Warmup, m.Optimizer.TotalSteps, m.Optimizer.WeightDecay, m.Optimizer.GradClip
	if st.loader, err = data.NewLoader(corpus, data.Train, data.LoaderConfig{Seed: m.Model.Seed, Workers: 1, B: m.Model.Batch, T: st.T}); err != nil {
		return err
	}
	v.corpus, v.st = corpus, st
	return nil
}

// batch is stage 0's microbatch mb of iteration iter: batch iter*M + mb of
// the run's one training stream, whichever stage-0 member starts it.
func (st *stagedVolunteer) batch(iter uint64, mb int) ([]int32, []int32, error) {
	n := st.v.run.Model.Batch * st.T
	tok, tgt := make([]int32, n), make([]int32, n)
	if err := st.loader.Batch(int(iter)*st.sched.Microbatches+mb, tok, tgt); err != nil {
		return nil, nil, err
	}
	return tok, tgt, nil
}

// runStaged trains until ctx ends or cfg.Rounds outer rounds are done.
func (v *Volunteer) runStaged(ctx context.Context) error {
	st := v.st
	defer st.close()
	pctx, stopPoll := context.WithCancel(ctx)
	defer stopPoll()
	go st.pollPlans(pctx)
	say(v.cfg.Progress, "staged run: waiting for the bootstrap to place this volunteer in one of %d stages", v.run.Pipeline.Stages)
	waiting := false
	for ctx.Err() == nil {
		next := st.iter + 1
		// A newer plan is taken at its first iteration; at once by a member
		// the current plan leaves out, or whose plan has lost a member (it
		// waits instead of running iterations whose microbatches cannot
		// get through: it skips ahead to the new plan's first iteration).
		if a := st.newest.Load(); a != nil && (st.plan == nil || a.Epoch > st.plan.Epoch) &&
			(st.plan == nil || st.self < 0 || st.stalled || a.Start <= next) {
			if err := st.take(ctx, *a); err != nil {
				if ctx.Err() != nil {
					break
				}
				if !errors.Is(err, errSuperseded) {
					v.log.Warn("taking the stage plan", "epoch", a.Epoch, "err", err)
					say(v.cfg.Progress, "could not take stage plan %d (%v); retrying", a.Epoch, err)
					sleep(ctx, failedPause)
				}
				continue
			}
			next = st.iter + 1
		}
		if st.plan == nil || st.self < 0 {
			if st.plan != nil && !waiting {
				say(v.cfg.Progress, "not placed in plan %d (a spare); waiting for a re-plan", st.plan.Epoch)
				waiting = true
			}
			sleep(ctx, planPoll)
			continue
		}
		waiting = false
		if gone := st.gone(); len(gone) > 0 {
			// A member of the plan has left: wait for the bootstrap's
			// re-plan instead of running iterations that cannot complete.
			if !st.stalled {
				say(v.cfg.Progress, "iteration %d: %s left the run; waiting for the bootstrap to re-plan", next, strings.Join(gone, ", "))
				st.stalled = true
				st.announce(true)
			}
			st.announce(false)
			sleep(ctx, planPoll)
			continue
		}
		st.stalled = false
		// Members run the same iteration at about the same time: one that
		// is behind (it joined on an old count, or was slow) jumps to
		// where the others are instead of failing every microbatch.
		if r := st.ahead(*st.plan); r >= next {
			say(v.cfg.Progress, "behind the run: skipping from iteration %d to %d", next, r+1)
			st.iter, next = r, r+1
		}
		if err := st.iterate(ctx, next); err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		if v.cfg.Rounds > 0 && st.reports >= v.cfg.Rounds {
			return nil // --rounds: this volunteer's rounds, wherever in the run it joined
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// announce gossips this member's stage and last iteration (the bootstrap
// plans from them), at most every announceEvery unless now is set. It does
// not wait for the broadcast: the update is queued, and gossip carries it.
func (st *stagedVolunteer) announce(now bool) {
	if !now && time.Since(st.announced) < announceEvery {
		return
	}
	st.announced = time.Now()
	stage := int16(-1)
	if st.plan != nil && st.self >= 0 {
		stage = int16(st.plan.StageOf[st.self])
	}
	if err := st.v.pn.AnnounceMeta(func(m *p2p.Meta) { m.Stage, m.Round = stage, st.iter }); err != nil {
		st.v.log.Debug("announcing the stage", "err", err)
	}
}

// ahead is the latest iteration at least two of the other members of a
// announce having reached (reachedByTwo): where the run is, which a lone
// member announcing a far iteration does not move (with the latest one
// announced, one member announcing 2^62 moved every member's count there).
// Not the majority's: a member behind half of the plan then jumped short of
// the iteration the others run, failed its microbatches and stayed behind
// (TestStagedVolunteers under load).
func (st *stagedVolunteer) ahead(a pipeline.Assignment) uint64 {
	var rounds []uint64
	self := st.v.pn.ID()
	for _, m := range st.v.pn.Members() {
		if m.ID != self && m.Meta.Role == p2p.RoleVolunteer && a.Index(m.ID.String()) >= 0 {
			rounds = append(rounds, m.Meta.Round)
		}
	}
	return reachedByTwo(rounds)
}

// reachedByTwo is the largest r that two of rounds are at or past (the
// second largest; the only one of one; 0 for none). Breakdown: two
// members announcing the same far iteration.
func reachedByTwo(rounds []uint64) uint64 {
	if len(rounds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(rounds))
	return s[len(s)-min(2, len(s))]
}

// errSuperseded: the plan being taken was replaced by a newer one.
var errSuperseded = errors.New("node: a newer stage plan came")

// waitFor waits until member id announces iteration iter or later, or is
// gone, or a minute has passed; errSuperseded when a newer plan than a
// comes meanwhile (the run may never reach a's first iteration).
func (st *stagedVolunteer) waitFor(ctx context.Context, a pipeline.Assignment, id string, iter uint64) error {
	deadline := time.Now().Add(time.Minute)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if n := st.newest.Load(); n != nil && n.Epoch > a.Epoch {
			return errSuperseded
		}
		m, ok := st.v.pn.Member(peerID(id))
		if !ok || m.Meta.Round >= iter {
			return nil
		}
		sleep(ctx, 50*time.Millisecond)
	}
	return ctx.Err()
}

// gone lists the members of the plan that are not in the membership any
// more, by short ID.
func (st *stagedVolunteer) gone() []string {
	live := map[string]bool{}
	for _, m := range st.v.pn.Members() {
		live[m.ID.String()] = true
	}
	var out []string
	for _, id := range st.plan.Peers {
		if !live[id] {
			out = append(out, shortPeer(peerID(id)))
		}
	}
	return out
}

// planSources are the peers whose stage plans a volunteer takes: the
// bootstraps it was given, by the peer ID it dials them at. A member that
// signs role bootstrap is not one (any member can).
func planSources(addrs []string) ([]peer.ID, error) {
	var ids []peer.ID
	for _, a := range addrs {
		ai, err := peer.AddrInfoFromString(a)
		if err != nil {
			return nil, fmt.Errorf("%w: --bootstrap %q: %w", ErrConfig, a, err)
		}
		ids = append(ids, ai.ID)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: a staged run takes its stage plans from its bootstrap: give its --bootstrap address", ErrConfig)
	}
	return ids, nil
}

// pollPlans asks the run's bootstrap for the plan every planPoll.
func (st *stagedVolunteer) pollPlans(ctx context.Context) {
	for ctx.Err() == nil {
		st.pollOnce(ctx)
		sleep(ctx, planPoll)
	}
}

// pollOnce asks the bootstraps this volunteer was given for their plan and
// keeps a newer one if its epoch is the next (or this volunteer has none):
// a plan of epoch 2^64-1 would otherwise win for good. A volunteer that
// missed a plan (its bootstrap re-planned twice while it could not reach
// it) keeps its plan and says so.
func (st *stagedVolunteer) pollOnce(ctx context.Context) {
	for _, id := range st.boots {
		if _, ok := st.v.pn.Member(id); !ok {
			continue
		}
		a, err := fetchPlan(ctx, st.v.pn, id)
		if err != nil || a == nil {
			st.v.log.Debug("stage plan", "bootstrap", id, "err", err)
			continue
		}
		cur := st.newest.Load()
		switch {
		case cur != nil && a.Epoch <= cur.Epoch:
		case cur != nil && a.Epoch != cur.Epoch+1:
			if st.refused != a.Epoch {
				st.refused = a.Epoch
				st.v.log.Warn("refused a stage plan: its epoch is not the next", "bootstrap", id, "epoch", a.Epoch, "current", cur.Epoch)
			}
		default:
			st.newest.Store(a)
		}
	}
}

// fetchPlan asks one bootstrap for its plan; nil when it has none yet.
func fetchPlan(ctx context.Context, n *p2p.Node, id peer.ID) (*pipeline.Assignment, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := n.Open(ctx, id, p2p.ProtoStagePlan, p2p.MessageFrameConfig(pipeline.MaxAssignmentBytes))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	typ, b, err := s.ReadFrame()
	if err != nil {
		s.Reset()
		return nil, err
	}
	switch typ {
	case pipeline.NoAssignmentFrame:
		return nil, nil
	case pipeline.AssignmentFrame:
		a, err := pipeline.ParseAssignment(b)
		if err != nil {
			return nil, err
		}
		return &a, nil
	}
	return nil, fmt.Errorf("node: %s answered the stage plan with frame type %d", id, typ)
}

// take makes a the plan iterations run under from a.Start on: this
// member's stage (built, or taken from a survivor, or rebuilt), the relay
// over the new placement, and the stage's collective among its members.
func (st *stagedVolunteer) take(ctx context.Context, a pipeline.Assignment) error {
	v := st.v
	self := a.Index(v.pn.ID().String())
	// The plan's first iteration, or where its members are if the plan
	// came late (a run that started without us, or a slow re-plan).
	st.iter = max(st.iter, a.Start-1, st.ahead(a))
	if self < 0 {
		st.stopStage()
		st.plan, st.self = &a, -1
		return nil
	}
	s := a.StageOf[self]
	how := ""
	if st.rep == nil || st.rep.Stage() != s {
		// New to the stage: the relay goes up first (it keeps what the
		// others send for the plan's first iteration until this member
		// begins it), then the weights come.
		st.stopStage()
		rep, err := st.newReplica(s)
		if err != nil {
			return err
		}
		st.rep = rep
		from, err := func() (start, error) {
			if err := st.startRelay(ctx, a, self); err != nil {
				return start{}, err
			}
			from, err := st.startingWeights(ctx, a, s, rep)
			if err != nil {
				return start{}, err
			}
			rep.SetParams(from.w)
			if from.lr != 1 {
				rep.FreshOptimizer(int(st.iter), from.lr)
			}
			if from.mom == nil {
				from.mom = make([]float32, len(from.w))
			}
			return from, st.startOuter(a, s, from)
		}()
		if err != nil {
			st.stopStage()
			return err
		}
		how = from.how
	} else {
		if err := st.restartOuter(a, s); err != nil {
			return err
		}
		if err := st.startRelay(ctx, a, self); err != nil {
			return err
		}
	}
	st.plan, st.self = &a, self
	st.publish()
	st.announce(true)
	line := fmt.Sprintf("stage plan %d: stage %d of %d (%s) with %d replica(s), from iteration %d", a.Epoch, s, a.Stages,
		st.specs[s].Holds(), len(a.Members(s)), a.Start)
	if how != "" {
		line += "; " + how
	}
	say(v.cfg.Progress, "%s", line)
	return nil
}

// newReplica builds this member's replica of stage s from the run's seed
// (every member draws the same initial weights for a stage).
func (st *stagedVolunteer) newReplica(s int) (*trainer.StageReplica, error) {
	m := st.v.run
	dev := st.v.dev
	mr := pipeline.ModelRunnerConfig{Device: dev, Model: st.mc, Specs: st.specs, Stage: s, B: m.Model.Batch, T: st.T,
		Seed: m.Model.Seed, Mu: st.sched.Microbatches}
	if s == 0 {
		mr.Batch = st.batch
	}
	runner, err := pipeline.NewModelRunner(mr)
	if err != nil {
		return nil, err
	}
	return trainer.NewStageReplica(s, 0, dev, runner), nil
}

// start is what a member new to its stage starts from.
type start struct {
	w, mom []float32 // the weights (phi) and the outer momentum (nil: zero)
	round  uint64    // the stage's outer round
	lr     float64   // the factor on the learning rate (a fresh optimizer when not 1)
	how    string    // how it got them, for the console
}

// startingWeights are the weights a member new to stage s starts from, the
// stage's outer state, the factor on its learning rate and how it got
// them: the seed's in the first plan; a survivor's outer state (phi) when
// the stage has one; else CheckFree's rebuild from the neighbouring
// stages (fresh optimizer, RebuildLRFactor).
func (st *stagedVolunteer) startingWeights(ctx context.Context, a pipeline.Assignment, s int, rep *trainer.StageReplica) (start, error) {
	w := make([]float32, rep.Len())
	rep.Params(w)
	round := st.iter / uint64(st.v.run.Optimizer.InnerSteps)
	if a.Epoch == 1 && a.Start == 1 {
		return start{w: w, lr: 1}, nil
	}
	self := st.v.pn.ID().String()
	var others []string
	for _, u := range a.Survivors(s) {
		if a.Peers[u] != self {
			others = append(others, a.Peers[u])
		}
	}
	if len(others) > 0 {
		// The survivors' outer state as they enter the plan: this member
		// must start the stage's next outer round from the same state
		// (round, phi, momentum), and a survivor may take rounds alone
		// until the plan's first iteration.
		for _, id := range others {
			if err := st.waitFor(ctx, a, id, a.Start-1); err != nil {
				return start{}, err
			}
		}
		h, ok := pickState(st.stageStates(ctx, others, rep.Len()), len(others), 0)
		if !ok {
			// Members hold the stage, but no majority of them answered with
			// one state (gone before the bootstrap noticed, or lying):
			// retry, or wait for the re-plan, rather than throw the stage's
			// training away.
			return start{}, fmt.Errorf("no majority of the %d members of stage %d serve the same state", len(others), s)
		}
		return start{w: h.phi, mom: h.mom, round: h.round, lr: 1, how: fmt.Sprintf("took the stage's weights from %s", h.from)}, nil
	}
	// The stage lost every member: CheckFree from its neighbours.
	rec, err := pipeline.Recover(s, a.Stages, st.v.run.Pipeline.CheckFreePlus)
	if err != nil {
		// An edge stage without CheckFree+ has no pair of neighbours to
		// rebuild from: it starts afresh (what the paper compares CheckFree
		// against), and the console says why.
		w, ferr := rep.FreshWeights(st.mc, st.specs[s], st.v.run.Model.Seed^0x5eed_dead_beef^a.Epoch)
		if ferr != nil {
			return start{}, ferr
		}
		return start{w: w, round: round, lr: pipeline.RebuildLRFactor,
			how: fmt.Sprintf("stage %d was lost and CheckFree cannot rebuild it (%v): started it from fresh weights", s, err)}, nil
	}
	neighbour := func(ns, n int) ([]float32, float64, error) { return st.neighbourWeights(ctx, a, ns, n) }
	if rec.Copy() {
		partner, err := st.newReplica(rec.From[0])
		if err != nil {
			return start{}, err
		}
		pw, _, err := neighbour(rec.From[0], partner.Len())
		if err != nil {
			return start{}, err
		}
		w, err := trainer.CopyLayers(rep, st.specs[s], partner, st.specs[rec.From[0]], pw)
		if err != nil {
			return start{}, err
		}
		return start{w: w, round: round, lr: pipeline.RebuildLRFactor,
			how: fmt.Sprintf("stage %d was lost: rebuilt by CheckFree+ as a copy of stage %d", s, rec.From[0])}, nil
	}
	pw, pn, err := neighbour(rec.From[0], rep.Len())
	if err != nil {
		return start{}, err
	}
	nw, nn, err := neighbour(rec.From[1], rep.Len())
	if err != nil {
		return start{}, err
	}
	if err := pipeline.Rebuild(w, pw, nw, pn, nn); err != nil {
		return start{}, err
	}
	return start{w: w, round: round, lr: pipeline.RebuildLRFactor,
		how: fmt.Sprintf("stage %d was lost: rebuilt by CheckFree from stages %d and %d", s, rec.From[0], rec.From[1])}, nil
}

func (st *stagedVolunteer) fetch(ctx context.Context, id, key string, size int) ([]byte, error) {
	p, err := peer.Decode(id)
	if err != nil {
		return nil, err
	}
	buf := make(memWriterAt, size)
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := st.v.pn.Fetch(fctx, p, key, buf, p2p.FetchOptions{Length: int64(size)}); err != nil {
		return nil, err
	}
	return buf, nil
}

// heldState is a stage's outer state as one member served it.
type heldState struct {
	from     string // short peer ID
	round    uint64
	phi, mom []float32
}

// stageStates fetches a stage's outer state from its members ids (of n
// parameters); those that do not answer with one are left out.
func (st *stagedVolunteer) stageStates(ctx context.Context, ids []string, n int) []heldState {
	var out []heldState
	for _, id := range ids {
		b, err := st.fetch(ctx, id, stageStateKey, int(stateSize(n)))
		if err == nil {
			h := heldState{from: shortPeer(peerID(id))}
			if h.round, h.phi, h.mom, err = decodeState(b, n); err == nil {
				out = append(out, h)
				continue
			}
		}
		st.v.log.Warn("stage state", "peer", id, "err", err)
	}
	return out
}

// pickState decides which of the states the other members of a stage
// served a member takes (joining the stage, or after a failed round): the
// state (optimizer.StateHashOf: round, phi, momentum) that a strict
// majority of holders, the members the bootstrap's plan says hold the
// stage (answering or not), serve, at or after minRound; ok is false when
// none is. At most one state can be it, so the round a member claims
// decides nothing: with "two members agree, latest round first" two sybils
// among four holders took every newcomer to a round of their choosing. One
// member's word is enough only where it alone holds the stage.
func pickState(got []heldState, holders int, minRound uint64) (h heldState, ok bool) {
	count := map[uint64]int{}
	hashes := make([]uint64, len(got))
	for i, g := range got {
		hashes[i] = optimizer.StateHashOf(g.round, g.phi, g.mom)
		count[hashes[i]]++
	}
	for i, g := range got {
		if g.round >= minRound && 2*count[hashes[i]] > holders {
			return g, true
		}
	}
	return heldState{}, false
}

// neighbourWeights is stage ns's weights (of n parameters) and gradient
// norm for a rebuild: what the survivors of stage ns in plan a serve,
// combined (combineServed).
func (st *stagedVolunteer) neighbourWeights(ctx context.Context, a pipeline.Assignment, ns, n int) ([]float32, float64, error) {
	var served []servedWeights
	for _, u := range a.Survivors(ns) {
		b, err := st.fetch(ctx, a.Peers[u], stageWeightsKey, pipeline.StageWeightsSize(n))
		served = append(served, servedWeights{peer: a.Peers[u], b: b, err: err})
	}
	return combineServed(st.v.log, ns, served, n, st.adamW.Clip)
}

// servedWeights is what one survivor of a neighbouring stage served
// under stageWeightsKey, or why it served nothing.
type servedWeights struct {
	peer string
	b    []byte
	err  error
}

// combineServed decodes what the survivors of stage ns served and takes
// their medians (pipeline.Combine, norms capped at the run's gradient
// clip). A survivor whose weights do not decode (a value or the norm not
// finite, the wrong size) is left out and named as an offender; so is one
// that claims a norm past clip, which an honest replica never serves
// (trainer.StageReplica.LastNorm is its clipped norm), though its weights
// count (the cap and the median bound its claim).
func combineServed(log *slog.Logger, ns int, served []servedWeights, n int, clip float64) ([]float32, float64, error) {
	var got []pipeline.Survivor
	for _, s := range served {
		if s.err != nil {
			log.Warn("neighbour weights", "stage", ns, "peer", s.peer, "err", s.err)
			continue
		}
		norm, w, err := pipeline.DecodeStageWeights(s.b, n)
		if err != nil {
			log.Warn("refused a survivor's stage weights for CheckFree", "stage", ns, "offender", s.peer, "err", err)
			continue
		}
		if clip > 0 && norm > clip {
			log.Warn("a survivor claims a gradient norm past the run's clip for CheckFree: capped", "stage", ns,
				"offender", s.peer, "norm", norm, "clip", clip)
		}
		got = append(got, pipeline.Survivor{Weights: w, Norm: norm})
	}
	if len(got) == 0 {
		return nil, 0, fmt.Errorf("no member of stage %d serves its weights", ns)
	}
	w := make([]float32, n)
	norm, err := pipeline.Combine(w, got, clip)
	return w, norm, err
}

// startRelay starts the relay over a's placement, or switches the running
// one to it.
func (st *stagedVolunteer) startRelay(ctx context.Context, a pipeline.Assignment, self int) error {
	v := st.v
	ids := make([]transport.PeerID, len(a.Peers))
	for i, id := range a.Peers {
		ids[i] = transport.PeerID(id)
	}
	pl := a.Placement()
	cfg := pipeline.DefaultRelayConfig(pl, self, st.rep.Runner().ActivationLen(), relayTick.Seconds())
	cfg.Mu = st.sched.Microbatches
	cfg.HopWait = int64(st.hopWait() / relayTick)
	cfg.Hostile = v.cfg.Hostile == HostileStagedGrad
	if st.relay != nil {
		return st.relay.Switch(ctx, ids, st.rep.Recorder(), cfg)
	}
	var err error
	if st.relP, err = p2p.NewPeers(v.pn, p2p.ProtoActivations, uint32(min(cfg.MaxMessage(), math.MaxUint32)), time.Minute); err != nil {
		return err
	}
	if st.relay, err = pipeline.NewRelayDriver(st.relP, ids, st.rep.Recorder(), cfg, pipeline.RelayOptions{Tick: relayTick, Logger: v.log}); err != nil {
		return err
	}
	st.relay.Start(st.runCtx())
	return nil
}

// hopWait is one hop's budget in the relay (a microbatch's deadline is a
// few of them): minHopWait plus four times the estimated compute of a
// stage's share of the iteration on the reference machine (pipeline's
// workload model of the manifest's model), so that a tiny model gives up
// on a lost member within seconds and a large one does not give up on a
// busy one.
func (st *stagedVolunteer) hopWait() time.Duration {
	m := st.v.run
	w := pipeline.WorkloadOf(st.mc.Layers, st.mc.C, st.mc.Heads, m.Model.Batch, st.T)
	layers := float64(st.mc.Layers) / float64(m.Pipeline.Stages)
	est := w.LayerForward * layers * (1 + w.BackwardRatio) * float64(st.sched.Microbatches)
	return minHopWait + time.Duration(4*est*float64(time.Second))
}

// runCtx is the context of the stage's background drivers, canceled by
// stopStage and close.
func (st *stagedVolunteer) runCtx() context.Context {
	if st.stopC == nil {
		var ctx context.Context
		ctx, st.stopC = context.WithCancel(context.Background())
		st.ctx = ctx
	}
	return st.ctx
}

// startOuter starts the stage's DiLoCo among its members from from's
// outer state.
func (st *stagedVolunteer) startOuter(a pipeline.Assignment, s int, from start) error {
	st.dl = nil
	if err := st.restartOuter(a, s); err != nil {
		return err
	}
	return st.dl.SetState(from.round, from.w, from.mom)
}

// restartOuter (re)starts the stage's collective among a's members of
// stage s; the DiLoCo state carries over (a new DiLoCo over the new
// collective, with the old one's round, phi and momentum).
func (st *stagedVolunteer) restartOuter(a pipeline.Assignment, s int) error {
	v := st.v
	st.stopOuter()
	var members []transport.PeerID
	for _, u := range a.Members(s) {
		members = append(members, transport.PeerID(a.Peers[u]))
	}
	n := st.rep.Len()
	p, err := p2p.NewPeers(v.pn, p2p.ProtoStageReduce(s), uint32(min(stateSize(n)+1<<20, 1<<30)), stagedOuterW)
	if err != nil {
		return err
	}
	st.outP = p
	rc := v.cfg.Collective
	bc := optimizer.DefaultButterflyConfig(n, v.pn.Signer(), butterflyTick.Seconds())
	bc.Codec = v.run.WireCodec(bc.Codec)
	bc.MaxAbs = rc.MaxAbs
	ticks := func(d time.Duration) int64 { return max(1, int64(d/butterflyTick)) }
	bc.PhaseWait, bc.MinPhase, bc.MaxPhase = ticks(rc.InitialDeadline), ticks(rc.MinDeadline), ticks(rc.MaxDeadline)
	bc.MaxStashBytes = max(rc.MaxStashBytes, 8*int64(n))
	coll, err := optimizer.NewButterflyDriver(stageMembers{Peers: p, members: members}, bc,
		optimizer.ButterflyOptions{Tick: butterflyTick, Logger: v.log})
	if err != nil {
		return err
	}
	coll.Start(st.runCtx())
	st.coll = coll
	d := optimizer.DefaultDiLoCo()
	d.OuterLR, d.Momentum = v.run.Optimizer.OuterLR, v.run.Optimizer.OuterMomentum
	phi := make([]float32, n)
	st.rep.Params(phi)
	dl, err := optimizer.NewDiLoCo(d, coll, phi)
	if err != nil {
		return err
	}
	if st.dl != nil {
		if err := dl.SetState(st.dl.State()); err != nil {
			return err
		}
	}
	st.dl = dl
	return nil
}

// stageMembers narrows a collective's membership to one stage's members.
type stageMembers struct {
	*p2p.Peers
	members []transport.PeerID
}

func (p stageMembers) Members() []transport.PeerID { return slices.Clone(p.members) }

// stopStage stops the stage's drivers (a member leaving its stage).
func (st *stagedVolunteer) stopStage() {
	if st.stopC != nil {
		st.stopC()
		st.stopC = nil
	}
	if st.relay != nil {
		st.relay.Close()
		st.relay = nil
	}
	if st.relP != nil {
		st.relP.Close()
		st.relP = nil
	}
	st.stopOuter()
	st.rep, st.dl = nil, nil
}

// stopOuter stops the stage's collective and its transport.
func (st *stagedVolunteer) stopOuter() {
	if st.coll != nil {
		st.coll.Close()
		st.coll = nil
	}
	if st.outP != nil {
		st.outP.Close()
		st.outP = nil
	}
}

func (st *stagedVolunteer) close() { st.stopStage() }

// iterate runs iteration iter: the relay's share of this member, the AdamW
// step, and, every H iterations, the stage's outer round and a report.
func (st *stagedVolunteer) iterate(ctx context.Context, iter uint64) error {
	v := st.v
	paths := st.plan.PathsAt(st.sched, iter)
	began := time.Now()
	outs, err := st.relay.Run(ctx, iter, paths)
	if err != nil {
		return fmt.Errorf("node: staged iteration %d: %w", iter, err)
	}
	failed := 0
	for _, o := range outs {
		if o.Err != nil {
			failed++
			continue
		}
		if l := float64(o.Loss); o.Hop == 0 && !math.IsNaN(l) && !math.IsInf(l, 0) {
			st.losses = append(st.losses, o.Loss)
		}
	}
	for _, o := range outs {
		if o.Hop == 0 {
			st.started++
		}
	}
	st.failed += failed
	if _, err := st.rep.Step(st.adamW, int(iter-1)); err != nil {
		st.rollback(ctx, iter, err)
	}
	st.compute += time.Since(began).Seconds()
	st.iter = iter
	st.announce(false)
	if failed > 0 {
		v.log.Warn("microbatches failed", "iteration", iter, "failed", failed, "of", len(outs))
		if failed == len(outs) {
			sleep(ctx, failedPause) // a member gone: the bootstrap re-plans
		}
	}
	H := uint64(v.run.Optimizer.InnerSteps)
	if iter%H == 0 {
		st.outerStep(ctx)
		st.report(iter / H)
	}
	return nil
}

// outerStep averages the stage's replicas (DiLoCo) and publishes what
// newcomers and neighbours' replacements take.
func (st *stagedVolunteer) outerStep(ctx context.Context) {
	v := st.v
	if len(st.plan.Members(st.plan.StageOf[st.self])) > 1 {
		theta := make([]float32, st.rep.Len())
		st.rep.Params(theta)
		if _, err := st.dl.OuterStep(ctx, theta); err != nil {
			if ctx.Err() != nil {
				return
			}
			v.log.Warn("stage round failed", "round", st.dl.Round+1, "err", err)
			st.resyncStage(ctx)
		} else {
			st.rep.SetParams(theta)
		}
	} else {
		// A lone replica: its weights are the stage's outer state.
		w := make([]float32, st.rep.Len())
		st.rep.Params(w)
		st.dl.SetState(st.dl.Round+1, w, make([]float32, len(w)))
	}
	st.publish()
}

// resyncStage takes the stage's outer state at a later or equal round
// from the other members of the stage (this one's round failed, or it
// started from another state; pickState decides which): the stage's
// members must start every round from the same state.
func (st *stagedVolunteer) resyncStage(ctx context.Context) {
	s := st.plan.StageOf[st.self]
	var ids []string
	for _, u := range st.plan.Members(s) {
		if u != st.self {
			ids = append(ids, st.plan.Peers[u])
		}
	}
	h, ok := pickState(st.stageStates(ctx, ids, st.rep.Len()), len(ids), st.dl.Round)
	if !ok {
		return
	}
	if err := st.dl.SetState(h.round, h.phi, h.mom); err == nil {
		st.rep.SetParams(h.phi)
		say(st.v.cfg.Progress, "stage %d: took the stage's round %d state from %s", s, h.round, h.from)
	}
}

// rollback drops iteration iter, whose gradient was not finite (cause),
// and goes back to the stage's outer state, like a data-parallel
// volunteer's rollback: the relay keeps a neighbour's bad tensors out, so
// this one's own compute overflowed. A poisoned outer state is taken from
// the stage's other members.
func (st *stagedVolunteer) rollback(ctx context.Context, iter uint64, cause error) {
	st.v.log.Warn("non-finite gradient: dropping the iteration, back to the stage's outer state", "iteration", iter, "err", cause)
	say(st.v.cfg.Progress, "warning: iteration %d: %v; dropped it and went back to the stage's outer state", iter, cause)
	if _, phi, _ := st.dl.State(); nonFinite(phi) < 0 {
		st.rep.SetParams(phi)
		return
	}
	st.resyncStage(ctx)
}

// publish makes the stage's weights and outer state what this member
// serves.
func (st *stagedVolunteer) publish() {
	w := make([]float32, st.rep.Len())
	st.rep.Params(w)
	weights := pipeline.EncodeStageWeights(st.rep.LastNorm(), w)
	round, phi, mom := st.dl.State()
	state := encodeState(round, phi, mom)
	st.mu.Lock()
	st.weights, st.state = weights, state
	st.mu.Unlock()
}

// serve answers the staged bulk keys; ok false for other keys.
func (st *stagedVolunteer) serve(key string) (io.ReaderAt, int64, bool, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	var b []byte
	switch key {
	case stageWeightsKey:
		b = st.weights
		if st.v.cfg.Hostile == HostileCheckFreeNorm && b != nil {
			st.lies++
			b = checkFreeLie(b, st.lies)
			st.v.log.Warn("hostile: serving stage weights for CheckFree", "norm", hostileNorm, "nan", st.lies%2 == 0)
		}
	case stageStateKey:
		b = st.state
	default:
		return nil, 0, false, nil
	}
	if b == nil {
		return nil, 0, true, errors.New("node: no stage held yet")
	}
	return bytes.NewReader(b), int64(len(b)), true, nil
}

// hostileNorm is the last gradient norm a HostileCheckFreeNorm volunteer
// claims: far past any run's clip, it would make a rebuild weighted by
// the claims a copy of its weights.
const hostileNorm = 1e300

// checkFreeLie is what a HostileCheckFreeNorm volunteer serves instead of
// its stage weights b (pipeline.EncodeStageWeights) the k-th time they
// are asked for: the weights with a claimed norm of hostileNorm (odd k),
// or the same claim with every weight NaN (even k), so that both the
// rebuilding member's cap on norms and its refusal of non-finite weights
// are tried. b comes back when it does not decode (not this volunteer's
// to break).
func checkFreeLie(b []byte, k int) []byte {
	n := (len(b) - 8) / 4
	_, w, err := pipeline.DecodeStageWeights(b, n)
	if err != nil {
		return b
	}
	if k%2 == 0 {
		for i := range w {
			w[i] = float32(math.NaN())
		}
	}
	return pipeline.EncodeStageWeights(hostileNorm, w)
}

// report tells the user and the bootstrap how the last H iterations went.
func (st *stagedVolunteer) report(round uint64) {
	v := st.v
	loss := float32(math.NaN())
	if len(st.losses) > 0 {
		var sum float64
		for _, l := range st.losses {
			sum += float64(l)
		}
		loss = float32(sum / float64(len(st.losses)))
	}
	wall := time.Since(st.reportAt).Seconds()
	tokens := uint64(max(st.started-st.failed, 0)) * uint64(v.run.Model.Batch*st.T)
	tps := 0.0
	if wall > 0 {
		tps = float64(tokens) / wall
	}
	s := st.plan.StageOf[st.self]
	line := fmt.Sprintf("iteration %d (round %d): stage %d", st.iter, round, s)
	if !math.IsNaN(float64(loss)) {
		line += fmt.Sprintf(", loss %.4f", loss)
	}
	if st.failed > 0 {
		line += fmt.Sprintf(", %d microbatches failed", st.failed)
	}
	say(v.cfg.Progress, "%s, %.1fs", line, wall)
	rep := RoundReport{Round: round, Loss: loss, ValLoss: float32(math.NaN()), Members: len(st.plan.Members(s))}
	sent, recv := v.account(rep, tokens, tps, st.compute, wall)
	v.reporter.send(telemetry.Report{Round: round, TrainLoss: measured(loss), ValLoss: measured(float32(math.NaN())),
		Tokens: tokens, TokensPerSec: tps, BytesSent: uint64(max(sent, 0)), BytesRecv: uint64(max(recv, 0)),
		ComputeSeconds: st.compute, WallSeconds: wall, Members: len(st.plan.Members(s)), Device: v.device,
		Version: v.cfg.Version, UnixMS: time.Now().UnixMilli()})
	if v.cfg.OnRound != nil {
		v.cfg.OnRound(rep)
	}
	st.losses, st.started, st.failed, st.compute, st.reportAt = st.losses[:0], 0, 0, 0, time.Now()
	st.reports++
}

// peerID is id as a peer.ID (the empty ID when it does not decode).
func peerID(id string) peer.ID {
	p, _ := peer.Decode(id)
	return p
}
