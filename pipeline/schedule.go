package pipeline

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/skein-ml/skein/sim"
)

// ScheduleConfig is what SchedulePaths needs beyond the network and the
// placement.
type ScheduleConfig struct {
	Rules    Rules
	Workload Workload
	// Microbatches per iteration; 0 means n_1*mu, the most rule 7 allows
	// (each stage-0 node starts mu of them).
	Microbatches int
	// SearchSteps is the number of local-search moves, each judged by one
	// event simulation; 0 keeps the greedy schedule.
	SearchSteps int
	// Seed drives the local search's choice of moves.
	Seed uint64
}

// DefaultSearchSteps trades quality for time: on the 20-node network a
// 400-step search takes the full pipeline from 7.5 s (greedy) to about
// 5.7 s in well under a second of CPU; BENCHMARKS.md's figures use 4,000
// steps, which find about 7% more.
const DefaultSearchSteps = 400

// maxSubsets bounds the stage subsets enumerated for the greedy
// construction: with the jump rule this is far above what 6-12 stages need,
// and it keeps a mistaken config (hundreds of stages) from running for hours.
const maxSubsets = 1 << 14

// DefaultScheduleConfig is DefaultRules and DefaultWorkload with the
// default search.
func DefaultScheduleConfig() ScheduleConfig {
	return ScheduleConfig{Rules: DefaultRules(), Workload: DefaultWorkload(), SearchSteps: DefaultSearchSteps}
}

// Validate reports the first field out of range.
func (c ScheduleConfig) Validate() error {
	if err := c.Rules.Validate(); err != nil {
		return err
	}
	if err := c.Workload.Validate(); err != nil {
		return err
	}
	if c.Microbatches < 0 || c.SearchSteps < 0 {
		return fmt.Errorf("%w: microbatches %d, search steps %d must be >= 0", ErrConfig, c.Microbatches, c.SearchSteps)
	}
	return nil
}

// Schedule is the result of SchedulePaths.
type Schedule struct {
	Paths []Path
	// Iteration is the simulated iteration time of Paths, in seconds.
	Iteration float64
	// Greedy is the iteration time of the greedy construction, before the
	// local search.
	Greedy float64
}

// SchedulePaths chooses a path for every microbatch of an iteration on the
// placement pl (package doc, Scheduling). Microbatch m starts at the
// (m mod n_1)-th stage-0 node. The paths obey every rule (Validate); the
// result is a function of (net, pl, cfg) only.
func SchedulePaths(net *sim.Network, pl Placement, cfg ScheduleConfig) (Schedule, error) {
	if err := cfg.Validate(); err != nil {
		return Schedule{}, err
	}
	s, err := newScheduler(net, pl, cfg)
	if err != nil {
		return Schedule{}, err
	}
	paths, err := s.greedy()
	if err != nil {
		return Schedule{}, err
	}
	greedy, err := s.evaluate(paths)
	if err != nil {
		return Schedule{}, err
	}
	best := s.search(paths, greedy)
	if err := Validate(paths, pl, cfg.Rules); err != nil {
		return Schedule{}, fmt.Errorf("pipeline: scheduler produced an invalid schedule (a bug): %w", err)
	}
	return Schedule{Paths: paths, Iteration: best.makespan, Greedy: greedy.makespan}, nil
}

type scheduler struct {
	net     *sim.Network
	pl      Placement
	cfg     ScheduleConfig
	byStage [][]int
	subsets [][]int // ascending non-zero stages of a path, jump rule satisfied
	micro   int
	load    []int     // per node: paths through it
	staged  []int     // per stage: paths through it
	busy    []float64 // per node: seconds of compute and sending per microbatch
	rng     *rand.Rand
}

