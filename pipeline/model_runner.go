package pipeline

import (
	"fmt"

	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/model"
)

// SplitLayers cuts c's layers into stages contiguous ranges, in order:
// stage 0 holds the embedding and the fewest layers (it also runs the head
// and the loss, HeadSpec), the remainder of an uneven split going to the
// last stages. Every stage after 0 gets at least one layer.
func SplitLayers(c model.Config, stages int) ([]model.StageSpec, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if stages < 1 || stages > maxPathLen || stages-1 > c.Layers {
		return nil, fmt.Errorf("%w: %d stages for %d layers (every stage after 0 needs a layer)", ErrConfig, stages, c.Layers)
	}
	base, extra := c.Layers/stages, c.Layers%stages
	specs := make([]model.StageSpec, stages)
	first := 0
	for s := range stages {
		n := base
		if s >= stages-extra {
			n++
		}
		specs[s] = model.StageSpec{FirstLayer: first, LastLayer: first + n, Embedding: s == 0}
		first += n
	}
	return specs, nil
}

// HeadSpec is stage 0's head: the final layernorm, the output projection
// (tied to the token embedding) and the loss, on no layers.
func HeadSpec(c model.Config) model.StageSpec {
	return model.StageSpec{FirstLayer: c.Layers, LastLayer: c.Layers, Head: true}
}

// BatchSource returns the tokens and targets (B*T each) of microbatch mb
// of iteration iter; stage 0's runner asks for them.
type BatchSource func(iter uint64, mb int) (tokens, targets []int32, err error)

// ModelRunnerConfig configures a ModelRunner.
type ModelRunnerConfig struct {
	Device kernels.Device
	Model  model.Config
	// Specs is every stage's slice of the model (SplitLayers); the runner
	// builds Specs[Stage], plus HeadSpec at stage 0.
	Specs []model.StageSpec
	Stage int
	B, T  int
	// Seed initializes the parameters: the same seed gives every stage of
	// every split the whole model's initial tensors (model.NewStage).
	Seed uint64
	// Mu is the most microbatches the runner keeps for their backward.
	Mu int
	// Batch gives stage 0 its microbatches (required there, unused elsewhere).
	Batch BatchSource
}

// Validate names the first invalid field.
func (c ModelRunnerConfig) Validate() error {
	switch {
	case c.Device == nil:
		return fmt.Errorf("%w: no device", ErrConfig)
	case c.Stage < 0 || c.Stage >= len(c.Specs):
		return fmt.Errorf("%w: stage %d of %d", ErrConfig, c.Stage, len(c.Specs))
	case c.Specs[c.Stage].Embedding != (c.Stage == 0) || c.Specs[c.Stage].Head:
		return fmt.Errorf("%w: stage %d's spec %+v: only stage 0 embeds, and the head is HeadSpec", ErrConfig, c.Stage, c.Specs[c.Stage])
	case c.Mu < 1 || c.Mu > 1<<16:
		return fmt.Errorf("%w: mu %d outside [1, 65536]", ErrConfig, c.Mu)
	case c.Stage == 0 && c.Batch == nil:
		return fmt.Errorf("%w: stage 0 needs its batches", ErrConfig)
	}
	return nil
}

// ModelRunner is the StageRunner of one node over model.Stage: stage
// Stage's layers and, at stage 0, the embedding and a separate head stage.
//
// Memory. A model.Stage keeps the activations of one batch, but a node has
// up to mu microbatches between their forward and their backward. The
// runner keeps only each one's input (an activation of B*T*C floats; at
// stage 0 its tokens) and recomputes the forward before a backward whose
// activations the stage no longer holds. The recomputation is
// deterministic, so the gradients are those of the first forward, bit for
// bit; on a path without overlap (mu = 1) it never happens.
//
// The tied embedding. The head's output projection is the token embedding
// (wte), but lives in the head stage's own copy. Its gradient is kept as
// one running total that moves between the two copies' gradient buffers
// (to the head before its backward, back before the embedding's), so the
// contributions add in the order the whole model adds them: on a path
// without overlap the sum is bit for bit the whole model's. Each move
// copies the V*C gradient through the host, against the head's 2*N*V*C
// flops of backward: negligible on a CPU.
//
// Gradients accumulate over the microbatches until ZeroGrad, in the order
// their backward runs here. A microbatch that fails after some stages ran
// their backward leaves its gradient in those stages: it is still exactly
// the gradient of its loss with respect to their parameters, as when a
// path skips a stage; Backwards says how many microbatches each node's
// gradient sums.
//
// A ModelRunner is not safe for concurrent use (the relay never overlaps
// its calls).
type ModelRunner struct {
	cfg  ModelRunnerConfig
	dev  kernels.Device
	body *model.Stage
	head *model.Stage // stage 0 only
	n    int          // B*T*C

	stash   map[runKey]*runStash
	free    []kernels.Buffer // input buffers not in use (stages after 0)
	dout    kernels.Buffer
	headIn  kernels.Buffer
	last    runKey // the microbatch whose activations body holds
	hasLast bool

	tiedInHead bool      // the running wte gradient is in the head's buffer
	tiedHost   []float32 // scratch for moving it
	backwards  int
	recomputes int
}

