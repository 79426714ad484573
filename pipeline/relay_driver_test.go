package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/transport"
)

const testSeed = 11

// testBatch is every stage-0 node's data: microbatch mb of iteration iter.
func testBatch(vocab int) BatchSource {
	return func(iter uint64, mb int) ([]int32, []int32, error) {
		rng := rand.New(rand.NewPCG(iter, uint64(mb)))
		tok, tgt := make([]int32, testB*testT), make([]int32, testB*testT)
		for i := range tok {
			tok[i], tgt[i] = int32(rng.IntN(vocab)), int32(rng.IntN(vocab))
		}
		return tok, tgt, nil
	}
}

// swarm is a pipeline of real model stages (the tiny preset) over an
// in-memory network, one RelayDriver and ModelRunner per node.
type swarm struct {
	net     *transport.MemNetwork
	ids     []transport.PeerID
	runners []*ModelRunner
	drivers []*RelayDriver
	specs   []model.StageSpec
	model   model.Config
}

type swarmOptions struct {
	stages  int
	stageOf []int
	codec   compression.Codec
	mu      int
	hopWait int64                                                             // ticks of 2 ms
	wrap    func(net *transport.MemNetwork, v int, r StageRunner) StageRunner // optional: fault injection
	hostile []int                                                             // nodes whose relay poisons what it sends
	log     *slog.Logger                                                      // the drivers' (nil: discarded)
}

func newSwarm(t *testing.T, o swarmOptions) *swarm {
	t.Helper()
	c := tinyConfig(t)
	specs, err := SplitLayers(c, o.stages)
	if err != nil {
		t.Fatal(err)
	}
	s := &swarm{net: transport.NewMemNetwork(), specs: specs, model: c}
	for v := range o.stageOf {
		s.ids = append(s.ids, transport.PeerID(fmt.Sprintf("n%d", v)))
	}
	pl := Placement{Stages: o.stages, StageOf: o.stageOf}
	ctx, cancel := context.WithCancel(context.Background())
	for v, st := range o.stageOf {
		r, err := NewModelRunner(ModelRunnerConfig{Device: kernels.NewCPU(1), Model: c, Specs: specs, Stage: st,
			B: testB, T: testT, Seed: testSeed, Mu: o.mu, Batch: testBatch(c.Vocab)})
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultRelayConfig(pl, v, r.ActivationLen(), 0.002)
		cfg.Codec.Codec, cfg.Mu, cfg.HopWait = o.codec, o.mu, o.hopWait
		cfg.Hostile = slices.Contains(o.hostile, v)
		var runner StageRunner = r
		if o.wrap != nil {
			runner = o.wrap(s.net, v, r)
		}
		d, err := NewRelayDriver(s.net.Join(s.ids[v]), s.ids, runner, cfg, RelayOptions{Tick: 2 * time.Millisecond, Logger: o.log})
		if err != nil {
			t.Fatal(err)
		}
		d.Start(ctx)
		s.runners, s.drivers = append(s.runners, r), append(s.drivers, d)
	}
	t.Cleanup(func() {
		cancel()
		for _, d := range s.drivers {
			d.Close()
		}
		s.net.Close()
	})
	return s
}

// iterate runs one iteration on every node at once and returns each
// node's outcomes, failing the test on a hang or an error.
func (s *swarm) iterate(t *testing.T, iter uint64, paths []Path) [][]Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := make([][]Outcome, len(s.drivers))
	errs := make([]error, len(s.drivers))
	var wg sync.WaitGroup
	for v, d := range s.drivers {
		wg.Go(func() { out[v], errs[v] = d.Run(ctx, iter, paths) })
	}
	wg.Wait()
	for v, err := range errs {
		if err != nil {
			t.Fatalf("node %d: iteration %d: %v", v, iter, err)
		}
	}
	return out
}

// grad returns the swarm's gradient of a tensor from the one node that
// holds it.
func (s *swarm) grad(t *testing.T, name string) []float32 {
	t.Helper()
	var g []float32
	for v, r := range s.runners {
		if x := r.Grad(name); x != nil && slices.Contains(r.GradNames(), name) {
			if g != nil {
				t.Fatalf("%s on two nodes (%d)", name, v)
			}
			g = x
		}
	}
	if g == nil {
		t.Fatalf("%s on no node", name)
	}
	return g
}

type mbRef struct {
	iter uint64
	mb   int
}

