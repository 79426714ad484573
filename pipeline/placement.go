package pipeline

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/skein-ml/skein/sim"
)

// Unassigned marks a node that serves no stage (it lacks the memory, or is a
// spare).
const Unassigned = -1

// Placement says which stage each node of a network serves.
type Placement struct {
	Stages  int
	StageOf []int // per node index: its stage, or Unassigned
}

// Nodes returns the nodes serving stage s, in increasing order.
func (p Placement) Nodes(s int) []int {
	var out []int
	for v, st := range p.StageOf {
		if st == s {
			out = append(out, v)
		}
	}
	return out
}

// ByID returns the placement keyed by node ID, the form Plan takes back as
// the previous placement when membership changes.
func (p Placement) ByID(net *sim.Network) map[string]int {
	out := make(map[string]int, len(p.StageOf))
	for v, s := range p.StageOf {
		out[net.Node(v).ID] = s
	}
	return out
}

// PlanConfig is what placement needs beyond the network.
type PlanConfig struct {
	Stages   int
	Mu       int // stashed microbatches a node must have memory for
	Workload Workload
	// MaxRounds bounds the swap search; 0 means DefaultPlanRounds.
	MaxRounds int
}

// DefaultPlanRounds bounds the placement's improvement passes: each pass
// tries every pair of nodes in different stages once.
const DefaultPlanRounds = 8

// DefaultPlanConfig places DefaultWorkload on DefaultRules's stages.
func DefaultPlanConfig() PlanConfig {
	r := DefaultRules()
	return PlanConfig{Stages: r.Stages, Mu: r.Mu, Workload: DefaultWorkload()}
}

// Validate reports the first field out of range.
func (c PlanConfig) Validate() error {
	if c.Stages < 1 || c.Stages > 256 {
		return fmt.Errorf("%w: stages %d outside [1, 256]", ErrConfig, c.Stages)
	}
	if c.Mu < 1 || c.Mu > 1<<16 {
		return fmt.Errorf("%w: mu %d outside [1, 65536]", ErrConfig, c.Mu)
	}
	if c.MaxRounds < 0 {
		return fmt.Errorf("%w: max rounds %d is negative", ErrConfig, c.MaxRounds)
	}
	return c.Workload.Validate()
}

// Plan assigns the nodes of net to stages.
//
// With prev nil it plans from scratch: n_1 = floor(N/S) stage-0 nodes, chosen
// as the hubs every path starts and ends at (the least mean transfer time
// to and from all other nodes), the others spread over stages 1..S-1 so
// that each stage's total compute speed is even, then pairs of nodes in
// different stages swapped while that lowers the cost (the slowest stage's
// compute plus twice the mean transfer time between consecutive stages, the
// paper's DP_cost + 2*PP_cost with DiLoCo's rare synchronisation left out).
//
// With prev (node ID -> stage, from Placement.ByID) it re-plans after a
// membership change and moves as few nodes as it can: every node of prev
// still present keeps its stage; newcomers go where the plan from scratch
// would have wanted more nodes; a node moves only when the schedule would
// otherwise be infeasible (stage 0 empty, or a stage with fewer nodes than
// stage 0, so that a full pipeline no longer fits the memory rule).
//
// Every stage s >= 1 ends with at least as many nodes as stage 0, so the
// n_1*mu microbatches of an iteration fit the per-node cap mu at every
// skip ratio. Nodes without the memory for the smallest stage stay
// Unassigned. ErrInfeasible when fewer than S nodes can serve.
func Plan(net *sim.Network, cfg PlanConfig, prev map[string]int) (Placement, error) {
	if err := cfg.Validate(); err != nil {
		return Placement{}, err
	}
	p := planner{net: net, cfg: cfg, act: cfg.Workload.ActivationBytes}
	p.eligible()
	p.precompute()
	if len(p.usable) < cfg.Stages {
		return Placement{}, fmt.Errorf("%w: %d of %d nodes have the memory for a stage, %d stages", ErrInfeasible, len(p.usable), net.N(), cfg.Stages)
	}
	if prev == nil {
		p.fresh()
	} else {
		p.replan(prev)
	}
	if count := p.counts(); count[0] == 0 || slices.Min(count) < count[0] {
		return Placement{}, fmt.Errorf("%w: memory leaves stage sizes %v; every stage needs at least stage 0's", ErrInfeasible, count)
	}
	return Placement{Stages: cfg.Stages, StageOf: p.stageOf}, nil
}

