package bootstrap

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/skein-ml/skein/bootstrap/status"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/pipeline"
	"github.com/skein-ml/skein/sim"
)

// A staged run's placement (DESIGN.md, pipeline): the bootstrap places the
// volunteers in stages with pipeline.Plan from what they gossip (compute,
// bandwidth, memory caps), and re-plans when one leaves or joins, moving
// as few as it can. Each plan is a pipeline.Assignment with a higher epoch
// and a first iteration a few iterations ahead of the run, so that every
// volunteer, asking every half second, switches between the same two
// iterations. A member new to a stage takes its weights from a survivor of
// the stage or, when the stage lost every member, rebuilds it from its
// neighbours (CheckFree); the volunteers do that, the bootstrap only says
// who is new where.

// PlanTiming is how the bootstrap's placement reacts to membership.
type PlanTiming struct {
	// Settle is how long the volunteers' membership must stay unchanged
	// before a plan is made: joins come in bursts.
	Settle time.Duration
	// Lead is how far ahead of the run, in wall-clock time at its measured
	// pace, a new plan starts: the volunteers must all have it by then.
	Lead time.Duration
}

// DefaultPlanTiming suits volunteers that ask for the plan every half second.
func DefaultPlanTiming() PlanTiming {
	return PlanTiming{Settle: 2 * time.Second, Lead: 3 * time.Second}
}

// stagePlanner keeps a staged run's Assignment.
type stagePlanner struct {
	run    manifest.Manifest
	seed   *p2p.Seed
	log    *slog.Logger
	out    io.Writer
	timing PlanTiming
	holds  []string // per stage, what it holds ("embedding, head, layer 0")
	wl     pipeline.Workload
	notify func()
	list   func() []volunteer // tests: the volunteers, instead of the seed's members

	mu      sync.Mutex
	cur     *pipeline.Assignment
	enc     []byte
	rebuilt map[int]string // stage -> how it was last rebuilt
	waiting string         // why no new plan could be made, said once

	at        uint64 // the run's iteration when the last plan was made
	view      string // the volunteers last seen, sorted and joined
	planned   string // the view the current plan was made for
	changedAt time.Time
	pace      paceMeter
}

func newStagePlanner(run manifest.Manifest, seed *p2p.Seed, log *slog.Logger, out io.Writer, timing PlanTiming) (*stagePlanner, error) {
	mc, err := model.Preset(run.Model.Preset)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	specs, err := pipeline.SplitLayers(mc, run.Pipeline.Stages)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	p := &stagePlanner{run: run, seed: seed, log: log, out: out, timing: timing, rebuilt: map[int]string{},
		wl: pipeline.WorkloadOf(mc.Layers, mc.C, mc.Heads, run.Model.Batch, run.SeqLen())}
	for _, sp := range specs {
		p.holds = append(p.holds, sp.Holds())
	}
	return p, nil
}

// serve answers plan requests on the seed.
func (p *stagePlanner) serve() error {
	return p.seed.Handle(p2p.ProtoStagePlan, p2p.MessageFrameConfig(pipeline.MaxAssignmentBytes), func(_ context.Context, st *p2p.Stream) error {
		p.mu.Lock()
		enc := p.enc
		p.mu.Unlock()
		if enc == nil {
			return st.WriteFrame(pipeline.NoAssignmentFrame, nil)
		}
		return st.WriteFrame(pipeline.AssignmentFrame, enc)
	})
}

// loop re-plans every tick until ctx ends.
func (p *stagePlanner) loop(ctx context.Context) {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			p.step(now)
		}
	}
}

// volunteer is what the planner knows of one volunteer.
type volunteer struct {
	id   string
	meta p2p.Meta
}

func (p *stagePlanner) volunteers() []volunteer {
	if p.list != nil {
		return p.list()
	}
	var out []volunteer
	for _, m := range p.seed.Members() {
		if m.Meta.Role == p2p.RoleVolunteer && m.ID != p.seed.ID() {
			out = append(out, volunteer{m.ID.String(), m.Meta})
		}
	}
	slices.SortFunc(out, func(a, b volunteer) int { return strings.Compare(a.id, b.id) })
	return out
}