type runKey struct {
	iter uint64
	mb   int
}

type runStash struct {
	buf             kernels.Buffer // the input (stages after 0)
	tokens, targets []int32        // stage 0
}

// NewModelRunner builds the stage (and the head at stage 0) on cfg.Device.
func NewModelRunner(cfg ModelRunnerConfig) (*ModelRunner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	body, err := model.NewStage(cfg.Device, cfg.Model, cfg.Specs[cfg.Stage], cfg.B, cfg.T, cfg.Seed)
	if err != nil {
		return nil, err
	}
	n := cfg.B * cfg.T * cfg.Model.C
	r := &ModelRunner{cfg: cfg, dev: cfg.Device, body: body, n: n, stash: map[runKey]*runStash{}, dout: cfg.Device.Alloc(n)}
	if cfg.Stage == 0 {
		if r.head, err = model.NewStage(cfg.Device, cfg.Model, HeadSpec(cfg.Model), cfg.B, cfg.T, cfg.Seed); err != nil {
			return nil, err
		}
		r.headIn = cfg.Device.Alloc(n)
		r.tiedHost = make([]float32, r.body.GradView("wte").Len())
	}
	return r, nil
}

// ActivationLen is the length of the activations the runner exchanges:
// RelayConfig.Len.
func (r *ModelRunner) ActivationLen() int { return r.n }

// Body is the stage's slice of the model; HeadStage is stage 0's head (nil
// elsewhere).
func (r *ModelRunner) Body() *model.Stage { return r.body }

// HeadStage is stage 0's head stage, or nil.
func (r *ModelRunner) HeadStage() *model.Stage { return r.head }

// Backwards is the number of microbatches whose backward ran since ZeroGrad.
func (r *ModelRunner) Backwards() int { return r.backwards }

// Recomputes is the number of forwards run again for a backward.
func (r *ModelRunner) Recomputes() int { return r.recomputes }

// ZeroGrad clears the gradients and the count of backwards.
func (r *ModelRunner) ZeroGrad() {
	r.body.ZeroGrad()
	if r.head != nil {
		r.head.ZeroGrad()
	}
	r.tiedInHead, r.backwards = false, 0
}

// GradNames lists the tensors this node has gradients for: the body's,
// and at stage 0 the head's final layernorm (its wte is the body's).
func (r *ModelRunner) GradNames() []string {
	var out []string
	for _, t := range r.body.Tensors() {
		out = append(out, t.Name)
	}
	if r.head != nil {
		for _, t := range r.head.Tensors() {
			if t.Name != "wte" {
				out = append(out, t.Name)
			}
		}
	}
	return out
}

// Grad returns a host copy of the node's gradient of tensor name (at stage
// 0, wte's is the running total of both uses), or nil.
func (r *ModelRunner) Grad(name string) []float32 {
	b := r.body.GradView(name)
	if r.head != nil && (b == nil || (name == "wte" && r.tiedInHead)) {
		b = r.head.GradView(name)
	}
	if b == nil {
		return nil
	}
	h := make([]float32, b.Len())
	r.dev.CopyOut(h, b)
	return h
}

// SyncTied copies stage 0's token embedding into the head's copy; call it
// after every change of the parameters (an optimizer step, a load).
func (r *ModelRunner) SyncTied() {
	if r.head == nil {
		return
	}
	r.dev.CopyOut(r.tiedHost, r.body.ParamView("wte"))
	r.dev.CopyIn(r.head.ParamView("wte"), r.tiedHost)
}

// moveTied puts the running wte gradient into the head's buffer (toHead)
// or the body's.
func (r *ModelRunner) moveTied(toHead bool) {
	if r.tiedInHead == toHead {
		return
	}
	src, dst := r.body.GradView("wte"), r.head.GradView("wte")
	if !toHead {
		src, dst = dst, src
	}
	r.dev.CopyOut(r.tiedHost, src)
	r.dev.CopyIn(dst, r.tiedHost)
	r.tiedInHead = toHead
}