type planner struct {
	net     *sim.Network
	cfg     PlanConfig
	act     float64
	fits    [][]bool // per node, per stage: enough memory
	usable  []int    // nodes that fit at least one stage
	stageOf []int

	// Precomputed for cost, which the swap search calls O(N^2) times per pass.
	xfer    [][]float64 // node to node: one activation's transfer time
	busy    [][]float64 // per node, per stage: compute and sends per microbatch
	members [][]int     // scratch: the nodes of each stage
	scratch []int
}

func (p *planner) eligible() {
	n, S := p.net.N(), p.cfg.Stages
	p.fits = make([][]bool, n)
	p.stageOf = make([]int, n)
	for v := range n {
		p.stageOf[v] = Unassigned
		p.fits[v] = make([]bool, S)
		any := false
		for s := range S {
			p.fits[v][s] = p.net.Node(v).MemoryBytes >= p.cfg.Workload.Memory(s, S, p.cfg.Mu)
			any = any || p.fits[v][s]
		}
		if any {
			p.usable = append(p.usable, v)
		}
	}
}

func (p *planner) precompute() {
	n, S, w := p.net.N(), p.cfg.Stages, p.cfg.Workload
	p.xfer = make([][]float64, n)
	p.busy = make([][]float64, n)
	for _, v := range p.usable {
		p.xfer[v] = make([]float64, n)
		for _, u := range p.usable {
			p.xfer[v][u] = p.net.Link(v, u).Seconds(p.act)
		}
		node := p.net.Node(v)
		p.busy[v] = make([]float64, S)
		for s := range S {
			work := w.Forward(s, S) + w.Backward(s, S)
			if s == 0 {
				work += w.Loss(S)
			}
			p.busy[v][s] = work/node.Speed + 2*p.act/(node.UpBps*p.net.Goodput())
		}
	}
	p.members = make([][]int, S)
}

// targets are the stage sizes of a plan from scratch over n nodes: stage 0
// gets floor(n/S), the remainder goes to stages 1.. one each.
func targets(n, S int) []int {
	t := make([]int, S)
	for s := range t {
		t[s] = n / S
	}
	for s := 1; s <= n%S; s++ {
		t[s]++
	}
	return t
}

func (p *planner) fresh() {
	S := p.cfg.Stages
	want := targets(len(p.usable), S)
	// Hubs first: stage 0 is on every path twice.
	hubs := p.byHubCost(p.usable)
	rest := []int{}
	for _, v := range hubs {
		if want[0] > 0 && p.fits[v][0] {
			p.stageOf[v] = 0
			want[0]--
		} else {
			rest = append(rest, v)
		}
	}
	// Fastest first into the stage with the least total speed so far (LPT),
	// so every stage gets a similar share of the swarm's compute.
	slices.SortStableFunc(rest, func(a, b int) int { return cmp.Compare(p.net.Node(b).Speed, p.net.Node(a).Speed) })
	speed := make([]float64, S)
	for _, v := range rest {
		best := -1
		for s := range S {
			if want[s] == 0 || !p.fits[v][s] {
				continue
			}
			if best < 0 || speed[s] < speed[best] {
				best = s
			}
		}
		if best < 0 {
			best = p.anyStage(v) // memory allows no stage that still wants nodes
		}
		p.stageOf[v] = best
		speed[best] += p.net.Node(v).Speed
		if want[best] > 0 {
			want[best]--
		}
	}
	p.repair()
	p.improve()
}

// anyStage returns the stage with the fewest nodes among those v fits.
func (p *planner) anyStage(v int) int {
	count := p.counts()
	best := -1
	for s := 1; s < p.cfg.Stages; s++ {
		if p.fits[v][s] && (best < 0 || count[s] < count[best]) {
			best = s
		}
	}
	if best < 0 {
		best = 0
	}
	return best
}