func newScheduler(net *sim.Network, pl Placement, cfg ScheduleConfig) (*scheduler, error) {
	r := cfg.Rules
	if pl.Stages != r.Stages || len(pl.StageOf) != net.N() {
		return nil, fmt.Errorf("%w: placement of %d stages over %d nodes for %d stages over %d nodes", ErrConfig, pl.Stages, len(pl.StageOf), r.Stages, net.N())
	}
	s := &scheduler{
		net: net, pl: pl, cfg: cfg,
		byStage: make([][]int, r.Stages),
		load:    make([]int, net.N()),
		staged:  make([]int, r.Stages),
		busy:    make([]float64, net.N()),
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x5c4ed)),
	}
	for st := range r.Stages {
		s.byStage[st] = pl.Nodes(st)
		if len(s.byStage[st]) == 0 {
			return nil, fmt.Errorf("%w: no node serves stage %d", ErrInfeasible, st)
		}
	}
	s.micro = cfg.Microbatches
	if capacity := len(s.byStage[0]) * r.Mu; s.micro == 0 {
		s.micro = capacity
	} else if s.micro > capacity {
		return nil, fmt.Errorf("%w: %d microbatches, but %d stage-0 nodes hold at most mu = %d each", ErrNodeMemory, s.micro, len(s.byStage[0]), r.Mu)
	}
	w, act := cfg.Workload, cfg.Workload.ActivationBytes
	for v, st := range pl.StageOf {
		if st < 0 {
			continue
		}
		n := net.Node(v)
		work := w.Forward(st, r.Stages) + w.Backward(st, r.Stages)
		if st == 0 {
			work += w.Loss(r.Stages)
		}
		s.busy[v] = work/n.Speed + 2*act/(n.UpBps*net.Goodput())
	}
	var err error
	s.subsets, err = subsets(r)
	return s, err
}

// subsets lists, in lexicographic order, the ascending sets of L-1 stages
// from 1..S-1 that obey the jump rule.
func subsets(r Rules) ([][]int, error) {
	var out [][]int
	cur := []int{0}
	var rec func(next int) error
	rec = func(next int) error {
		last := cur[len(cur)-1]
		if len(cur) == r.PathLen() {
			if r.Stages-last-1 <= r.MaxJump {
				out = append(out, slices.Clone(cur[1:]))
			}
			if len(out) > maxSubsets {
				return fmt.Errorf("%w: more than %d stage subsets for %d stages skipping %d", ErrConfig, maxSubsets, r.Stages, r.Skip)
			}
			return nil
		}
		for st := next; st < r.Stages && st-last-1 <= r.MaxJump; st++ {
			cur = append(cur, st)
			if err := rec(st + 1); err != nil {
				return err
			}
			cur = cur[:len(cur)-1]
		}
		return nil
	}
	if err := rec(1); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no path of %d stages out of %d has jumps of at most %d", ErrInfeasible, r.PathLen(), r.Stages, r.MaxJump)
	}
	return out, nil
}

// greedy builds the paths one microbatch at a time, each taking the subset
// and nodes of least estimated cost given the paths before it. With a
// stage floor (Rules.MinStageLoad), a subset is only taken if the floors
// stay reachable; when that greedy choice still paints itself into a
// corner, the stage subsets are found first by a bounded search
// (coverSubsets) and only the nodes are then chosen by cost.
func (s *scheduler) greedy() ([]Path, error) {
	paths, err := s.greedyWith(nil)
	if err == nil || s.cfg.Rules.MinStageLoad == 0 {
		return paths, err
	}
	subs, ok := s.coverSubsets()
	if !ok {
		return nil, err
	}
	return s.greedyWith(subs)
}

// greedyWith builds the paths; fixed, if not nil, gives each microbatch's
// stage subset.
func (s *scheduler) greedyWith(fixed [][]int) ([]Path, error) {
	clear(s.load)
	clear(s.staged)
	paths := make([]Path, s.micro)
	origins := s.byStage[0]
	for m := range paths {
		origin := origins[m%len(origins)]
		candidates := s.subsets
		if fixed != nil {
			candidates = fixed[m : m+1]
		}
		best, bestCost := Path{}, math.Inf(1)
		for _, sub := range candidates {
			if !s.floorReachable(sub, len(paths)-m-1) {
				continue
			}
			if p, c, ok := s.route(origin, sub); ok && c < bestCost {
				best, bestCost = p, c
			}
		}
		if best.Nodes == nil {
			return nil, fmt.Errorf("%w: microbatch %d finds no path with room on its nodes (mu = %d) that keeps every stage's floor (%d) in reach", ErrInfeasible, m, s.cfg.Rules.Mu, s.cfg.Rules.MinStageLoad)
		}
		paths[m] = best
		s.add(best, 1)
	}
	return paths, nil
}