// wholeModel runs the single-process model on the microbatches in order,
// accumulating the gradients, and returns the losses and the gradients.
func wholeModel(t *testing.T, c model.Config, mbs []mbRef) ([]float32, *model.Stage) {
	t.Helper()
	whole, err := model.NewStage(kernels.NewCPU(1), c, model.FullSpec(c), testB, testT, testSeed)
	if err != nil {
		t.Fatal(err)
	}
	batch := testBatch(c.Vocab)
	var losses []float32
	for _, m := range mbs {
		tok, tgt, _ := batch(m.iter, m.mb)
		l, err := whole.Forward(tok, nil, tgt)
		if err != nil {
			t.Fatal(err)
		}
		if err := whole.Backward(nil); err != nil {
			t.Fatal(err)
		}
		losses = append(losses, l)
	}
	return losses, whole
}

func host(s *model.Stage, name string) []float32 {
	b := s.GradView(name)
	h := make([]float32, b.Len())
	s.Device().CopyOut(h, b)
	return h
}

// compareGrads requires the swarm's gradient of every tensor of the whole
// model to equal the whole model's bit for bit, except those in loose,
// which must agree to float32 summation error.
func compareGrads(t *testing.T, s *swarm, whole *model.Stage, loose map[string]bool) {
	t.Helper()
	for _, ts := range whole.Tensors() {
		want, got := host(whole, ts.Name), s.grad(t, ts.Name)
		var scale float64
		for _, w := range want {
			scale = max(scale, math.Abs(float64(w)))
		}
		if scale == 0 {
			t.Fatalf("%s: the reference gradient is zero", ts.Name)
		}
		for i := range want {
			if loose[ts.Name] {
				if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*scale {
					t.Fatalf("%s[%d]: pipeline %v, whole model %v", ts.Name, i, got[i], want[i])
				}
			} else if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s[%d]: pipeline %v, whole model %v (bits differ)", ts.Name, i, got[i], want[i])
			}
		}
	}
}

func fullPath() Path { return Path{Nodes: []int{0, 1, 2}, Stages: []int{0, 1, 2}} }

// TestRelayMatchesWholeModel is the headline: the tiny model split into 3
// stages on 3 nodes, fp32 activations, skip ratio 0, over the in-memory
// network, gives bit for bit the single-process model's losses and
// parameter gradients (summed over the microbatches).
//
// One microbatch at a time (mu = 1, three iterations without zeroing the
// gradients), every gradient is bit-exact, the tied embedding's included.
// Three at once (mu = 3), the losses are bit-exact, and so is every
// gradient but the tied embedding's: on one chain every node runs its
// backwards in microbatch order, but how stage 0's head backwards
// interleave with its embedding backwards depends on timing, and float32
// addition does not commute over three terms; that one agrees to
// summation error.
func TestRelayMatchesWholeModel(t *testing.T) {
	t.Run("one at a time", func(t *testing.T) {
		s := newSwarm(t, swarmOptions{stages: 3, stageOf: []int{0, 1, 2}, codec: compression.FP32, mu: 1, hopWait: 2500})
		var mbs []mbRef
		var got []float32
		for iter := uint64(1); iter <= 3; iter++ {
			out := s.iterate(t, iter, []Path{fullPath()})
			if o := out[0][0]; o.Err != nil {
				t.Fatalf("iteration %d: %v", iter, o.Err)
			} else {
				got = append(got, o.Loss)
			}
			mbs = append(mbs, mbRef{iter, 0})
		}
		want, whole := wholeModel(t, s.model, mbs)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("microbatch %d: pipeline loss %v, whole model %v", i, got[i], want[i])
			}
		}
		compareGrads(t, s, whole, nil)
		t.Logf("losses %v", got)
	})
	t.Run("three at once", func(t *testing.T) {
		s := newSwarm(t, swarmOptions{stages: 3, stageOf: []int{0, 1, 2}, codec: compression.FP32, mu: 3, hopWait: 2500})
		out := s.iterate(t, 1, []Path{fullPath(), fullPath(), fullPath()})
		want, whole := wholeModel(t, s.model, []mbRef{{1, 0}, {1, 1}, {1, 2}})
		for mb, o := range out[0] {
			if o.Err != nil || math.Float32bits(o.Loss) != math.Float32bits(want[mb]) {
				t.Fatalf("microbatch %d: %+v, whole model's loss %v", mb, o, want[mb])
			}
		}
		for v := 1; v < 3; v++ {
			for _, o := range out[v] {
				if o.Err != nil {
					t.Fatalf("node %d: %+v", v, o)
				}
			}
		}
		compareGrads(t, s, whole, map[string]bool{"wte": true})
		var rec []int
		for _, r := range s.runners {
			rec = append(rec, r.Recomputes())
		}
		t.Logf("recomputed forwards per node: %v", rec)
	})
}

