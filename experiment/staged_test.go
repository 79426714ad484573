package experiment

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/skein-ml/skein/pipeline"
)

// smallStaged is a staged run small enough for -race in CI: 3 stages of 2
// replicas, 4 microbatches of 2x32 tokens, a DiLoCo round every 2 steps.
func smallStaged() StagedConfig {
	c := DefaultStagedConfig()
	c.Batch, c.SeqLen, c.Steps, c.InnerSteps, c.EvalBatches = 2, 32, 4, 2, 1
	c.AdamW.LR, c.AdamW.Warmup = 3e-3, 1
	return c
}

func TestStagedConfigValidate(t *testing.T) {
	if err := DefaultStagedConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for name, mut := range map[string]func(c *StagedConfig){
		"skip ratio not whole": func(c *StagedConfig) { c.SkipRatio = 0.25 },
		"one stage":            func(c *StagedConfig) { c.Stages = 1 },
		"more stages than layers": func(c *StagedConfig) {
			c.Stages = 6
		},
		"too few microbatches": func(c *StagedConfig) { c.Microbatches = 1 },
		"mu too small":         func(c *StagedConfig) { c.Mu = 1 },
		"failure off a round":  func(c *StagedConfig) { c.Failure = &StageFailure{Step: 5, Stage: 1, Recovery: CheckFree} },
		// With 3 stages, stage 1 has a transformer neighbour on one side
		// only: plain CheckFree cannot rebuild it.
		"edge stage": func(c *StagedConfig) { c.Failure = &StageFailure{Step: 10, Stage: 1, Recovery: CheckFree} },
	} {
		c := DefaultStagedConfig()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	c := DefaultStagedConfig()
	c.SkipRatio = 1.0 / 3
	if err := c.Validate(); err != nil || c.Skip() != 1 {
		t.Fatalf("skip 1/3: %v, skip %d", err, c.Skip())
	}
}

// TestStagedSchedule checks the round robin against the path rules for
// both skip ratios over several iterations, and that skipping spreads the
// microbatches over the skippable stages.
func TestStagedSchedule(t *testing.T) {
	for _, k := range []float64{0, 1.0 / 3} {
		c := smallStaged()
		c.SkipRatio = k
		r := &stagedRun{cfg: c, pl: pipeline.Placement{Stages: 3, StageOf: []int{0, 0, 1, 1, 2, 2}},
			rules: pipeline.Rules{Stages: 3, Skip: c.Skip(), MaxJump: 3, MaxSwaps: 2, Mu: c.mu(), MinStageLoad: 1}}
		for iter := uint64(1); iter <= 4; iter++ {
			paths, err := r.paths(iter)
			if err != nil {
				t.Fatalf("skip %v, iteration %d: %v", k, iter, err)
			}
			visits := make([]int, 6)
			for _, p := range paths {
				if len(p.Stages) != 3-c.Skip() {
					t.Fatalf("skip %v: path %v", k, p)
				}
				for _, v := range p.Nodes {
					visits[v]++
				}
			}
			per := 2 // each of 4 microbatches visits stage 0; each replica takes half
			if k > 0 {
				per = 1 // stages 1 and 2 each see half the microbatches
			}
			if !slices.Equal(visits[2:], []int{per, per, per, per}) || !slices.Equal(visits[:2], []int{2, 2}) {
				t.Fatalf("skip %v, iteration %d: visits per node %v", k, iter, visits)
			}
		}
	}
}

func TestStagedTrainingLearnsAndIsDeterministic(t *testing.T) {
	cfg := smallStaged()
	a, err := RunStaged(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.TrainLoss) != cfg.Steps || len(a.Curve) != 3 {
		t.Fatalf("train losses %v, curve %+v", a.TrainLoss, a.Curve)
	}
	// The first steps' mean against the last steps': one step's batches
	// differ from the next's, so compare means, not single steps.
	first := (a.TrainLoss[0] + a.TrainLoss[1]) / 2
	last := (a.TrainLoss[cfg.Steps-2] + a.TrainLoss[cfg.Steps-1]) / 2
	if !(last < first-0.1) {
		t.Errorf("training loss %v did not fall", a.TrainLoss)
	}
	if !(a.FinalValLoss < a.Curve[0].ValLoss) {
		t.Errorf("validation loss %v -> %v did not fall", a.Curve[0].ValLoss, a.FinalValLoss)
	}
	b, err := RunStaged(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.TrainLoss {
		if math.Float32bits(a.TrainLoss[i]) != math.Float32bits(b.TrainLoss[i]) {
			t.Fatalf("step %d: losses %v and %v", i, a.TrainLoss, b.TrainLoss)
		}
	}
	for i := range a.Curve {
		if math.Float32bits(a.Curve[i].ValLoss) != math.Float32bits(b.Curve[i].ValLoss) {
			t.Fatalf("eval %d: %+v vs %+v", i, a.Curve[i], b.Curve[i])
		}
	}
	t.Logf("train losses %v; validation %+v", a.TrainLoss, a.Curve)
}

// NoLoCo within each stage, with random routing between replicas: every
// path still passes the rules, the routing is not the round robin and
// changes between iterations, and the model learns.
func TestStagedNoLoCoRandomRouting(t *testing.T) {
	cfg := smallStaged()
	cfg.StageOuter, cfg.RandomRouting = NoLoCo, true
	cfg.Steps = 6
	r, err := newStagedRun(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	rr := &stagedRun{cfg: cfg, pl: r.pl, rules: r.rules} // paths needs only these
	rr.cfg.RandomRouting = false
	differs := 0
	var prev []pipeline.Path
	for iter := uint64(1); iter <= 20; iter++ {
		random, err := r.paths(iter) // validated inside
		if err != nil {
			t.Fatal(err)
		}
		fixed, err := rr.paths(iter)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(random, fixed) {
			differs++
		}
		if prev != nil && !reflect.DeepEqual(random, prev) {
			differs++
		}
		prev = random
	}
	r.close()
	if differs < 10 {
		t.Fatalf("random routing matches the round robin or repeats itself (%d differences in 20 iterations)", differs)
	}
	res, err := RunStaged(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !(res.FinalValLoss < res.Curve[0].ValLoss-0.5) {
		t.Fatalf("validation loss %v -> %v: NoLoCo stages did not learn", res.Curve[0].ValLoss, res.FinalValLoss)
	}
}

func TestStagedSkipTrains(t *testing.T) {
	cfg := smallStaged()
	cfg.SkipRatio = 1.0 / 3
	res, err := RunStaged(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !(res.FinalValLoss < res.Curve[0].ValLoss) {
		t.Errorf("validation loss %v -> %v did not fall", res.Curve[0].ValLoss, res.FinalValLoss)
	}
}

// TestStagedCheckFreeRebuild wipes stage 2 of 4 on a trained run and
// checks that every replica now holds exactly pipeline.Rebuild of the real
// flat weights of stages 1 and 3, weighted by their replicas' last
// gradient norms, with a fresh optimizer; and that a random re-init holds
// neither neighbour's weights.
func TestStagedCheckFreeRebuild(t *testing.T) {
	cfg := smallStaged()
	cfg.Stages, cfg.Steps = 4, 4
	// No clipping: early norms exceed 1, and two neighbours clipped to the
	// same bound would weigh evenly, hiding a mixed-up weight.
	cfg.AdamW.Clip = 0
	r, err := newStagedRun(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	for step := range 2 { // ends a round: replicas agree
		if _, err := r.step(context.Background(), step); err != nil {
			t.Fatal(err)
		}
	}
	R := cfg.Replicas
	flat := func(s, k int) []float32 {
		n := r.nodes[s*R+k]
		x := make([]float32, n.Len())
		n.Params(x)
		return x
	}
	prev, next := flat(1, 0), flat(3, 0)
	if !slices.Equal(prev, flat(1, 1)) || !slices.Equal(next, flat(3, 1)) {
		t.Fatal("replicas disagree after a DiLoCo round")
	}
	meanNorm := func(s int) float64 {
		var sum float64
		for k := range R {
			sum += r.nodes[s*R+k].LastNorm()
		}
		return sum / float64(R)
	}
	np, nn := meanNorm(1), meanNorm(3)
	if !(np > 0) || !(nn > 0) || np == nn {
		t.Fatalf("gradient norms %v and %v: the test needs two distinct positive ones", np, nn)
	}
	want := make([]float32, len(prev))
	if err := pipeline.Rebuild(want, prev, next, np, nn); err != nil {
		t.Fatal(err)
	}
	if err := r.fail(StageFailure{Step: 2, Stage: 2, Recovery: CheckFree}, 2); err != nil {
		t.Fatal(err)
	}
	for k := range R {
		got := flat(2, k)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("replica %d: element %d is %v, Rebuild gives %v", k, i, got[i], want[i])
			}
		}
		node := r.nodes[2*R+k]
		if lr, born := node.Optimizer(); lr != pipeline.RebuildLRFactor || born != 2 {
			t.Errorf("replica %d: lr factor %v, born %d: not a fresh optimizer", k, lr, born)
		}
		m, v := node.Moments()
		if slices.ContainsFunc(append(m, v...), func(x float32) bool { return x != 0 }) {
			t.Errorf("replica %d: AdamW moments survived the rebuild", k)
		}
	}
	if slices.Equal(want, prev) || slices.Equal(want, next) {
		t.Fatal("the rebuild equals a neighbour: the weights did not mix")
	}
	// The run goes on from the rebuilt stage, across a DiLoCo round.
	for step := 2; step < 4; step++ {
		if _, err := r.step(context.Background(), step); err != nil {
			t.Fatalf("after the rebuild: %v", err)
		}
	}
	if err := r.fail(StageFailure{Step: 4, Stage: 2, Recovery: RandomInit}, 4); err != nil {
		t.Fatal(err)
	}
	got := flat(2, 0)
	if slices.Equal(got, flat(1, 0)) || slices.Equal(got, flat(3, 0)) || slices.Equal(got, want) {
		t.Fatal("random re-init copied existing weights")
	}
}

// TestStagedBench is the measurement of BENCHMARKS.md ("Staged training
// (in-process)"), minutes long: it runs only when SKEIN_STAGED_BENCH names
// the directory for its report, with SKEIN_STAGED_STEPS steps per arm
// (default 300) and SKEIN_STAGED_ARMS a comma-separated subset of arms.
func TestStagedBench(t *testing.T) {
	out := os.Getenv("SKEIN_STAGED_BENCH")
	if out == "" || testing.Short() {
		t.Skip("set SKEIN_STAGED_BENCH=<dir> to run the staged benchmark")
	}
	steps := 300
	if s := os.Getenv("SKEIN_STAGED_STEPS"); s != "" {
		var err error
		if steps, err = strconv.Atoi(s); err != nil {
			t.Fatalf("SKEIN_STAGED_STEPS: %v", err)
		}
	}
	base := DefaultStagedConfig()
	base.Steps, base.EvalEvery, base.EvalBatches = steps, 5, 8
	var arms []string
	if a := os.Getenv("SKEIN_STAGED_ARMS"); a != "" {
		arms = strings.Split(a, ",")
	}
	res, err := RunStagedBench(context.Background(), StagedBenchConfig{Base: base, FailStep: steps / 2 / base.InnerSteps * base.InnerSteps,
		Arms: arms, Out: out, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", StagedTable(res))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// CheckFree+ with 4 layers in 3 stages (1, 1 and 2 layers after stage 0's
// one): a lost stage 2 starts both its layers from stage 1's layer, and a
// lost stage 1 from the first of stage 2's layers, tensor by tensor.
func TestStagedCheckFreePlusCopiesLayers(t *testing.T) {
	cfg := smallStaged()
	cfg.CheckFreePlus = true
	r, err := newStagedRun(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	for step := range 2 {
		if _, err := r.step(context.Background(), step); err != nil {
			t.Fatal(err)
		}
	}
	R := cfg.Replicas
	const w = "attn.c_attn.weight"
	layer1, layer2 := r.nodes[1*R].Tensor("h.1."+w), r.nodes[2*R].Tensor("h.2."+w)
	if layer1 == nil || layer2 == nil || slices.Equal(layer1, layer2) {
		t.Fatal("the test needs two distinct trained layers h.1 and h.2")
	}
	if err := r.fail(StageFailure{Step: 2, Stage: 1, Recovery: CheckFree}, 2); err != nil {
		t.Fatal(err)
	}
	for k := range R {
		if got := r.nodes[R+k].Tensor("h.1." + w); !slices.Equal(got, layer2) {
			t.Fatalf("replica %d: stage 1 is not a copy of stage 2's first layer", k)
		}
	}
	// Stage 1 now holds h.2's weights; a lost stage 2 takes them twice.
	if err := r.fail(StageFailure{Step: 2, Stage: 2, Recovery: CheckFree}, 2); err != nil {
		t.Fatal(err)
	}
	for k := range R {
		for _, name := range []string{"h.2." + w, "h.3." + w} {
			if got := r.nodes[2*R+k].Tensor(name); !slices.Equal(got, layer2) {
				t.Fatalf("replica %d: %s is not a copy of stage 1's layer", k, name)
			}
		}
	}
}

// The benchmark's record encodes whatever the configuration holds (a
// NoLoCo configuration has callbacks JSON cannot encode).
func TestWriteStaged(t *testing.T) {
	cfg := StagedBenchConfig{Base: DefaultStagedConfig(), FailStep: 10, Out: t.TempDir()}
	cfg.Base.StageOuter = NoLoCo
	res := []StagedArmResult{{Arm: "a", Result: &StagedResult{Curve: []StagedPoint{{Step: 0, ValLoss: 5}, {Step: 10, ValLoss: 4}}, FinalValLoss: 4}}}
	if err := writeStaged(cfg, res); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(cfg.Out, "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Config StagedConfig `json:"config"`
		NoLoCo struct {
			GroupSize int `json:"group_size"`
		} `json:"noloco"`
	}
	if err := json.Unmarshal(b, &got); err != nil || got.Config.StageOuter != NoLoCo || got.NoLoCo.GroupSize != cfg.Base.NoLoCo.GroupSize {
		t.Fatalf("results.json %s: %v", b, err)
	}
}