// maxCoverSteps bounds coverSubsets' search.
const maxCoverSteps = 100_000

// coverSubsets finds one stage subset per microbatch such that every stage
// reaches its floor, by a bounded depth-first search over multisets of
// subsets (microbatches are interchangeable here, so microbatch m+1 never
// takes a subset listed before microbatch m's), subsets with the rarest
// stages first, pruned by floorReachable. Nodes are ignored: every stage
// has room for all microbatches (Plan gives each stage at least n_1 nodes
// of mu slots each). It reports false when the search finds nothing within
// maxCoverSteps.
func (s *scheduler) coverSubsets() ([][]int, bool) {
	order := s.rarestFirst()
	clear(s.staged)
	defer clear(s.staged)
	out := make([][]int, s.micro)
	steps := 0
	var dfs func(m, from int) bool
	dfs = func(m, from int) bool {
		if m == s.micro {
			return s.floorMet()
		}
		for i := from; i < len(order); i++ {
			if steps++; steps > maxCoverSteps {
				return false
			}
			sub := order[i]
			if !s.floorReachable(sub, s.micro-m-1) {
				continue
			}
			out[m] = sub
			for _, st := range sub {
				s.staged[st]++
			}
			ok := dfs(m+1, i)
			for _, st := range sub {
				s.staged[st]--
			}
			if ok {
				return true
			}
		}
		return false
	}
	return out, dfs(0, 0)
}

// rarestFirst orders the subsets by the rarest stage they contain (the
// stage on fewest subsets), so the search commits early to the choices
// that have few alternatives.
func (s *scheduler) rarestFirst() [][]int {
	on := make([]int, s.cfg.Rules.Stages)
	for _, sub := range s.subsets {
		for _, st := range sub {
			on[st]++
		}
	}
	rarity := func(sub []int) int {
		r := math.MaxInt
		for _, st := range sub {
			r = min(r, on[st])
		}
		return r
	}
	order := slices.Clone(s.subsets)
	slices.SortStableFunc(order, func(a, b []int) int { return rarity(a) - rarity(b) })
	return order
}

func (s *scheduler) add(p Path, d int) {
	for i, v := range p.Nodes {
		s.load[v] += d
		s.staged[p.Stages[i]] += d
	}
}

// floorReachable reports whether, after adding a path through the stages
// of sub, the left microbatches still to schedule can lift every stage to
// Rules.MinStageLoad: no stage short by more than left (a path visits a
// stage once), and the shortfalls together no more than left*(L-1) visits.
func (s *scheduler) floorReachable(sub []int, left int) bool {
	floor := s.cfg.Rules.MinStageLoad
	if floor == 0 {
		return true
	}
	total := 0
	for st := 1; st < s.cfg.Rules.Stages; st++ {
		load := s.staged[st]
		if slices.Contains(sub, st) {
			load++
		}
		short := max(0, floor-load)
		if short > left {
			return false
		}
		total += short
	}
	return total <= left*(s.cfg.Rules.PathLen()-1)
}

// floorMet reports whether every stage has its MinStageLoad.
func (s *scheduler) floorMet() bool {
	for st := 1; st < s.cfg.Rules.Stages; st++ {
		if s.staged[st] < s.cfg.Rules.MinStageLoad {
			return false
		}
	}
	return true
}