// chainReference runs microbatch (iter, mb) through fresh stages in the
// order of path's stages, in process: its loss and each visited stage's
// gradients.
func chainReference(t *testing.T, s *swarm, iter uint64, mb int, p Path) (float32, map[int]*model.Stage) {
	t.Helper()
	c := s.model
	stages := map[int]*model.Stage{}
	for _, st := range p.Stages {
		x, err := model.NewStage(kernels.NewCPU(1), c, s.specs[st], testB, testT, testSeed)
		if err != nil {
			t.Fatal(err)
		}
		stages[st] = x
	}
	head, err := model.NewStage(kernels.NewCPU(1), c, HeadSpec(c), testB, testT, testSeed)
	if err != nil {
		t.Fatal(err)
	}
	tok, tgt, _ := testBatch(c.Vocab)(iter, mb)
	n := testB * testT * c.C
	move := func(dst *model.Stage, src kernels.Buffer, from *model.Stage) kernels.Buffer {
		h := make([]float32, n)
		from.Device().CopyOut(h, src)
		b := dst.Device().Alloc(n)
		dst.Device().CopyIn(b, h)
		return b
	}
	if _, err := stages[0].Forward(tok, nil, nil); err != nil {
		t.Fatal(err)
	}
	prev := stages[0]
	for _, st := range p.Stages[1:] {
		if _, err := stages[st].Forward(nil, move(stages[st], prev.Output(), prev), nil); err != nil {
			t.Fatal(err)
		}
		prev = stages[st]
	}
	loss, err := head.Forward(nil, move(head, prev.Output(), prev), tgt)
	if err != nil {
		t.Fatal(err)
	}
	if err := head.Backward(nil); err != nil {
		t.Fatal(err)
	}
	next := head
	for k := len(p.Stages) - 1; k >= 1; k-- {
		st := stages[p.Stages[k]]
		if err := st.Backward(move(st, next.InputGrad(), next)); err != nil {
			t.Fatal(err)
		}
		next = st
	}
	return loss, stages
}

// TestRelaySkipsStages runs valid SkipPipe paths with skips and a swap
// (4 stages, paths of 3 visits) on real stages: every microbatch returns
// the loss of its own stages in its own order, bit for bit; a stage
// replica no path visits keeps a zero gradient; a stage visited by one
// microbatch holds exactly that microbatch's gradient.
func TestRelaySkipsStages(t *testing.T) {
	stageOf := []int{0, 1, 2, 3, 1}
	paths := []Path{
		{Nodes: []int{0, 1, 2}, Stages: []int{0, 1, 2}}, // skips 3
		{Nodes: []int{0, 2, 3}, Stages: []int{0, 2, 3}}, // skips 1
		{Nodes: []int{0, 3, 2}, Stages: []int{0, 3, 2}}, // skips 1, swaps 2 and 3
	}
	if err := Validate(paths, Placement{Stages: 4, StageOf: stageOf}, Rules{Stages: 4, Skip: 1, MaxJump: 3, MaxSwaps: 2, Mu: 3}); err != nil {
		t.Fatal(err)
	}
	s := newSwarm(t, swarmOptions{stages: 4, stageOf: stageOf, codec: compression.FP32, mu: 3, hopWait: 2500})
	out := s.iterate(t, 1, paths)
	for mb, o := range out[0] {
		want, _ := chainReference(t, s, 1, mb, paths[mb])
		if o.Err != nil || math.IsNaN(float64(o.Loss)) || math.IsInf(float64(o.Loss), 0) {
			t.Fatalf("microbatch %d: %+v", mb, o)
		}
		if math.Float32bits(o.Loss) != math.Float32bits(want) {
			t.Fatalf("microbatch %d on stages %v: loss %v, in-process chain %v", mb, paths[mb].Stages, o.Loss, want)
		}
	}
	if len(out[4]) != 0 || s.runners[4].Backwards() != 0 {
		t.Fatalf("node 4 (a stage-1 replica on no path) had %d visits, %d backwards", len(out[4]), s.runners[4].Backwards())
	}
	for _, name := range s.runners[4].GradNames() {
		for i, g := range s.runners[4].Grad(name) {
			if g != 0 {
				t.Fatalf("node 4: %s[%d] = %v, untouched stage's gradient must be 0", name, i, g)
			}
		}
	}
	for v, want := range map[int]int{1: 1, 2: 3, 3: 2} {
		if got := s.runners[v].Backwards(); got != want {
			t.Errorf("node %d ran %d backwards, want %d", v, got, want)
		}
	}
	// Stage 1 (node 1) saw microbatch 0 only: its gradient is exactly that
	// microbatch's.
	_, ref := chainReference(t, s, 1, 0, paths[0])
	for _, name := range s.runners[1].GradNames() {
		if !bitsEqual(s.runners[1].Grad(name), host(ref[1], name)) {
			t.Fatalf("stage 1's %s is not microbatch 0's gradient", name)
		}
	}
}

