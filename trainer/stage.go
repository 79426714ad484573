package trainer

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/pipeline"
)

// StageReplica is one node of a staged run: one replica of one stage, its
// pipeline.ModelRunner, and what the run keeps beside it (the flat view of
// its trainable tensors, its optimizer's clock, its last gradient norm).
// The in-process staged runs (experiment) and a volunteer of a staged run
// (node) drive it the same way: Recorder is the pipeline.StageRunner the
// relay calls during an iteration, Step applies the iteration's AdamW
// update, and Params/SetParams are the flat vector the stage's outer
// optimizer and CheckFree work on.
//
// Trainable tensors. A stage replica trains its body's tensors and, at stage
// 0, the head's final layernorm; the head's copy of the tied token
// embedding is not trained but copied from the body's after every change
// (ModelRunner.SyncTied). The flat vector of a replica (for DiLoCo,
// CheckFree and the evaluation) is those tensors in that order.
type StageReplica struct {
	stage, replica int
	dev            kernels.Device
	runner         *pipeline.ModelRunner
	rec            *gradRecorder
	views          []trainView
	n              int // elements of the flat vector

	// The optimizer. lrFactor scales the schedule's learning rate and born
	// is the step the AdamW moments started at: a stage rebuilt after a
	// failure starts a fresh optimizer (bias correction from 1) at
	// RebuildLRFactor times the rate (ALGORITHMS.md 4).
	lrFactor float64
	born     int
	// lastNorm is the norm of the last applied gradient, after averaging
	// over the microbatches and clipping: CheckFree's neighbour weight.
	lastNorm float64
	grad     []float32 // scratch: the iteration's gradient
}

// trainView is one trainable tensor of a replica: parameter, gradient and
// moment views of the stage that holds it.
type trainView struct {
	name       string
	off, size  int // in the flat vector
	decay      bool
	p, g, m, v kernels.Buffer
}

func viewsOf(s *model.Stage, keep func(name string) bool, off int) []trainView {
	var out []trainView
	for _, t := range s.Tensors() {
		if !keep(t.Name) {
			continue
		}
		n := t.Size()
		out = append(out, trainView{name: t.Name, off: off, size: n, decay: t.Decay,
			p: s.Params.Slice(t.Offset, n), g: s.Grads.Slice(t.Offset, n), m: s.M.Slice(t.Offset, n), v: s.V.Slice(t.Offset, n)})
		off += n
	}
	return out
}

// NewStageReplica wraps runner, the ModelRunner of replica `replica` of
// stage `stage` on dev.
func NewStageReplica(stage, replica int, dev kernels.Device, runner *pipeline.ModelRunner) *StageReplica {
	r := &StageReplica{stage: stage, replica: replica, dev: dev, runner: runner, lrFactor: 1}
	r.views = viewsOf(runner.Body(), func(string) bool { return true }, 0)
	if h := runner.HeadStage(); h != nil {
		r.views = append(r.views, viewsOf(h, func(name string) bool { return name != "wte" }, r.size())...)
	}
	r.n = r.size()
	r.grad = make([]float32, r.n)
	r.rec = &gradRecorder{r: r, contrib: map[int]*mbGrad{}}
	return r
}

// Len is the length of the replica's flat vector.
func (r *StageReplica) Len() int { return r.n }

// Stage is the stage this replica holds.
func (r *StageReplica) Stage() int { return r.stage }

// Replica is the replica's index within its stage.
func (r *StageReplica) Replica() int { return r.replica }

// Runner is the replica's ModelRunner.
func (r *StageReplica) Runner() *pipeline.ModelRunner { return r.runner }

// Recorder is the pipeline.StageRunner to give the relay: it passes every
// call to the ModelRunner and keeps each microbatch's gradient for Step.
func (r *StageReplica) Recorder() pipeline.StageRunner { return r.rec }

// LastNorm is the norm of the last applied gradient (after averaging over
// the microbatches and clipping): CheckFree's weight of this replica.
func (r *StageReplica) LastNorm() float64 { return r.lastNorm }

