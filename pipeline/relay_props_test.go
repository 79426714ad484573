package pipeline

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/skein-ml/skein/compression"
)

func testRelayConfig(stages int, stageOf []int) RelayConfig {
	c := compression.DefaultConfig()
	c.Codec, c.ZstdLevel, c.Workers = compression.FP32, 0, 1
	return RelayConfig{Placement: Placement{Stages: stages, StageOf: stageOf}, Len: 16, Codec: c, Mu: 3, HopWait: 10, MaxStashBytes: 1 << 20}
}

func TestRelayConfigValidate(t *testing.T) {
	good := testRelayConfig(3, []int{0, 1, 2})
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := DefaultRelayConfig(good.Placement, 1, 4096, 0.05).Validate(); err != nil {
		t.Fatalf("default: %v", err)
	}
	for name, edit := range map[string]func(*RelayConfig){
		"no stages":         func(c *RelayConfig) { c.Placement.Stages = 0 },
		"self out of range": func(c *RelayConfig) { c.Self = 3 },
		"self unassigned":   func(c *RelayConfig) { c.Placement.StageOf = []int{Unassigned, 1, 2} },
		"stage past count":  func(c *RelayConfig) { c.Placement.StageOf = []int{5, 1, 2} },
		"zero length":       func(c *RelayConfig) { c.Len = 0 },
		"zero mu":           func(c *RelayConfig) { c.Mu = 0 },
		"zero hop wait":     func(c *RelayConfig) { c.HopWait = 0 },
		"negative stash":    func(c *RelayConfig) { c.MaxStashBytes = -1 },
		"no codec":          func(c *RelayConfig) { c.Codec.Codec = 0 },
		"negative clip":     func(c *RelayConfig) { c.Bounds.Clip = -1 },
		"NaN rms cap":       func(c *RelayConfig) { c.Bounds.MaxRMS = math.NaN() },
		"drop below clip":   func(c *RelayConfig) { c.Bounds = TensorBounds{Clip: 4, Drop: 2} },
	} {
		c := good
		c.Placement.StageOf = slices.Clone(good.Placement.StageOf)
		edit(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestRelayBeginRejects: a schedule the relay cannot run is refused whole,
// with the rule's sentinel, and leaves the machine as it was.
func TestRelayBeginRejects(t *testing.T) {
	cfg := testRelayConfig(3, []int{0, 1, 2, 1})
	p := func(nodes ...int) Path {
		q := Path{Nodes: nodes}
		for _, v := range nodes {
			if v >= 0 && v < 4 {
				q.Stages = append(q.Stages, cfg.Placement.StageOf[v])
			} else {
				q.Stages = append(q.Stages, 1)
			}
		}
		return q
	}
	for _, tc := range []struct {
		name  string
		paths []Path
		want  error
	}{
		{"unknown node", []Path{p(0, 9)}, ErrMalformed},
		{"lengths differ", []Path{{Nodes: []int{0, 1}, Stages: []int{0}}}, ErrMalformed},
		{"too long", []Path{{Nodes: []int{0, 1, 2, 3}, Stages: []int{0, 1, 2, 1}}}, ErrMalformed},
		{"wrong stage", []Path{{Nodes: []int{0, 1}, Stages: []int{0, 2}}}, ErrPlacement},
		{"not from stage 0", []Path{p(1, 2)}, ErrStageZero},
		{"stage twice", []Path{p(0, 1, 3)}, ErrRepeat},
		{"over mu", []Path{p(0, 1), p(0, 1), p(0, 3), p(0, 2)}, ErrNodeMemory},
	} {
		m, err := NewRelay(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Begin(1, tc.paths); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if rd := m.Ready(); m.Held() != 0 || len(rd.Work)+len(rd.Messages)+len(rd.Outcomes) != 0 {
			t.Errorf("%s: a refused schedule did something: %+v", tc.name, rd)
		}
		if n, err := m.Begin(1, []Path{p(0, 1, 2)}); err != nil || n != 1 {
			t.Errorf("%s: then a good schedule: %d, %v", tc.name, n, err)
		}
		if _, err := m.Begin(1, nil); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: iteration 1 again: %v", tc.name, err)
		}
		m.Close()
	}
}

// scheduled returns a placement and a SkipPipe schedule on the shipped
// 20-node network (6 stages, skip 2, mu 3).
func scheduled(t testing.TB, steps int) (Placement, []Path) {
	net, pl := plannedVolunteers20(t)
	cfg := DefaultScheduleConfig()
	cfg.SearchSteps = steps
	sc, err := SchedulePaths(net, pl, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return pl, sc.Paths
}

// TestRelayRunsSchedules runs SchedulePaths' schedules (skips, swaps,
// several stage-0 nodes) through the relay, fp32 and bf16: every
// microbatch finishes with the result of its own stages in its own order.
func TestRelayRunsSchedules(t *testing.T) {
	pl, paths := scheduled(t, 50)
	skipped := 0
	for _, p := range paths {
		skipped += pl.Stages - len(p.Stages)
	}
	if skipped == 0 {
		t.Fatal("the schedule skips nothing")
	}
	for _, codec := range []compression.Codec{compression.FP32, compression.BF16} {
		cfg := testRelayConfig(pl.Stages, pl.StageOf)
		cfg.Codec.Codec = codec
		s := newRelaySim(t, cfg, pl.StageOf)
		s.paths = paths
		var all []int
		for v, st := range pl.StageOf {
			if st >= 0 {
				all = append(all, v)
			}
		}
		s.begin(1, all)
		s.runUntil(1000)
		for mb := range paths {
			if err := s.checkOK(1, mb); err != nil {
				t.Fatalf("%s: %v", codec, err)
			}
		}
		for v := range s.m {
			if s.m[v].Held() != 0 || len(s.run[v].held) != 0 {
				t.Fatalf("%s: node %d still holds microbatches", codec, v)
			}
		}
		t.Logf("%s: %d microbatches of %d visits in %d ticks, %d bytes", codec, len(paths), len(paths[0].Nodes), s.now, s.bytes)
	}
}

// TestRelayRandomFaults runs random schedules with random link delays,
// compute times and one node crashing at a random tick, and requires what
// the relay promises: every visit of a live node ends exactly once (no
// hang, no second outcome), a microbatch whose path avoids the crashed
// node finishes with the right result, one that needed it after it
// crashed fails, and no live node keeps anything.
func TestRelayRandomFaults(t *testing.T) {
	pl, base := scheduled(t, 0)
	seeds := 200
	if testing.Short() || raceEnabled {
		seeds = 40
	}
	failed := 0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 99))
		cfg := testRelayConfig(pl.Stages, pl.StageOf)
		cfg.HopWait = 12
		s := newRelaySim(t, cfg, pl.StageOf)
		s.paths = base
		for v := range s.m {
			s.delay[v] = 1 + rng.Int64N(3)
			s.comp[v] = 1 + rng.Int64N(2)
		}
		var nodes []int
		for v, st := range pl.StageOf {
			if st >= 0 {
				nodes = append(nodes, v)
			}
		}
		victim := nodes[rng.IntN(len(nodes))]
		at := rng.IntN(40)
		s.begin(1, nodes)
		for range at {
			s.step()
		}
		s.crash[victim] = true
		s.runUntil(2000)
		if !s.settled() {
			t.Fatalf("seed %d: not settled after %d ticks (node %d crashed at %d)", seed, s.now, victim, at)
		}
		for mb, p := range base {
			o, ok := s.origin(1, mb)
			switch {
			case p.Nodes[0] == victim:
			case !slices.Contains(p.Nodes, victim):
				if err := s.checkOK(1, mb); err != nil {
					t.Fatalf("seed %d (node %d crashed at %d): %v", seed, victim, at, err)
				}
			case !ok:
				t.Fatalf("seed %d: microbatch %d has no outcome", seed, mb)
			case o.Err == nil:
				if err := s.checkOK(1, mb); err != nil { // it passed the victim before the crash
					t.Fatalf("seed %d: %v", seed, err)
				}
			case !errors.Is(o.Err, ErrTimeout) && !errors.Is(o.Err, ErrHopFailed):
				t.Fatalf("seed %d: microbatch %d failed with %v", seed, mb, o.Err)
			default:
				failed++
			}
		}
		for _, v := range nodes {
			if v != victim && (s.m[v].Held() != 0 || len(s.run[v].held) != 0) {
				t.Fatalf("seed %d: node %d still holds microbatches", seed, v)
			}
		}
	}
	if failed == 0 {
		t.Fatal("no microbatch failed: the crashes never mattered")
	}
	t.Logf("%d microbatches failed over %d seeds", failed, seeds)
}

// FuzzRelayStep feeds arbitrary bytes, as if from any node, to a node in
// the middle of an iteration: nothing panics, every visit still ends
// exactly once, and nothing is left held. A sender on no path cannot
// change any microbatch's outcome.
func FuzzRelayStep(f *testing.F) {
	stageOf := []int{0, 1, 2, 1, 2, 1}
	paths := []Path{{Nodes: []int{0, 1, 2}, Stages: []int{0, 1, 2}}, {Nodes: []int{0, 3, 4}, Stages: []int{0, 1, 2}}}
	{
		s := newRelaySim(f, testRelayConfig(3, stageOf), stageOf)
		s.paths = paths
		s.begin(1, []int{0, 1, 2, 3, 4, 5})
		seen := map[relayKind]bool{}
		for range 30 {
			for _, m := range s.queue {
				if h, err := parseRelayMsg(m.payload); err == nil && !seen[h.kind] {
					seen[h.kind] = true
					f.Add(m.payload, uint8(m.from), uint8(m.to), uint8(0))
				}
			}
			s.step()
		}
	}
	f.Add(appendRelayMsg(nil, relayMsg{kind: kindFail, iter: 1, path: paths[0], hop: 1, reason: reasonMemory}), uint8(1), uint8(0), uint8(3))
	f.Add(appendRelayMsg(nil, relayMsg{kind: kindAbort, iter: 2, path: paths[1], hop: 1}), uint8(0), uint8(3), uint8(1))
	f.Fuzz(func(t *testing.T, payload []byte, from, to, phase uint8) {
		s := newRelaySim(t, testRelayConfig(3, stageOf), stageOf)
		s.paths = paths
		s.begin(1, []int{0, 1, 2, 3, 4, 5})
		for range phase % 12 {
			s.step()
		}
		src, dst := int(from)%(len(stageOf)+1)-1, int(to)%len(stageOf) // src -1: not a node
		s.m[dst].Step(src, payload)
		s.collect(dst)
		s.runUntil(500)
		if !s.settled() {
			t.Fatal("not settled")
		}
		for v := range s.m {
			if s.m[v].Held() != 0 || len(s.run[v].held) != 0 {
				t.Fatalf("node %d still holds microbatches", v)
			}
		}
		if src == 5 || src < 0 {
			for mb := range paths {
				if err := s.checkOK(1, mb); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