// route picks the nodes for a path from origin through the stages of order
// (in visiting order) by dynamic programming over the visits: the estimated
// cost of a path is the transfer time of each boundary both ways plus, per
// node, its compute and its queue (its busy time times the paths already
// through it). Nodes at the memory cap are not candidates.
func (s *scheduler) route(origin int, order []int) (Path, float64, bool) {
	if s.load[origin] >= s.cfg.Rules.Mu {
		return Path{}, 0, false
	}
	type cell struct {
		node int
		cost float64
		prev int // index in the previous layer
	}
	layers := [][]cell{{{node: origin, cost: s.nodeCost(origin), prev: -1}}}
	for _, st := range order {
		var layer []cell
		for _, v := range s.byStage[st] {
			if s.load[v] >= s.cfg.Rules.Mu {
				continue
			}
			best := cell{node: v, cost: math.Inf(1), prev: -1}
			for i, c := range layers[len(layers)-1] {
				if cost := c.cost + s.linkCost(c.node, v); cost < best.cost {
					best.cost, best.prev = cost, i
				}
			}
			best.cost += s.nodeCost(v)
			layer = append(layer, best)
		}
		if len(layer) == 0 {
			return Path{}, 0, false
		}
		layers = append(layers, layer)
	}
	last := layers[len(layers)-1]
	end, endCost := -1, math.Inf(1)
	for i, c := range last {
		if cost := c.cost + s.linkCost(c.node, origin); cost < endCost {
			end, endCost = i, cost
		}
	}
	p := Path{Nodes: make([]int, len(layers)), Stages: append([]int{0}, order...)}
	for k := len(layers) - 1; k >= 0; k-- {
		p.Nodes[k] = layers[k][end].node
		end = layers[k][end].prev
	}
	return p, endCost, true
}

func (s *scheduler) nodeCost(v int) float64 {
	return s.busy[v] * float64(1+s.load[v])
}

func (s *scheduler) linkCost(u, v int) float64 {
	if u == v {
		return 0
	}
	act := s.cfg.Workload.ActivationBytes
	return s.net.Link(u, v).Seconds(act) + s.net.Link(v, u).Seconds(act)
}

// score orders schedules: the iteration time, then the sum of the
// microbatches' finish times, which rewards a move that shortens paths off
// the critical one and so gives the search a slope where the makespan is flat.
type score struct{ makespan, total float64 }

func (a score) better(b score) bool {
	const eps = 1e-9
	if a.makespan < b.makespan-eps {
		return true
	}
	return a.makespan <= b.makespan+eps && a.total < b.total-eps
}

func (s *scheduler) evaluate(paths []Path) (score, error) {
	res, err := Simulate(s.net, paths, s.cfg.Rules.Stages, s.cfg.Workload, sim.Faults{})
	if err != nil {
		return score{}, err
	}
	var total float64
	for _, f := range res.Finish {
		total += f
	}
	return score{res.Makespan, total}, nil
}

// search applies SearchSteps random moves to paths by simulated annealing:
// a move the simulation scores better is kept; a worse one is kept with
// probability exp(-increase/temperature), the temperature falling linearly
// from a twentieth of the starting iteration time to zero, so that the
// search can leave the local optima a pure descent stops in (the full
// pipeline's, with every node at its memory cap, are many). paths ends as
// the best schedule seen. Moves never break a rule: each keeps the path's
// stage count, the subsets' jump rule, the swap limit and the memory cap.
func (s *scheduler) search(paths []Path, cur score) score {
	best, bestPaths := cur, clonePaths(paths)
	t0 := cur.makespan / 20
	for step := range s.cfg.SearchSteps {
		undo, ok := s.move(paths)
		if !ok {
			continue
		}
		next, err := s.evaluate(paths)
		if err != nil {
			undo()
			continue
		}
		temp := t0 * float64(s.cfg.SearchSteps-step) / float64(s.cfg.SearchSteps)
		if !next.better(cur) && !s.accept(next.makespan-cur.makespan, temp) {
			undo()
			continue
		}
		cur = next
		if cur.better(best) {
			best, bestPaths = cur, clonePaths(paths)
		}
	}
	for m := range paths {
		s.add(paths[m], -1)
		paths[m] = bestPaths[m]
		s.add(paths[m], 1)
	}
	return best
}

func (s *scheduler) accept(increase, temp float64) bool {
	if temp <= 0 || increase <= 0 {
		return false // equal makespan and no better total: a sideways move, not taken
	}
	return s.rng.Float64() < math.Exp(-increase/temp)
}