// Optimizer says how the AdamW optimizer stands: the factor on the
// schedule's learning rate and the step its moments started at.
func (r *StageReplica) Optimizer() (lrFactor float64, born int) { return r.lrFactor, r.born }

// Moments returns host copies of the AdamW moments, in the flat layout.
func (r *StageReplica) Moments() (m, v []float32) {
	m, v = make([]float32, r.n), make([]float32, r.n)
	for _, t := range r.views {
		r.dev.CopyOut(m[t.off:t.off+t.size], t.m)
		r.dev.CopyOut(v[t.off:t.off+t.size], t.v)
	}
	return m, v
}

// TaskTimes returns the total compute time and calls of a task kind
// (TaskForward, TaskLoss, TaskBackward).
func (r *StageReplica) TaskTimes(kind int) (time.Duration, int) { return r.rec.taskTimes(kind) }

// SetTrace makes trace receive the span of every compute task (set it
// before the relay starts).
func (r *StageReplica) SetTrace(trace func(iter uint64, mb int, span TaskSpan)) {
	r.rec.mu.Lock()
	r.rec.trace = trace
	r.rec.mu.Unlock()
}

func (r *StageReplica) size() int {
	if len(r.views) == 0 {
		return 0
	}
	v := r.views[len(r.views)-1]
	return v.off + v.size
}

// Params copies the replica's trainable parameters into dst (length n).
func (r *StageReplica) Params(dst []float32) {
	for _, v := range r.views {
		r.dev.CopyOut(dst[v.off:v.off+v.size], v.p)
	}
}

// SetParams installs src as the replica's parameters and re-ties the head.
func (r *StageReplica) SetParams(src []float32) {
	for _, v := range r.views {
		r.dev.CopyIn(v.p, src[v.off:v.off+v.size])
	}
	r.runner.SyncTied()
}

// Tensor returns a host copy of the named trainable tensor, or nil.
func (r *StageReplica) Tensor(name string) []float32 {
	for _, v := range r.views {
		if v.name == name {
			h := make([]float32, v.size)
			r.dev.CopyOut(h, v.p)
			return h
		}
	}
	return nil
}

// FreshOptimizer clears the AdamW moments; the next step is the first of a
// new optimizer at lrFactor times the learning rate.
func (r *StageReplica) FreshOptimizer(step int, lrFactor float64) {
	for _, v := range r.views {
		r.dev.Zero(v.m)
		r.dev.Zero(v.v)
	}
	r.born, r.lrFactor, r.lastNorm = step, lrFactor, 0
}

// Step applies one clipped AdamW update for 0-based step with the
// gradient the recorder gathered this iteration, averaged over the
// microbatches whose backward ran here. It reports whether there was any.
//
// optimizer.AdamW.Step is not used because it clips each model.Stage on
// its own and ties the bias correction to the schedule's step: a stage-0
// replica is two model.Stages (body and head) clipped by one norm, and a
// rebuilt stage's fresh optimizer restarts the bias correction but not
// the schedule. The update itself is the same device kernel.
func (r *StageReplica) Step(cfg optimizer.AdamWConfig, step int) (bool, error) {
	count := r.rec.sum(r.grad)
	if count == 0 {
		return false, nil
	}
	var ss float64
	for _, g := range r.grad {
		ss += float64(g) * float64(g)
	}
	norm := math.Sqrt(ss) / float64(count) // of the mean gradient
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return false, fmt.Errorf("trainer: stage %d replica %d: gradient norm %v at step %d", r.stage, r.replica, norm, step)
	}
	scale := 1 / float64(count)
	r.lastNorm = norm
	if cfg.Clip > 0 && norm > cfg.Clip {
		scale *= cfg.Clip / norm
		r.lastNorm = cfg.Clip
	}
	s := float32(scale)
	for i := range r.grad {
		r.grad[i] *= s
	}
	lr := float32(cfg.LRAt(step) * r.lrFactor)
	t := step - r.born + 1
	for _, v := range r.views {
		r.dev.CopyIn(v.g, r.grad[v.off:v.off+v.size])
		wd := float32(0)
		if v.decay {
			wd = float32(cfg.WeightDecay)
		}
		r.dev.AdamW(v.p, v.g, v.m, v.v, lr, float32(cfg.Beta1), float32(cfg.Beta2), float32(cfg.Eps), wd, t)
	}
	r.runner.SyncTied()
	return true, nil
}