// killOnForward kills its node's endpoint when it is asked for a forward:
// the node dies holding an activation, mid-iteration.
type killOnForward struct {
	StageRunner
	net *transport.MemNetwork
	id  transport.PeerID
}

func (k killOnForward) Forward(iter uint64, mb int, in []float32) ([]float32, error) {
	k.net.Kill(k.id)
	return k.StageRunner.Forward(iter, mb, in)
}

// TestRelayHopKilled: node 3 (a stage-1 replica) dies mid-iteration while
// computing microbatch 1's forward. Microbatch 1 fails by its deadline,
// reported as ErrTimeout, on every node (none hangs); microbatches 0 and 2,
// on other nodes, finish with their exact losses.
func TestRelayHopKilled(t *testing.T) {
	const hopWait = 150 // ticks of 2 ms
	s := newSwarm(t, swarmOptions{stages: 3, stageOf: []int{0, 1, 2, 1, 2}, codec: compression.FP32, mu: 3, hopWait: hopWait,
		wrap: func(net *transport.MemNetwork, v int, r StageRunner) StageRunner {
			if v != 3 {
				return r
			}
			return killOnForward{StageRunner: r, net: net, id: "n3"}
		}})
	paths := []Path{
		{Nodes: []int{0, 1, 2}, Stages: []int{0, 1, 2}},
		{Nodes: []int{0, 3, 4}, Stages: []int{0, 1, 2}},
		{Nodes: []int{0, 1, 2}, Stages: []int{0, 1, 2}},
	}
	start := time.Now()
	out := s.iterate(t, 1, paths)
	took := time.Since(start)
	for _, mb := range []int{0, 2} {
		want, _ := chainReference(t, s, 1, mb, paths[mb])
		if o := out[0][mb]; o.Err != nil || math.Float32bits(o.Loss) != math.Float32bits(want) {
			t.Fatalf("microbatch %d: %+v, want loss %v", mb, o, want)
		}
	}
	if o := out[0][1]; !errors.Is(o.Err, ErrTimeout) {
		t.Fatalf("microbatch 1: %+v, want ErrTimeout", o)
	}
	for _, v := range []int{3, 4} {
		if len(out[v]) != 1 || out[v][0].Err == nil {
			t.Fatalf("node %d: %+v, want its visit failed", v, out[v])
		}
	}
	// The forward's budget is 3 hops after stage 0 sends; a hang would
	// reach the 60 s limit of iterate. Ticks are coalesced on a loaded
	// machine, so the wall-clock bound is loose.
	t.Logf("iteration took %v (forward budget %v of nominal ticks); node 4: %v", took, 3*hopWait*2*time.Millisecond, out[4][0].Err)
}

