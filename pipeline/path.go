package pipeline

import (
	"fmt"
	"slices"
)

// Path is one microbatch's route: Nodes[i] computes stage Stages[i]'s
// forward. Nodes[0] is a stage-0 node, to which the microbatch returns after
// the last visit for its head and loss; the backward retraces the path.
type Path struct {
	Nodes  []int
	Stages []int
}

// Clone returns a deep copy.
func (p Path) Clone() Path {
	return Path{Nodes: slices.Clone(p.Nodes), Stages: slices.Clone(p.Stages)}
}

// Rules are the parameters of the path rules (package doc, ALGORITHMS.md 3).
type Rules struct {
	Stages   int // S, stage 0 included
	Skip     int // stages every microbatch skips: S - L
	MaxJump  int // most stages one jump may skip
	MaxSwaps int // most swaps of neighbouring visits per path
	Mu       int // activations a node may hold: paths through one node
	// MinStageLoad, when positive, is the fewest microbatches every stage
	// s >= 1 must receive: our addition, not the paper's (its rules cap a
	// stage's load but set no floor, so a schedule may leave a slow stage
	// untrained for an iteration). 0 turns the rule off.
	MinStageLoad int
}

// DefaultRules are the paper's defaults: 6 stages, L = 4 (skip ratio 33%),
// jumps of at most 3 stages, at most 2 swaps, mu = 3.
func DefaultRules() Rules {
	return Rules{Stages: 6, Skip: 2, MaxJump: 3, MaxSwaps: 2, Mu: 3}
}

// PathLen returns L, the number of visits in every path.
func (r Rules) PathLen() int { return r.Stages - r.Skip }

// SkipRatio returns k = 1 - L/S.
func (r Rules) SkipRatio() float64 { return float64(r.Skip) / float64(r.Stages) }

// Validate reports the first parameter out of range.
func (r Rules) Validate() error {
	switch {
	case r.Stages < 1 || r.Stages > 256:
		return fmt.Errorf("%w: stages %d outside [1, 256]", ErrConfig, r.Stages)
	case r.Skip < 0 || r.Skip > r.Stages-1:
		return fmt.Errorf("%w: skip %d outside [0, %d]: stage 0 is never skipped", ErrConfig, r.Skip, r.Stages-1)
	case r.MaxJump < 0:
		return fmt.Errorf("%w: max jump %d is negative", ErrConfig, r.MaxJump)
	case r.MaxSwaps < 0:
		return fmt.Errorf("%w: max swaps %d is negative", ErrConfig, r.MaxSwaps)
	case r.Mu < 1 || r.Mu > 1<<16:
		return fmt.Errorf("%w: mu %d outside [1, 65536]", ErrConfig, r.Mu)
	case r.MinStageLoad < 0:
		return fmt.Errorf("%w: min stage load %d is negative", ErrConfig, r.MinStageLoad)
	}
	return nil
}

// Validate checks every path against every rule and the placement, and
// returns the first violation, wrapping the rule's sentinel error and naming
// the microbatch (its index in paths), stage or node.
func Validate(paths []Path, pl Placement, r Rules) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if pl.Stages != r.Stages {
		return fmt.Errorf("%w: placement has %d stages, rules %d", ErrConfig, pl.Stages, r.Stages)
	}
	for m, p := range paths {
		if err := validatePath(p, pl, r); err != nil {
			return fmt.Errorf("microbatch %d: %w", m, err)
		}
	}
	return validateLoads(paths, pl, r)
}

func validatePath(p Path, pl Placement, r Rules) error {
	if len(p.Nodes) != len(p.Stages) || len(p.Nodes) == 0 {
		return fmt.Errorf("%w: %d nodes for %d stages", ErrMalformed, len(p.Nodes), len(p.Stages))
	}
	if err := checkVisits(p, pl); err != nil {
		return err
	}
	if len(p.Stages) != r.PathLen() {
		return fmt.Errorf("%w: %d visits skip %d stages, want %d", ErrSkips, len(p.Stages), r.Stages-len(p.Stages), r.Skip)
	}
	sorted, swaps, ok := unswap(p.Stages)
	if !ok || swaps > r.MaxSwaps {
		return fmt.Errorf("%w: order %v is not the ascending order with at most %d disjoint neighbour swaps", ErrSwaps, p.Stages, r.MaxSwaps)
	}
	return checkJumps(sorted, r)
}