func (p *planner) counts() []int {
	c := make([]int, p.cfg.Stages)
	for _, s := range p.stageOf {
		if s >= 0 {
			c[s]++
		}
	}
	return c
}

// byHubCost orders nodes by their mean time to send an activation to, and
// receive one from, every other usable node, then by index.
func (p *planner) byHubCost(nodes []int) []int {
	cost := make(map[int]float64, len(nodes))
	for _, v := range nodes {
		var sum float64
		for _, u := range p.usable {
			sum += p.xfer[v][u] + p.xfer[u][v] // zero for u == v
		}
		cost[v] = sum
	}
	out := slices.Clone(nodes)
	slices.SortStableFunc(out, func(a, b int) int { return cmp.Compare(cost[a], cost[b]) })
	return out
}

// replan keeps prev's stages and places newcomers, best hubs first: first
// where the rule needs a node (stage 0 when it is empty, then the stage
// furthest below stage 0's size), then where a plan from scratch would want
// more nodes, but never into stage 0 when that would leave another stage
// smaller than it. Only if newcomers cannot cover what the rule needs does
// repair move anyone.
func (p *planner) replan(prev map[string]int) {
	S := p.cfg.Stages
	var newcomers []int
	for _, v := range p.usable {
		s, ok := prev[p.net.Node(v).ID]
		if ok && s >= 0 && s < S && p.fits[v][s] {
			p.stageOf[v] = s
		} else {
			newcomers = append(newcomers, v)
		}
	}
	want := targets(len(p.usable), S)
	for _, v := range p.byHubCost(newcomers) {
		p.stageOf[v] = p.newcomerStage(v, want)
	}
	p.repair()
}

func (p *planner) newcomerStage(v int, want []int) int {
	S, count := p.cfg.Stages, p.counts()
	if count[0] == 0 && p.fits[v][0] || S == 1 {
		return 0
	}
	best := -1
	for s := 1; s < S; s++ { // the stage furthest below stage 0
		if p.fits[v][s] && count[s] < count[0] && (best < 0 || count[s] < count[best]) {
			best = s
		}
	}
	if best >= 0 {
		return best
	}
	for s := range S { // the stage a plan from scratch misses most
		if !p.fits[v][s] || s == 0 && slices.Min(count[1:]) <= count[0] {
			continue
		}
		if best < 0 || want[s]-count[s] > want[best]-count[best] {
			best = s
		}
	}
	if best < 0 {
		best = p.anyStage(v)
	}
	return best
}

// repair moves nodes until stage 0 has a node and every other stage has at
// least as many as stage 0, one move at a time, each the cheapest that
// helps: into an under-filled stage from the largest stage that can spare a
// node, or, failing that, out of stage 0 (which lowers the bar for all).
func (p *planner) repair() {
	S := p.cfg.Stages
	// Each move lowers the total shortfall (see donor), so this ends; the
	// bound only guards against a bug turning it into a hang.
	for range len(p.usable) * S {
		count := p.counts()
		short := -1
		if count[0] == 0 {
			short = 0
		} else {
			for s := 1; s < S; s++ {
				if count[s] < count[0] && (short < 0 || count[s] < count[short]) {
					short = s
				}
			}
		}
		if short < 0 {
			return
		}
		v := p.donor(short, count)
		if v < 0 {
			return // memory rules every move out; Plan reports it
		}
		p.stageOf[v] = short
	}
}