// step makes a new plan when the volunteers have changed and settled.
func (p *stagePlanner) step(now time.Time) {
	vols := p.volunteers()
	ids := make([]string, len(vols))
	var ahead uint64
	for i, v := range vols {
		ids[i] = v.id
		ahead = max(ahead, v.meta.Round)
	}
	p.pace.observe(now, ahead)
	if view := strings.Join(ids, ","); view != p.view {
		p.view, p.changedAt = view, now
		return
	}
	if now.Sub(p.changedAt) < p.timing.Settle {
		return
	}
	p.mu.Lock()
	cur := p.cur
	p.mu.Unlock()
	if p.planned == p.view {
		return // the plan was made for exactly these volunteers (some may be spares)
	}
	a, err := p.plan(cur, vols, ahead)
	if err != nil {
		p.wait(err.Error())
		return
	}
	enc, err := a.MarshalBinary()
	if err != nil {
		p.log.Error("staged plan does not encode", "err", err)
		return
	}
	p.mu.Lock()
	p.cur, p.enc, p.waiting = &a, enc, ""
	p.mu.Unlock()
	p.planned = p.view
	fmt.Fprintf(p.out, "skein bootstrap: stage plan %d from iteration %d (the run is at %d, %.1f iterations/s): %s\n",
		a.Epoch, a.Start, p.at, p.pace.rate(), describe(a))
	p.log.Info("stage plan", "epoch", a.Epoch, "start", a.Start, "members", len(a.Peers))
	if p.notify != nil {
		p.notify()
	}
}

func (p *stagePlanner) wait(why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if why != p.waiting {
		p.waiting = why
		fmt.Fprintf(p.out, "skein bootstrap: %s\n", why)
	}
}

// plan places vols: from scratch when there is no plan yet, else moving
// as few members as it can (pipeline.Plan with the previous placement),
// starting far enough ahead of the run's iteration (ahead) that every
// volunteer has the plan before it starts.
func (p *stagePlanner) plan(cur *pipeline.Assignment, vols []volunteer, ahead uint64) (pipeline.Assignment, error) {
	S := p.run.Pipeline.Stages
	if len(vols) < S {
		return pipeline.Assignment{}, fmt.Errorf("waiting for volunteers: %d of the %d a %d-stage run needs", len(vols), S, S)
	}
	net, err := networkOf(vols)
	if err != nil {
		return pipeline.Assignment{}, err
	}
	n0 := max(1, len(vols)/S)
	cfg := pipeline.PlanConfig{Stages: S, Mu: (p.run.Pipeline.Microbatches + n0 - 1) / n0, Workload: p.wl}
	var prev map[string]int
	if cur != nil {
		prev = map[string]int{}
		for i, id := range cur.Peers {
			if _, ok := net.Index(id); ok {
				prev[id] = cur.StageOf[i]
			}
		}
	}
	pl, err := pipeline.Plan(net, cfg, prev)
	if err != nil {
		return pipeline.Assignment{}, fmt.Errorf("cannot place the %d volunteers in %d stages: %w", len(vols), S, err)
	}
	a := pipeline.Assignment{Epoch: 1, Start: 1, Stages: S}
	if cur != nil {
		// Never before the previous plan's first iteration: a member may
		// be waiting for it.
		a.Epoch, a.Start = cur.Epoch+1, max(cur.Start, ahead+1+p.pace.lead(p.timing.Lead))
	}
	p.at = ahead
	serves := map[string]int16{} // the stage each volunteer announces it runs
	for _, v := range vols {
		serves[v.id] = v.meta.Stage
	}
	for v, s := range pl.StageOf {
		if s == pipeline.Unassigned {
			continue
		}
		id := net.Node(v).ID
		since := a.Epoch
		// A member keeps its Since only while it announces the stage: one
		// an earlier plan placed there that never took it (the stage's
		// state could not be fetched, or the plan was replaced before it
		// began) holds nothing a newcomer could take, and two of them
		// kept as survivors would each wait for the other's state for good.
		if cur != nil && serves[id] == int16(s) {
			if i := cur.Index(id); i >= 0 && cur.StageOf[i] == s {
				since = cur.Since[i]
			}
		}
		a.Peers, a.StageOf, a.Since = append(a.Peers, id), append(a.StageOf, s), append(a.Since, since)
	}
	if cur != nil {
		p.noteRebuilds(a)
	}
	if err := a.Validate(); err != nil {
		return a, err
	}
	p.schedule(&a, net)
	return a, nil
}