// unswap undoes disjoint swaps of neighbouring visits, left to right, and
// reports the ascending order, the number of swaps, and whether the order
// was of that form at all (for instance [0 3 1 2] is not: 3 moved two places).
func unswap(stages []int) (sorted []int, swaps int, ok bool) {
	sorted = slices.Clone(stages)
	for i := 1; i+1 < len(sorted); i++ {
		if sorted[i] > sorted[i+1] {
			sorted[i], sorted[i+1] = sorted[i+1], sorted[i]
			swaps++
			i++ // disjoint: the next swap starts after this pair
		}
	}
	return sorted, swaps, slices.IsSorted(sorted)
}

// checkJumps checks rule 4 on the ascending visits: between two visits,
// and from the last visit to the end of the model (the return to stage 0's
// head), at most MaxJump stages go unvisited.
func checkJumps(sorted []int, r Rules) error {
	for i := 1; i <= len(sorted); i++ {
		next := r.Stages // the head, after the last stage
		if i < len(sorted) {
			next = sorted[i]
		}
		if gap := next - sorted[i-1] - 1; gap > r.MaxJump {
			return fmt.Errorf("%w: from stage %d to %d skips %d stages, at most %d", ErrJump, sorted[i-1], next%r.Stages, gap, r.MaxJump)
		}
	}
	return nil
}

// checkVisits checks the visits of a path (as many nodes as stages)
// against a placement: stages and nodes that exist, each node visited for
// the stage it serves, stage 0 first and only first, no stage twice. Both
// Validate and the relay (which must not run a path it cannot carry) rely
// on it.
func checkVisits(p Path, pl Placement) error {
	seen := make([]bool, pl.Stages)
	for i, s := range p.Stages {
		v := p.Nodes[i]
		switch {
		case s < 0 || s >= pl.Stages:
			return fmt.Errorf("%w: visit %d to stage %d of %d", ErrMalformed, i, s, pl.Stages)
		case v < 0 || v >= len(pl.StageOf):
			return fmt.Errorf("%w: visit %d to node %d of %d", ErrMalformed, i, v, len(pl.StageOf))
		case pl.StageOf[v] != s:
			return fmt.Errorf("%w: visit %d to node %d for stage %d; it serves stage %d", ErrPlacement, i, v, s, pl.StageOf[v])
		case (i == 0) != (s == 0):
			return fmt.Errorf("%w: visit %d is to stage %d", ErrStageZero, i, s)
		case seen[s]:
			return fmt.Errorf("%w: stage %d", ErrRepeat, s)
		}
		seen[s] = true
	}
	return nil
}

// validateLoads checks rules 6, 6b and 7 over the whole iteration. Rule 6
// follows from rule 7 (every path starts at one of the n_1 stage-0 nodes,
// so at most n_1*mu paths exist while no node exceeds mu); it is checked
// first so that a schedule with too many microbatches is reported by the
// rule the paper states for it.
func validateLoads(paths []Path, pl Placement, r Rules) error {
	perStage := make([]int, r.Stages)
	perNode := make([]int, len(pl.StageOf))
	for _, p := range paths {
		for i, s := range p.Stages {
			perStage[s]++
			perNode[p.Nodes[i]]++
		}
	}
	capacity := len(pl.Nodes(0)) * r.Mu
	for s := 1; s < r.Stages; s++ {
		if perStage[s] > capacity {
			return fmt.Errorf("%w: stage %d receives %d microbatches, cap n_1*mu = %d", ErrStageLoad, s, perStage[s], capacity)
		}
		if perStage[s] < r.MinStageLoad {
			return fmt.Errorf("%w: stage %d receives %d microbatches, floor %d", ErrStageUnderload, s, perStage[s], r.MinStageLoad)
		}
	}
	for v, n := range perNode {
		if n > r.Mu {
			return fmt.Errorf("%w: node %d is on %d paths, mu = %d", ErrNodeMemory, v, n, r.Mu)
		}
	}
	return nil
}