// TestRelayBF16 runs the three-at-once pipeline with bf16 activations and
// gradients (the default): the losses stay within 0.1% of the exact ones,
// and the activations cost half the bytes of fp32.
func TestRelayBF16(t *testing.T) {
	paths := []Path{fullPath(), fullPath(), fullPath()}
	want, _ := wholeModel(t, tinyConfig(t), []mbRef{{1, 0}, {1, 1}, {1, 2}})
	bytes := map[compression.Codec]int64{}
	for _, codec := range []compression.Codec{compression.FP32, compression.BF16} {
		s := newSwarm(t, swarmOptions{stages: 3, stageOf: []int{0, 1, 2}, codec: codec, mu: 3, hopWait: 2500})
		out := s.iterate(t, 1, paths)
		for mb, o := range out[0] {
			if o.Err != nil {
				t.Fatalf("%s: microbatch %d: %v", codec, mb, o.Err)
			}
			rel := math.Abs(float64(o.Loss-want[mb])) / float64(want[mb])
			if rel > 1e-3 {
				t.Fatalf("%s: microbatch %d: loss %v, exact %v (relative %.2e)", codec, mb, o.Loss, want[mb], rel)
			}
			t.Logf("%s: microbatch %d: loss %v, exact %v (relative %.2e)", codec, mb, o.Loss, want[mb], rel)
		}
		for _, id := range s.ids {
			bytes[codec] += s.net.BytesSent(id)
		}
	}
	if r := float64(bytes[compression.BF16]) / float64(bytes[compression.FP32]); r > 0.55 {
		t.Fatalf("bf16 sent %.2f of fp32's bytes", r)
	}
}

// TestRelayDriverRun: a schedule the node cannot run is an error of Run,
// not a hang, and the driver keeps serving.
func TestRelayDriverRun(t *testing.T) {
	s := newSwarm(t, swarmOptions{stages: 3, stageOf: []int{0, 1, 2}, codec: compression.FP32, mu: 1, hopWait: 2500})
	bad := []Path{fullPath(), fullPath()} // two microbatches per node, mu = 1
	if _, err := s.drivers[0].Run(context.Background(), 1, bad); !errors.Is(err, ErrNodeMemory) {
		t.Fatalf("over mu: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.drivers[1].Run(ctx, 1, []Path{fullPath()}); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled: %v", err)
	}
	out := s.iterate(t, 2, []Path{fullPath()})
	if o := out[0][0]; o.Err != nil {
		t.Fatal(o.Err)
	}
}

// A re-plan between two iterations: node 1 leaves, node 3 takes its stage.
// Node 0 switches first and starts the next iteration at once; its first
// activation reaches node 3 while node 3 still runs the old placement,
// which keeps it for the iteration it has not begun; Switch hands it to the
// new machine, so the microbatch goes through without waiting out a hop's
// deadline.
func TestRelayDriverSwitch(t *testing.T) {
	s := newSwarm(t, swarmOptions{stages: 3, stageOf: []int{0, 1, 2, 1}, codec: compression.FP32, mu: 1, hopWait: 500})
	out := s.iterate(t, 1, []Path{fullPath()})
	if o := out[0][0]; o.Err != nil {
		t.Fatal(o.Err)
	}
	nodes := []transport.PeerID{s.ids[0], s.ids[3], s.ids[2]}
	pl := Placement{Stages: 3, StageOf: []int{0, 1, 2}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switchTo := func(v, self int) {
		t.Helper()
		cfg := DefaultRelayConfig(pl, self, s.runners[v].ActivationLen(), 0.002)
		cfg.Codec.Codec, cfg.Mu, cfg.HopWait = compression.FP32, 1, 500
		if err := s.drivers[v].Switch(ctx, nodes, s.runners[v], cfg); err != nil {
			t.Fatalf("node %d: %v", v, err)
		}
	}
	bad := DefaultRelayConfig(pl, 0, s.runners[1].ActivationLen(), 0.002)
	if err := s.drivers[1].Switch(ctx, nodes, s.runners[1], bad); !errors.Is(err, ErrConfig) {
		t.Fatalf("a node not in the new placement switched: %v", err)
	}
	paths := []Path{fullPath()}
	switchTo(0, 0)
	began := time.Now()
	first := make(chan []Outcome, 1)
	go func() {
		o, err := s.drivers[0].Run(ctx, 2, paths)
		if err != nil {
			t.Error(err)
		}
		first <- o
	}()
	time.Sleep(500 * time.Millisecond) // node 0's forward is done and sent
	switchTo(3, 1)
	switchTo(2, 2)
	var wg sync.WaitGroup
	for _, v := range []int{3, 2} {
		wg.Go(func() {
			if _, err := s.drivers[v].Run(ctx, 2, paths); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	o := <-first
	if len(o) != 1 || o[0].Err != nil {
		t.Fatalf("outcomes %+v", o)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Fatalf("the iteration took %v: node 3 lost node 0's activation and it was resent or timed out", d)
	}
}