// schedule sets a's paths to SchedulePaths' choice for its placement on
// the volunteers' network (the least simulated iteration time under every
// SkipPipe rule), unless the run swaps stages for CheckFree+ (its rotating
// schedule does that). Without a schedule the volunteers compute the
// rotating one, which obeys the rules too.
func (p *stagePlanner) schedule(a *pipeline.Assignment, net *sim.Network) {
	pp := p.run.Pipeline
	if pp.CheckFreePlus {
		return
	}
	in := map[string]bool{}
	for _, id := range a.Peers {
		in[id] = true
	}
	sub, err := net.Keep(func(n sim.Node) bool { return in[n.ID] })
	if err != nil {
		p.log.Warn("stage schedule", "err", err)
		return
	}
	n0 := len(a.Members(0))
	rules := pipeline.DefaultRules()
	cfg := pipeline.ScheduleConfig{Workload: p.wl, Microbatches: pp.Microbatches, SearchSteps: pipeline.DefaultSearchSteps,
		Seed: p.run.Model.Seed ^ a.Epoch,
		Rules: pipeline.Rules{Stages: a.Stages, Skip: pp.Skip(), MaxJump: rules.MaxJump, MaxSwaps: rules.MaxSwaps,
			Mu: (pp.Microbatches + n0 - 1) / n0, MinStageLoad: 1}}
	// sub keeps the network's order, which is a.Peers' order.
	sched, err := pipeline.SchedulePaths(sub, a.Placement(), cfg)
	if err != nil {
		p.log.Warn("stage schedule: the volunteers use the rotating one", "err", err)
		return
	}
	a.Paths = sched.Paths
}

// noteRebuilds records, for the status page, the stages a plans hands to
// members that are all new to them after the first plan: they rebuild
// them with CheckFree (pipeline.Recover says from which neighbours).
func (p *stagePlanner) noteRebuilds(a pipeline.Assignment) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range a.Stages {
		if len(a.Survivors(s)) > 0 {
			continue
		}
		how := "CheckFree"
		if rec, err := pipeline.Recover(s, a.Stages, p.run.Pipeline.CheckFreePlus); err == nil {
			if rec.Copy() {
				how = fmt.Sprintf("CheckFree+: copy of stage %d", rec.From[0])
			} else {
				how = fmt.Sprintf("CheckFree from stages %d and %d", rec.From[0], rec.From[1])
			}
		}
		p.rebuilt[s] = fmt.Sprintf("%s, at iteration %d", how, a.Start)
	}
}

// describe is a plan in one line: stage: members.
func describe(a pipeline.Assignment) string {
	var parts []string
	for s := range a.Stages {
		var ids []string
		for _, v := range a.Members(s) {
			ids = append(ids, status.ShortID(a.Peers[v]))
		}
		parts = append(parts, fmt.Sprintf("stage %d: %s", s, strings.Join(ids, " ")))
	}
	return strings.Join(parts, "; ")
}