// gradRecorder is the StageRunner the relay drives: it passes every call
// to the replica's ModelRunner but keeps each microbatch's gradient apart,
// so that the iteration's gradient is summed in microbatch order whatever
// order the network delivered them in.
//
// Why: a ModelRunner accumulates gradients in the order its backwards run,
// and with several stage-0 replicas feeding one node that order depends on
// goroutine timing; float32 addition does not commute over three terms, so
// two runs with one seed would drift apart by rounding. Zeroing the
// runner's gradients before each head or backward and reading them after
// gives that call's contribution exactly (0 + x = x); sum adds them in a
// fixed order (microbatch ascending, head before body, as the whole model
// adds them), which makes a staged run bit-reproducible.
type gradRecorder struct {
	r       *StageReplica
	mu      sync.Mutex
	contrib map[int]*mbGrad // by microbatch, this iteration
	scratch []float32
	// busy and calls time the node's compute by task kind (forward, head
	// and loss, backward), for the simulator's prediction of the run.
	busy  [3]time.Duration
	calls [3]int
	// trace, if set, receives every task's span (the handoffs between
	// nodes are measured from them).
	trace func(iter uint64, mb int, span TaskSpan)
}

// TaskSpan is when one compute task of a microbatch ran, and on which node.
type TaskSpan struct {
	Node         int // set by whoever traces several replicas
	Began, Ended time.Time
}

// The task kinds the recorder times.
const (
	TaskForward = iota
	TaskLoss
	TaskBackward
)

func (g *gradRecorder) timed(iter uint64, mb, kind int, began time.Time) {
	ended := time.Now()
	g.mu.Lock()
	g.busy[kind] += ended.Sub(began)
	g.calls[kind]++
	trace := g.trace
	g.mu.Unlock()
	if trace != nil {
		trace(iter, mb, TaskSpan{Began: began, Ended: ended})
	}
}

// taskTimes returns the total compute time and calls of kind.
func (g *gradRecorder) taskTimes(kind int) (time.Duration, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.busy[kind], g.calls[kind]
}

type mbGrad struct {
	head, body []float32 // the head's and the body's backward, in flat layout
	backward   bool      // the body's backward ran: the microbatch counts
}

var _ pipeline.StageRunner = (*gradRecorder)(nil)

// Forward implements pipeline.StageRunner.
func (g *gradRecorder) Forward(iter uint64, mb int, in []float32) ([]float32, error) {
	defer g.timed(iter, mb, TaskForward, time.Now())
	return g.r.runner.Forward(iter, mb, in)
}

// Head implements pipeline.StageRunner.
func (g *gradRecorder) Head(iter uint64, mb int, in []float32) (float32, []float32, error) {
	defer g.timed(iter, mb, TaskLoss, time.Now())
	g.r.runner.ZeroGrad()
	loss, din, err := g.r.runner.Head(iter, mb, in)
	if err != nil {
		return loss, din, err
	}
	g.record(mb, false)
	return loss, din, nil
}

// Backward implements pipeline.StageRunner.
func (g *gradRecorder) Backward(iter uint64, mb int, dout []float32) ([]float32, error) {
	defer g.timed(iter, mb, TaskBackward, time.Now())
	g.r.runner.ZeroGrad()
	din, err := g.r.runner.Backward(iter, mb, dout)
	if err != nil {
		return din, err
	}
	g.record(mb, true)
	return din, nil
}

// Drop implements pipeline.StageRunner.
func (g *gradRecorder) Drop(iter uint64, mb int) {
	g.r.runner.Drop(iter, mb)
	g.mu.Lock()
	delete(g.contrib, mb)
	g.mu.Unlock()
}