func (r *ModelRunner) output(b kernels.Buffer) []float32 {
	out := make([]float32, r.n)
	r.dev.CopyOut(out, b)
	return out
}

// Forward implements StageRunner.
func (r *ModelRunner) Forward(iter uint64, mb int, in []float32) ([]float32, error) {
	k := runKey{iter, mb}
	if r.stash[k] != nil {
		return nil, fmt.Errorf("pipeline: stage %d: microbatch %d of iteration %d forwarded twice", r.cfg.Stage, mb, iter)
	}
	if len(r.stash) >= r.cfg.Mu {
		return nil, fmt.Errorf("%w: stage %d keeps %d microbatches, mu = %d", ErrNodeMemory, r.cfg.Stage, len(r.stash), r.cfg.Mu)
	}
	st := &runStash{}
	if r.cfg.Stage == 0 {
		tokens, targets, err := r.cfg.Batch(iter, mb)
		if err != nil {
			return nil, fmt.Errorf("pipeline: microbatch %d of iteration %d: %w", mb, iter, err)
		}
		st.tokens, st.targets = tokens, targets
	} else {
		if len(in) != r.n {
			return nil, fmt.Errorf("pipeline: stage %d: input of %d elements, want %d", r.cfg.Stage, len(in), r.n)
		}
		st.buf = r.takeBuf()
		r.dev.CopyIn(st.buf, in)
	}
	r.hasLast = false
	if err := r.forward(st); err != nil {
		r.release(st)
		return nil, err
	}
	r.stash[k], r.last, r.hasLast = st, k, true
	return r.output(r.body.Output()), nil
}

func (r *ModelRunner) forward(st *runStash) error {
	if r.cfg.Stage == 0 {
		_, err := r.body.Forward(st.tokens, nil, nil)
		return err
	}
	_, err := r.body.Forward(nil, st.buf, nil)
	return err
}

// Head implements StageRunner.
func (r *ModelRunner) Head(iter uint64, mb int, in []float32) (float32, []float32, error) {
	st := r.stash[runKey{iter, mb}]
	switch {
	case r.head == nil:
		return 0, nil, fmt.Errorf("pipeline: stage %d has no head", r.cfg.Stage)
	case st == nil:
		return 0, nil, fmt.Errorf("pipeline: head of microbatch %d of iteration %d before its forward", mb, iter)
	case len(in) != r.n:
		return 0, nil, fmt.Errorf("pipeline: head input of %d elements, want %d", len(in), r.n)
	}
	r.dev.CopyIn(r.headIn, in)
	loss, err := r.head.Forward(nil, r.headIn, st.targets)
	if err != nil {
		return loss, nil, err
	}
	r.moveTied(true)
	if err := r.head.Backward(nil); err != nil {
		return loss, nil, err
	}
	return loss, r.output(r.head.InputGrad()), nil
}

// Backward implements StageRunner.
func (r *ModelRunner) Backward(iter uint64, mb int, dout []float32) ([]float32, error) {
	k := runKey{iter, mb}
	st := r.stash[k]
	if st == nil {
		return nil, fmt.Errorf("pipeline: stage %d: backward of microbatch %d of iteration %d before its forward", r.cfg.Stage, mb, iter)
	}
	if len(dout) != r.n {
		return nil, fmt.Errorf("pipeline: stage %d: output gradient of %d elements, want %d", r.cfg.Stage, len(dout), r.n)
	}
	if !r.hasLast || r.last != k {
		r.hasLast = false
		if err := r.forward(st); err != nil {
			return nil, err
		}
		r.last, r.hasLast = k, true
		r.recomputes++
	}
	r.dev.CopyIn(r.dout, dout)
	var din []float32
	if r.cfg.Stage == 0 {
		r.moveTied(false)
	}
	if err := r.body.Backward(r.dout); err != nil {
		return nil, err
	}
	if r.cfg.Stage != 0 {
		din = r.output(r.body.InputGrad())
	}
	r.backwards++
	r.Drop(iter, mb)
	return din, nil
}

// Drop implements StageRunner.
func (r *ModelRunner) Drop(iter uint64, mb int) {
	k := runKey{iter, mb}
	if st := r.stash[k]; st != nil {
		delete(r.stash, k)
		r.release(st)
	}
	if r.last == k {
		r.hasLast = false // its input buffer may be reused
	}
}

func (r *ModelRunner) takeBuf() kernels.Buffer {
	if n := len(r.free); n > 0 {
		b := r.free[n-1]
		r.free = r.free[:n-1]
		return b
	}
	return r.dev.Alloc(r.n)
}

func (r *ModelRunner) release(st *runStash) {
	if st.buf != nil {
		r.free = append(r.free, st.buf)
	}
}