// donor picks the node to move into stage to: from the stage with the most
// nodes above what the rule needs, the node that fits to and is the best
// hub (for stage 0) or the fastest (for the others).
func (p *planner) donor(to int, count []int) int {
	S := p.cfg.Stages
	spare := func(s int) int {
		switch {
		case s == to:
			return 0
		case s == 0:
			if to == 0 {
				return 0
			}
			return count[0] - 1 // giving one lowers stage 0's bar
		case to == 0:
			return count[s] - 1 // stage s must still hold >= 1, the new count[0]
		default:
			return count[s] - count[0]
		}
	}
	var candidates []int
	bestSpare := 0
	for s := range S {
		if sp := spare(s); sp > bestSpare {
			bestSpare = sp
		}
	}
	for s := range S {
		if spare(s) != bestSpare || bestSpare == 0 {
			continue
		}
		for _, v := range p.usable {
			if p.stageOf[v] == s && p.fits[v][to] {
				candidates = append(candidates, v)
			}
		}
	}
	if len(candidates) == 0 {
		return -1
	}
	if to == 0 {
		return p.byHubCost(candidates)[0]
	}
	return slices.MaxFunc(candidates, func(a, b int) int { return cmp.Compare(p.net.Node(a).Speed, p.net.Node(b).Speed) })
}

// improve swaps pairs of nodes between stages while the cost falls; swaps
// keep every stage's size, so the repair's guarantees hold.
func (p *planner) improve() {
	rounds := p.cfg.MaxRounds
	if rounds == 0 {
		rounds = DefaultPlanRounds
	}
	cost := p.cost()
	for range rounds {
		improved := false
		for i, a := range p.usable {
			for _, b := range p.usable[i+1:] {
				sa, sb := p.stageOf[a], p.stageOf[b]
				if sa == sb || !p.fits[a][sb] || !p.fits[b][sa] {
					continue
				}
				p.stageOf[a], p.stageOf[b] = sb, sa
				if c := p.cost(); c < cost-1e-12 {
					cost, improved = c, true
				} else {
					p.stageOf[a], p.stageOf[b] = sa, sb
				}
			}
		}
		if !improved {
			return
		}
	}
}

// cost is the placement's objective: the slowest stage's time for an
// iteration of a full pipeline, plus twice the mean activation transfer time
// between consecutive stages (the forward and the backward cross each
// boundary once), around the ring 0 -> 1 -> ... -> S-1 -> 0. It is the
// paper's DP_cost + 2*PP_cost with DiLoCo's rare synchronisation left out
// and a stage's time standing for its data-parallel width.
func (p *planner) cost() float64 {
	S, members := p.cfg.Stages, p.members
	for s := range members {
		members[s] = members[s][:0]
	}
	for _, v := range p.usable {
		if s := p.stageOf[v]; s >= 0 {
			members[s] = append(members[s], v)
		}
	}
	micro := len(members[0]) * p.cfg.Mu
	var slowest, pp float64
	for s := range S {
		slowest = max(slowest, p.stageTime(s, members[s], micro))
		pp += p.meanTransfer(members[s], members[(s+1)%S])
	}
	return slowest + 2*pp
}

// stageTime spreads micro microbatches over the stage's nodes, at most mu
// each, one at a time to the node that would finish its share soonest, and
// returns the busiest node's time: per microbatch, its compute and the two
// activations it sends (forward and backward) through its uplink. A node too
// slow to help is left with nothing, which is how a stage with a spare node
// hides its slowest member. +Inf when the stage cannot take micro at all.
func (p *planner) stageTime(s int, members []int, micro int) float64 {
	if len(members)*p.cfg.Mu < micro {
		return math.Inf(1)
	}
	count := p.scratch[:0]
	for range members {
		count = append(count, 0)
	}
	p.scratch = count
	var slowest float64
	for range micro {
		best := -1
		for i, v := range members {
			if count[i] < p.cfg.Mu && (best < 0 || float64(count[i]+1)*p.busy[v][s] < float64(count[best]+1)*p.busy[members[best]][s]) {
				best = i
			}
		}
		count[best]++
		slowest = max(slowest, float64(count[best])*p.busy[members[best]][s])
	}
	return slowest
}

func (p *planner) meanTransfer(from, to []int) float64 {
	if len(from) == 0 || len(to) == 0 {
		return 0
	}
	var sum float64
	for _, u := range from {
		for _, v := range to {
			sum += p.xfer[u][v]
		}
	}
	return sum / float64(len(from)*len(to))
}
