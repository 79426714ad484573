package pipeline

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/skein-ml/skein/sim"
)

func counts(pl Placement) []int {
	c := make([]int, pl.Stages)
	for _, s := range pl.StageOf {
		if s >= 0 {
			c[s]++
		}
	}
	return c
}

// checkRule asserts what every placement guarantees: stage 0 is not empty,
// no stage is smaller than stage 0.
func checkRule(t *testing.T, pl Placement) {
	t.Helper()
	c := counts(pl)
	for s := range c {
		if c[0] == 0 || c[s] < c[0] {
			t.Fatalf("stage sizes %v: stage 0 empty or a stage smaller than it", c)
		}
	}
}

func TestPlanBuiltin(t *testing.T) {
	net, pl := plannedVolunteers20(t)
	// 20 nodes, 6 stages: floor(20/6) = 3 at stage 0, the 2 left over to
	// stages 1 and 2 (the swap search keeps sizes).
	if got, want := counts(pl), []int{3, 4, 4, 3, 3, 3}; !reflect.DeepEqual(got, want) {
		t.Errorf("stage sizes %v, want %v", got, want)
	}
	again, _ := Plan(net, DefaultPlanConfig(), nil)
	if !reflect.DeepEqual(pl, again) {
		t.Error("Plan is not deterministic")
	}
}

func TestPlanMemory(t *testing.T) {
	net := volunteers20(t)
	// A stash that only the 256 GiB and 128 GiB servers can hold: with 4
	// layers and mu = 3, (28.4 MB + 3 * 9 GiB) * 4 = 108 GiB per node.
	cfg := DefaultPlanConfig()
	cfg.Workload.StashBytesPerLayer = 9 << 30
	if _, err := Plan(net, cfg, nil); !errors.Is(err, ErrInfeasible) {
		t.Errorf("two nodes for six stages: %v", err)
	}
	// 1.5 GiB of stash per layer: nodes of 8 GiB (<= 18.1 GiB) stay out.
	cfg.Workload.StashBytesPerLayer = 1.5 * (1 << 30)
	pl, err := Plan(net, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	need := cfg.Workload.Memory(0, cfg.Stages, cfg.Mu)
	for v, s := range pl.StageOf {
		if fits := net.Node(v).MemoryBytes >= need; fits != (s != Unassigned) {
			t.Errorf("node %s with %.1f GiB: stage %d", net.Node(v).ID, net.Node(v).MemoryBytes/(1<<30), s)
		}
	}
	checkRule(t, pl)
}

// TestReplanMovesOnlyWhenNeeded: after random departures and arrivals, the
// re-plan obeys the rule, moves no survivor when the newcomers can cover
// what the rule needs, and otherwise moves at most the shortfall they leave.
func TestReplanMovesOnlyWhenNeeded(t *testing.T) {
	for seed := range uint64(cases(1000)) {
		rng := rand.New(rand.NewPCG(seed, 3))
		S := 2 + rng.IntN(7)
		net, err := sim.RandomNetwork(seed, S+rng.IntN(3*S))
		if err != nil {
			t.Fatal(err)
		}
		cfg := PlanConfig{Stages: S, Mu: 3, Workload: DefaultWorkload(), MaxRounds: 1}
		pl, err := Plan(net, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		next, joined := churn(t, rng, net, seed)
		prev := pl.ByID(net)
		re, err := Plan(next, cfg, prev)
		if errors.Is(err, ErrInfeasible) && next.N() < S {
			continue
		}
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		checkRule(t, re)
		// What the rule needs of the survivors' sizes, as newcomers.
		surv := make([]int, S)
		moved := 0
		for v, s := range re.StageOf {
			if old, ok := prev[next.Node(v).ID]; ok {
				surv[old]++
				if s != old {
					moved++
				}
			}
		}
		c0 := max(surv[0], 1)
		needed := c0 - surv[0]
		for s := 1; s < S; s++ {
			needed += max(0, c0-surv[s])
		}
		if limit := max(0, needed-joined); moved > limit {
			t.Fatalf("seed %d: %d survivors moved; survivors %v and %d newcomers needed at most %d", seed, moved, surv, joined, limit)
		}
	}
}

// churn removes a random share of net's nodes and adds a random number of
// new ones, returning the new network and how many joined.
func churn(t *testing.T, rng *rand.Rand, net *sim.Network, seed uint64) (*sim.Network, int) {
	t.Helper()
	spec := net.Spec()
	leave := rng.Float64() * 0.6
	spec.Nodes = spec.Nodes[:0]
	for i := range net.N() {
		if rng.Float64() >= leave {
			spec.Nodes = append(spec.Nodes, net.Spec().Nodes[i])
		}
	}
	smp := sim.NewSampler(seed+1e6, spec)
	joined := rng.IntN(5)
	for i := range joined {
		n := smp.Node()
		n.ID = fmt.Sprintf("new%d", i)
		spec.Nodes = append(spec.Nodes, n)
	}
	if len(spec.Nodes) == 0 {
		spec.Nodes = append(spec.Nodes, net.Spec().Nodes[0])
	}
	next, err := sim.NewNetwork(spec)
	if err != nil {
		t.Fatal(err)
	}
	return next, joined
}

func TestReplanKeepsEveryoneOnJoin(t *testing.T) {
	net, pl := plannedVolunteers20(t)
	// One node leaves a stage of 4 (no rule broken), another joins.
	prev := pl.ByID(net)
	var gone string
	for v, s := range pl.StageOf {
		if s == 1 {
			gone = net.Node(v).ID
		}
	}
	spec := net.Spec()
	for i, n := range spec.Nodes {
		if n.ID == gone {
			spec.Nodes = append(spec.Nodes[:i], spec.Nodes[i+1:]...)
			break
		}
	}
	spec.Nodes = append(spec.Nodes, sim.NodeSpec{ID: "newcomer", Region: "eu-west", Speed: 50, MemoryGiB: 16, UpMbps: 100, DownMbps: 500, AccessMs: 5})
	next, err := sim.NewNetwork(spec)
	if err != nil {
		t.Fatal(err)
	}
	re, err := Plan(next, DefaultPlanConfig(), prev)
	if err != nil {
		t.Fatal(err)
	}
	for v, s := range re.StageOf {
		if old, ok := prev[next.Node(v).ID]; ok && old != s {
			t.Errorf("%s moved from stage %d to %d", next.Node(v).ID, old, s)
		}
	}
	checkRule(t, re)
}

func TestPlanConfigValidate(t *testing.T) {
	bad := []PlanConfig{
		{Stages: 0, Mu: 3, Workload: DefaultWorkload()},
		{Stages: 6, Mu: 0, Workload: DefaultWorkload()},
		{Stages: 6, Mu: 3, Workload: Workload{}},
		{Stages: 6, Mu: 3, Workload: DefaultWorkload(), MaxRounds: -1},
	}
	for _, c := range bad {
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
}
