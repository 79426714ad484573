package pipeline

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/skein-ml/skein/sim"
)

// cases returns how many random cases a property test runs: n normally, a
// quarter under -race (about ten times slower), a tenth with -short; at
// least 100.
func cases(n int) int {
	switch {
	case testing.Short():
		return max(n/10, 100)
	case raceEnabled:
		return max(n/4, 100)
	}
	return n
}

// randomCase draws a network, rules and a workload.
type randomCase struct {
	net   *sim.Network
	rules Rules
	w     Workload
}

func drawCase(t *testing.T, seed uint64) randomCase {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	S := 2 + rng.IntN(9) // 2..10 stages
	n := S + rng.IntN(3*S+1)
	net, err := sim.RandomNetwork(seed, n)
	if err != nil {
		t.Fatal(err)
	}
	w := DefaultWorkload()
	w.Layers = S + rng.IntN(4*S) // uneven splits too
	return randomCase{
		net: net,
		w:   w,
		rules: Rules{
			Stages:   S,
			Skip:     rng.IntN(S),
			MaxJump:  rng.IntN(5),
			MaxSwaps: rng.IntN(3),
			Mu:       1 + rng.IntN(4),
		},
	}
}

// TestSchedulePropertyRandomNetworks: on thousands of random networks and
// rule sets (half of them with a stage floor up to the even share, rule
// 6b), every schedule the scheduler emits passes Validate, starts mu
// microbatches at every stage-0 node, and reports the iteration time the
// simulator gives its paths, never worse than the greedy start (to the
// search's 1e-9 s tie tolerance); and the scheduler fails exactly when no
// path can obey the jump rule (skip > L * MaxJump).
func TestSchedulePropertyRandomNetworks(t *testing.T) {
	scheduled := 0
	for seed := range uint64(cases(3000)) {
		c := drawCase(t, seed)
		pl, err := Plan(c.net, PlanConfig{Stages: c.rules.Stages, Mu: c.rules.Mu, Workload: c.w, MaxRounds: 2}, nil)
		if errors.Is(err, ErrInfeasible) {
			continue // too few nodes with the memory: checked in the placement tests
		}
		if err != nil {
			t.Fatalf("seed %d: Plan: %v", seed, err)
		}
		c.rules.MinStageLoad = drawFloor(c.rules, len(pl.Nodes(0))*c.rules.Mu, seed)
		cfg := ScheduleConfig{Rules: c.rules, Workload: c.w, SearchSteps: 16, Seed: seed}
		sc, err := SchedulePaths(c.net, pl, cfg)
		L := c.rules.PathLen()
		if jumpable := c.rules.Skip <= L*c.rules.MaxJump; !jumpable {
			if !errors.Is(err, ErrInfeasible) {
				t.Fatalf("seed %d %+v: no path obeys the jump rule, got %v", seed, c.rules, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("seed %d %+v: %v", seed, c.rules, err)
		}
		if err := Validate(sc.Paths, pl, c.rules); err != nil {
			t.Fatalf("seed %d %+v: %v", seed, c.rules, err)
		}
		if want := len(pl.Nodes(0)) * c.rules.Mu; len(sc.Paths) != want {
			t.Fatalf("seed %d: %d microbatches, want n_1*mu = %d", seed, len(sc.Paths), want)
		}
		res, err := Simulate(c.net, sc.Paths, c.rules.Stages, c.w, sim.Faults{})
		if err != nil || res.Makespan != sc.Iteration || sc.Iteration > sc.Greedy+1e-9 {
			t.Fatalf("seed %d: iteration %v, simulated %v (%v), greedy %v", seed, sc.Iteration, res.Makespan, err, sc.Greedy)
		}
		scheduled++
	}
	if scheduled < cases(3000)/2 {
		t.Errorf("only %d of %d cases were schedulable: the generator is off", scheduled, cases(3000))
	}
}

// drawFloor returns, for half the cases where every stage lies on some path
// the jump rule allows, a MinStageLoad between 1 and the even share of the
// iteration's visits, floor(micro*(L-1)/(S-1)); 0 otherwise.
func drawFloor(r Rules, micro int, seed uint64) int {
	subs, err := subsets(r)
	if err != nil || r.Stages < 2 || seed%2 == 0 {
		return 0
	}
	on := map[int]bool{}
	for _, sub := range subs {
		for _, s := range sub {
			on[s] = true
		}
	}
	even := micro * (r.PathLen() - 1) / (r.Stages - 1)
	if len(on) < r.Stages-1 || even < 1 {
		return 0
	}
	return 1 + int(seed/2)%even
}

func TestScheduleDeterministic(t *testing.T) {
	net, pl := plannedVolunteers20(t)
	cfg := DefaultScheduleConfig()
	cfg.SearchSteps = 100
	a, err := SchedulePaths(net, pl, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := SchedulePaths(net, pl, cfg)
	if !reflect.DeepEqual(a, b) {
		t.Error("two runs with one config differ")
	}
}

// TestValidateMatchesReference: on random paths, mostly broken, Validate
// accepts exactly those a reference checker written differently accepts
// (swaps by enumerating every set of disjoint neighbour swaps of the
// ascending order), and when it rejects, the rule it names is one the
// reference finds broken.
func TestValidateMatchesReference(t *testing.T) {
	valid := 0
	for seed := range uint64(cases(20000)) {
		rng := rand.New(rand.NewPCG(seed, 2))
		S := 2 + rng.IntN(7)
		r := Rules{Stages: S, Skip: rng.IntN(S), MaxJump: rng.IntN(4), MaxSwaps: rng.IntN(3), Mu: 1 + rng.IntN(3)}
		// Two nodes per stage, node 2s and 2s+1.
		pl := Placement{Stages: S, StageOf: make([]int, 2*S)}
		for v := range pl.StageOf {
			pl.StageOf[v] = v / 2
		}
		paths := make([]Path, 1+rng.IntN(2*r.Mu))
		for m := range paths {
			paths[m] = randomPath(rng, r, pl)
		}
		broken := referenceBroken(paths, pl, r)
		err := Validate(paths, pl, r)
		switch {
		case len(broken) == 0 && err != nil:
			t.Fatalf("seed %d %+v %v: reference accepts, Validate: %v", seed, r, paths, err)
		case len(broken) > 0 && err == nil:
			t.Fatalf("seed %d %+v %v: reference finds %v, Validate accepts", seed, r, paths, broken)
		case err != nil && !slices.ContainsFunc(broken, func(b error) bool { return errors.Is(err, b) }):
			t.Fatalf("seed %d %+v %v: Validate says %v, reference finds %v", seed, r, paths, err, broken)
		}
		if err == nil {
			valid++
		}
	}
	if valid == 0 {
		t.Error("no random case was valid: the generator tests only rejections")
	}
}

// randomPath draws a path that is often close to valid: stage 0 first, a
// random subset of the right size or near it, a few random swaps, nodes of
// the right stage; and now and then a wrong node or a stage out of place.
func randomPath(rng *rand.Rand, r Rules, pl Placement) Path {
	L := r.PathLen() + rng.IntN(3) - 1
	L = min(max(L, 1), r.Stages)
	rest := rng.Perm(r.Stages - 1)[:L-1]
	stages := []int{0}
	for _, s := range rest {
		stages = append(stages, s+1)
	}
	slices.Sort(stages[1:])
	for range rng.IntN(4) {
		if len(stages) > 2 {
			i := 1 + rng.IntN(len(stages)-2)
			stages[i], stages[i+1] = stages[i+1], stages[i]
		}
	}
	if rng.IntN(10) == 0 {
		stages[rng.IntN(len(stages))] = rng.IntN(r.Stages)
	}
	p := Path{Stages: stages}
	for _, s := range stages {
		v := 2*s + rng.IntN(2)
		if rng.IntN(20) == 0 {
			v = rng.IntN(len(pl.StageOf))
		}
		p.Nodes = append(p.Nodes, v)
	}
	return p
}

// referenceBroken lists the sentinel of every rule the paths break.
func referenceBroken(paths []Path, pl Placement, r Rules) []error {
	var broken []error
	for _, p := range paths {
		for i, v := range p.Nodes {
			if pl.StageOf[v] != p.Stages[i] {
				broken = append(broken, ErrPlacement)
			}
		}
		if p.Stages[0] != 0 || slices.Contains(p.Stages[1:], 0) {
			broken = append(broken, ErrStageZero)
		}
		seen := map[int]bool{}
		for _, s := range p.Stages {
			if seen[s] {
				broken = append(broken, ErrRepeat)
			}
			seen[s] = true
		}
		if len(p.Stages) != r.PathLen() {
			broken = append(broken, ErrSkips)
		}
		sorted := slices.Sorted(slices.Values(p.Stages))
		if !reachableBySwaps(sorted, p.Stages, r.MaxSwaps) {
			broken = append(broken, ErrSwaps)
		}
		visited := append(slices.Clone(sorted), r.Stages)
		for i := 1; i < len(visited); i++ {
			if visited[i]-visited[i-1]-1 > r.MaxJump {
				broken = append(broken, ErrJump)
			}
		}
	}
	perStage, perNode := map[int]int{}, map[int]int{}
	for _, p := range paths {
		for i, s := range p.Stages {
			perStage[s]++
			perNode[p.Nodes[i]]++
		}
	}
	for s, n := range perStage {
		if s > 0 && n > len(pl.Nodes(0))*r.Mu {
			broken = append(broken, ErrStageLoad)
		}
	}
	for _, n := range perNode {
		if n > r.Mu {
			broken = append(broken, ErrNodeMemory)
		}
	}
	return broken
}

// reachableBySwaps reports whether target is sorted with at most k swaps of
// disjoint neighbouring positions (position 0, stage 0, never moves),
// trying every set of such swaps.
func reachableBySwaps(sorted, target []int, k int) bool {
	var try func(from, left int, cur []int) bool
	try = func(from, left int, cur []int) bool {
		if slices.Equal(cur, target) {
			return true
		}
		if left == 0 {
			return false
		}
		for i := from; i+1 < len(cur); i++ {
			next := slices.Clone(cur)
			next[i], next[i+1] = next[i+1], next[i]
			if try(i+2, left-1, next) {
				return true
			}
		}
		return false
	}
	return try(1, k, sorted)
}