func clonePaths(paths []Path) []Path {
	out := make([]Path, len(paths))
	for i, p := range paths {
		out[i] = p.Clone()
	}
	return out
}

// move changes paths in place by one random move and returns how to undo it.
func (s *scheduler) move(paths []Path) (undo func(), ok bool) {
	switch s.rng.IntN(4) {
	case 0:
		return s.reroute(paths)
	case 1:
		return s.renode(paths)
	case 2:
		return s.trade(paths)
	default:
		return s.toggleSwap(paths)
	}
}

// keep snapshots microbatches ms so that the returned func restores them
// and the node loads.
func (s *scheduler) keep(paths []Path, ms ...int) func() {
	old := make([]Path, len(ms))
	for i, m := range ms {
		old[i] = paths[m].Clone()
	}
	return func() {
		for i, m := range ms {
			s.add(paths[m], -1)
			paths[m] = old[i]
			s.add(paths[m], 1)
		}
	}
}

// reroute gives a random microbatch a random subset of stages, with the
// nodes the dynamic programme picks for it given everyone else's load.
func (s *scheduler) reroute(paths []Path) (func(), bool) {
	m := s.rng.IntN(len(paths))
	undo := s.keep(paths, m)
	s.add(paths[m], -1)
	p, _, ok := s.route(paths[m].Nodes[0], s.subsets[s.rng.IntN(len(s.subsets))])
	if !ok {
		s.add(paths[m], 1)
		return nil, false
	}
	paths[m] = p
	s.add(p, 1)
	if !s.floorMet() {
		undo()
		return nil, false
	}
	return undo, true
}

// renode moves one visit of a random microbatch to another node of the same
// stage with room.
func (s *scheduler) renode(paths []Path) (func(), bool) {
	m := s.rng.IntN(len(paths))
	k := s.rng.IntN(len(paths[m].Nodes))
	if k == 0 {
		return nil, false // the origin stays: microbatch m belongs to its stage-0 node
	}
	nodes := s.byStage[paths[m].Stages[k]]
	v := nodes[s.rng.IntN(len(nodes))]
	if v == paths[m].Nodes[k] || s.load[v] >= s.cfg.Rules.Mu {
		return nil, false
	}
	undo := s.keep(paths, m)
	s.load[paths[m].Nodes[k]]--
	paths[m].Nodes[k] = v
	s.load[v]++
	return undo, true
}

// trade exchanges the nodes two microbatches use for a stage both visit
// (stage 0 included: they trade origins). Loads do not change.
func (s *scheduler) trade(paths []Path) (func(), bool) {
	a, b := s.rng.IntN(len(paths)), s.rng.IntN(len(paths))
	st := s.rng.IntN(s.cfg.Rules.Stages)
	i, j := slices.Index(paths[a].Stages, st), slices.Index(paths[b].Stages, st)
	if a == b || i < 0 || j < 0 || paths[a].Nodes[i] == paths[b].Nodes[j] {
		return nil, false
	}
	undo := s.keep(paths, a, b)
	paths[a].Nodes[i], paths[b].Nodes[j] = paths[b].Nodes[j], paths[a].Nodes[i]
	return undo, true
}

// toggleSwap swaps, or swaps back, two neighbouring visits of a microbatch
// (nodes move with their stages) when the result stays within the swap rule.
func (s *scheduler) toggleSwap(paths []Path) (func(), bool) {
	m := s.rng.IntN(len(paths))
	p := paths[m]
	if len(p.Nodes) < 3 {
		return nil, false
	}
	k := 1 + s.rng.IntN(len(p.Nodes)-2)
	q := p.Clone()
	q.Nodes[k], q.Nodes[k+1] = q.Nodes[k+1], q.Nodes[k]
	q.Stages[k], q.Stages[k+1] = q.Stages[k+1], q.Stages[k]
	if _, swaps, ok := unswap(q.Stages); !ok || swaps > s.cfg.Rules.MaxSwaps {
		return nil, false
	}
	undo := s.keep(paths, m)
	paths[m] = q
	return undo, true
}