// networkOf is the simulator's view of the volunteers, from what they
// gossip: compute relative to the reference machine when measured,
// bandwidth caps or measurements, memory caps; what is not known is taken
// as a home machine's (one region: the bootstrap does not measure the
// latencies between volunteers).
func networkOf(vols []volunteer) (*sim.Network, error) {
	spec := sim.Spec{Name: "volunteers", Regions: []string{"internet"}, LatencyMs: [][]float64{{20}}}
	for _, v := range vols {
		m := v.meta
		n := sim.NodeSpec{ID: v.id, Region: "internet", Speed: 1, MemoryGiB: 16, UpMbps: 100, DownMbps: 100, AccessMs: 5}
		if m.ComputeTFLOPS > 0 {
			n.Speed = float64(m.ComputeTFLOPS) / refTFLOPS
		}
		if m.CapMemMiB > 0 {
			n.MemoryGiB = float64(m.CapMemMiB) / 1024
		}
		n.UpMbps = firstPositive(m.CapUpMbps, m.UpMbps, 100)
		n.DownMbps = firstPositive(m.CapDownMbps, m.DownMbps, 100)
		spec.Nodes = append(spec.Nodes, n)
	}
	return sim.NewNetwork(spec)
}

// refTFLOPS is the reference machine's training throughput (sim's
// measured step at 6 flops per parameter and token).
const refTFLOPS = 6 * sim.RefParams * sim.RefTokens / sim.RefStepSeconds / 1e12

func firstPositive(xs ...float32) float64 {
	for _, x := range xs {
		if x > 0 && !math.IsInf(float64(x), 0) && !math.IsNaN(float64(x)) {
			return float64(x)
		}
	}
	return 0
}

// pipeline is the status page's pipeline card: the plan's stages and
// members, and the paths of the run's latest iteration (the volunteers
// compute the same schedule from the plan).
func (p *stagePlanner) pipelineView() *status.Pipeline {
	p.mu.Lock()
	cur := p.cur
	rebuilt := make(map[int]string, len(p.rebuilt))
	for s, how := range p.rebuilt {
		rebuilt[s] = how
	}
	p.mu.Unlock()
	if cur == nil {
		return nil
	}
	var iter uint64
	for _, m := range p.seed.Members() {
		if cur.Index(m.ID.String()) >= 0 {
			iter = max(iter, m.Meta.Round)
		}
	}
	pv := &status.Pipeline{SkipRatio: p.run.Pipeline.SkipRatio, Iteration: iter}
	for s := range cur.Stages {
		sv := status.StageView{Stage: s, Holds: p.holds[s], Rebuilt: rebuilt[s]}
		for _, v := range cur.Members(s) {
			sv.Replicas = append(sv.Replicas, status.ShortID(cur.Peers[v]))
		}
		pv.Stages = append(pv.Stages, sv)
	}
	if iter >= cur.Start {
		for m, path := range cur.PathsAt(p.run.Schedule(), iter) {
			view := status.PathView{Microbatch: m, Stages: path.Stages}
			for _, v := range path.Nodes {
				view.Peers = append(view.Peers, status.ShortID(cur.Peers[v]))
			}
			pv.Paths = append(pv.Paths, view)
		}
	}
	return pv
}

// paceMeter estimates the run's iterations per second from the highest
// iteration the volunteers announce.
type paceMeter struct {
	at   []time.Time
	iter []uint64
}

func (m *paceMeter) observe(now time.Time, iter uint64) {
	m.at, m.iter = append(m.at, now), append(m.iter, iter)
	for len(m.at) > 1 && now.Sub(m.at[0]) > 10*time.Second {
		m.at, m.iter = m.at[1:], m.iter[1:]
	}
}

// rate is the run's iterations per second over the last seconds (0 when
// it did not move).
func (m *paceMeter) rate() float64 {
	if len(m.at) < 2 {
		return 0
	}
	dt := m.at[len(m.at)-1].Sub(m.at[0]).Seconds()
	di := float64(m.iter[len(m.iter)-1]) - float64(m.iter[0])
	if dt <= 0 || di <= 0 {
		return 0
	}
	return di / dt
}

// lead is how many iterations the run goes in d at its pace, plus three.
func (m *paceMeter) lead(d time.Duration) uint64 {
	return 3 + uint64(math.Ceil(m.rate()*d.Seconds()))
}