// record reads the gradient the last call left in the runner (its
// gradients were zero before it) into microbatch mb's slot. At stage 0 the
// tied embedding's gradient is in the body's or the head's buffer
// depending on the call; the other holds zero, so their sum is exact.
func (g *gradRecorder) record(mb int, body bool) {
	r := g.r
	out := make([]float32, r.n)
	for _, v := range r.views {
		seg := out[v.off : v.off+v.size]
		r.dev.CopyOut(seg, v.g)
		if v.name != "wte" || r.runner.HeadStage() == nil {
			continue
		}
		hb := r.runner.HeadStage().GradView("wte")
		g.scratch = slices.Grow(g.scratch[:0], v.size)[:v.size]
		r.dev.CopyOut(g.scratch, hb)
		for i, x := range g.scratch {
			seg[i] += x
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.contrib[mb]
	if c == nil {
		c = &mbGrad{}
		g.contrib[mb] = c
	}
	if body {
		c.body, c.backward = out, true
	} else {
		c.head = out
	}
}

// sum writes the iteration's gradient into dst in the fixed order, clears
// the record, and returns the number of microbatches whose backward ran.
func (g *gradRecorder) sum(dst []float32) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(dst)
	mbs := make([]int, 0, len(g.contrib))
	for mb := range g.contrib {
		mbs = append(mbs, mb)
	}
	slices.Sort(mbs)
	count := 0
	for _, mb := range mbs {
		c := g.contrib[mb]
		if !c.backward {
			continue // its head ran but not its embedding's backward: not a whole microbatch
		}
		for _, part := range [][]float32{c.head, c.body} {
			for i, x := range part {
				dst[i] += x
			}
		}
		count++
	}
	clear(g.contrib)
	return count
}

// CopyLayers is CheckFree+'s copy of a lost stage from its swap partner's
// flat weights src: layer j of the lost stage's L layers takes the
// partner's layer j*P/L of its P (one for one when the two hold equally
// many; an uneven split, such as 4 layers in 3 stages, gives one stage
// two layers that both start from the partner's one, or one layer that
// starts from the first of the partner's two, the one the swap ran in its
// place).
func CopyLayers(lost *StageReplica, lostSpec model.StageSpec, partner *StageReplica, partnerSpec model.StageSpec, src []float32) ([]float32, error) {
	if len(src) != partner.n {
		return nil, fmt.Errorf("trainer: %d partner weights, want %d", len(src), partner.n)
	}
	L, P := lostSpec.LastLayer-lostSpec.FirstLayer, partnerSpec.LastLayer-partnerSpec.FirstLayer
	byName := make(map[string]trainView, len(partner.views))
	for _, v := range partner.views {
		byName[v.name] = v
	}
	dst := make([]float32, lost.n)
	for _, v := range lost.views {
		var l int
		var rest string
		if n, err := fmt.Sscanf(v.name, "h.%d.%s", &l, &rest); n != 2 || err != nil || P == 0 {
			return nil, fmt.Errorf("%w: CheckFree+ copies transformer layers; stage tensor %s has no counterpart", ErrConfig, v.name)
		}
		from := fmt.Sprintf("h.%d.%s", partnerSpec.FirstLayer+(l-lostSpec.FirstLayer)*P/L, rest)
		pv, ok := byName[from]
		if !ok || pv.size != v.size {
			return nil, fmt.Errorf("%w: CheckFree+: tensor %s has no counterpart %s in the partner stage", ErrConfig, v.name, from)
		}
		copy(dst[v.off:v.off+v.size], src[pv.off:pv.off+pv.size])
	}
	return dst, nil
}

// FreshWeights draws the stage's trainable tensors afresh with seed, in
// the flat layout: what a replacement with no checkpoint and no neighbours
// to rebuild from would start from.
func (r *StageReplica) FreshWeights(mc model.Config, spec model.StageSpec, seed uint64) ([]float32, error) {
	st, err := model.NewStage(r.dev, mc, spec, 1, 1, seed)
	if err != nil {
		return nil, err
	}
	dst := make([]float32, r.n)
	for _, v := range r.views {
		r.dev.CopyOut(dst[v.off:v.off+v.size], st.ParamView(v.name))
	}
	return dst, nil
}
