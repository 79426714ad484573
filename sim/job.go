package sim

import (
	"fmt"
	"math"
	"slices"
)

// TaskKind says what a task computes. It sets a node's order of work when
// several tasks wait: backward first, then loss, then forward, the 1F1B rule
// that frees stashed activations soonest and finishes the oldest microbatch
// first.
type TaskKind uint8

// Task kinds, in the order a node prefers them.
const (
	Backward TaskKind = iota
	Loss
	Forward
)

func (k TaskKind) String() string {
	switch k {
	case Backward:
		return "backward"
	case Loss:
		return "loss"
	case Forward:
		return "forward"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Task is one unit of compute of a microbatch on one node.
type Task struct {
	Node int
	Kind TaskKind
	// Work is the task's duration on the reference machine, in seconds; it
	// takes Work / Speed (times the node's slowdown, if any) on its node.
	Work float64
	// Bytes are sent to the next task's node when the task finishes
	// (activations forward, gradients backward). Nothing is sent after the
	// last task, or when the next task runs on the same node.
	Bytes float64
}

// Job is one pipeline iteration: one chain of tasks per microbatch, each
// task starting when the previous one finished and its bytes arrived.
type Job struct {
	Chains [][]Task
}

// Faults are the stragglers and failures of one run.
type Faults struct {
	// Slowdown multiplies the compute times of a node (2: twice as slow).
	Slowdown map[int]float64
	// FailAt is the time a node dies: what runs or waits on it is lost, what
	// it was still sending is lost, and any microbatch that reaches it later
	// is lost.
	FailAt map[int]float64
}

// Result is what a run of a Job produced.
type Result struct {
	// Makespan is the time the last microbatch that was not lost finished.
	Makespan float64
	// Finish is per chain: when its last task ended, +Inf if it was lost.
	Finish []float64
	// Lost lists the chains that did not finish, in increasing order.
	Lost []int
	// ComputeBusy and UplinkBusy are per node: seconds spent computing and
	// sending.
	ComputeBusy, UplinkBusy []float64
}

// RunJob simulates one iteration of job on net. Every node computes one task
// at a time, choosing among waiting tasks by kind (Backward, Loss, Forward),
// then by arrival time, then by chain index; its uplink sends one message at
// a time in the order they were produced (see the package doc for the link
// model).
func RunJob(net *Network, job Job, faults Faults) (Result, error) {
	if err := validateJob(net, job, faults); err != nil {
		return Result{}, err
	}
	r := newJobRun(net, job, faults)
	return r.run(), nil
}

func validateJob(net *Network, job Job, faults Faults) error {
	for c, chain := range job.Chains {
		if len(chain) == 0 {
			return fmt.Errorf("%w: chain %d has no tasks", ErrJob, c)
		}
		for i, t := range chain {
			switch {
			case t.Node < 0 || t.Node >= net.N():
				return fmt.Errorf("%w: chain %d task %d on node %d of %d", ErrJob, c, i, t.Node, net.N())
			case t.Kind > Forward:
				return fmt.Errorf("%w: chain %d task %d has kind %d", ErrJob, c, i, t.Kind)
			case !inRange(t.Work, 0, math.MaxFloat64) || !inRange(t.Bytes, 0, math.MaxFloat64):
				return fmt.Errorf("%w: chain %d task %d: work %v, bytes %v", ErrJob, c, i, t.Work, t.Bytes)
			}
		}
	}
	for v, f := range faults.Slowdown {
		if v < 0 || v >= net.N() || !(f > 0) || math.IsInf(f, 0) {
			return fmt.Errorf("%w: slowdown %v on node %d", ErrJob, f, v)
		}
	}
	for v, t := range faults.FailAt {
		if v < 0 || v >= net.N() || !inRange(t, 0, math.MaxFloat64) {
			return fmt.Errorf("%w: failure at %v on node %d", ErrJob, t, v)
		}
	}
	return nil
}

// waiting is a task ready to run on its node.
type waiting struct {
	chain, index int
	since        float64
}

type jobRun struct {
	eng    Engine
	net    *Network
	job    Job
	slow   []float64 // per node, 1 when not a straggler
	failAt []float64 // per node, +Inf when it never fails
	dead   []bool

	queue   [][]waiting // per node
	running []int       // per node: the chain computing there, -1 when idle
	upFree  []float64   // per node: when its uplink has sent everything queued
	lost    []bool      // per chain
	res     Result
}

func newJobRun(net *Network, job Job, faults Faults) *jobRun {
	n := net.N()
	r := &jobRun{
		net: net, job: job,
		slow:    make([]float64, n),
		failAt:  make([]float64, n),
		dead:    make([]bool, n),
		queue:   make([][]waiting, n),
		running: make([]int, n),
		upFree:  make([]float64, n),
		lost:    make([]bool, len(job.Chains)),
		res: Result{
			Finish:      make([]float64, len(job.Chains)),
			ComputeBusy: make([]float64, n),
			UplinkBusy:  make([]float64, n),
		},
	}
	for v := range n {
		r.slow[v], r.failAt[v], r.running[v] = 1, math.Inf(1), -1
		if f, ok := faults.Slowdown[v]; ok {
			r.slow[v] = f
		}
		if t, ok := faults.FailAt[v]; ok {
			r.failAt[v] = t
		}
	}
	return r
}

func (r *jobRun) run() Result {
	// Failures are scheduled first, in node order, so that a failure and a
	// task ending at the same instant resolve the same way every run: the
	// node is dead first.
	for v, t := range r.failAt {
		if !math.IsInf(t, 1) {
			r.eng.At(t, func() { r.fail(v) })
		}
	}
	for c, chain := range r.job.Chains {
		r.eng.At(0, func() { r.arrive(chain[0].Node, waiting{chain: c, index: 0}) })
	}
	r.eng.Run()
	for c, lost := range r.lost {
		if lost {
			r.res.Finish[c] = math.Inf(1)
			r.res.Lost = append(r.res.Lost, c)
		} else {
			r.res.Makespan = max(r.res.Makespan, r.res.Finish[c])
		}
	}
	return r.res
}

// arrive queues a task on its node, now, and starts it if the node is idle.
func (r *jobRun) arrive(v int, w waiting) {
	if r.lost[w.chain] {
		return
	}
	if r.dead[v] {
		r.lost[w.chain] = true
		return
	}
	w.since = r.eng.Now()
	r.queue[v] = append(r.queue[v], w)
	r.startNext(v)
}

// startNext runs the node's preferred waiting task if the node is idle.
func (r *jobRun) startNext(v int) {
	if r.running[v] >= 0 || r.dead[v] || len(r.queue[v]) == 0 {
		return
	}
	best := 0
	for i := 1; i < len(r.queue[v]); i++ {
		if r.before(r.queue[v][i], r.queue[v][best]) {
			best = i
		}
	}
	w := r.queue[v][best]
	r.queue[v] = slices.Delete(r.queue[v], best, best+1)
	t := r.job.Chains[w.chain][w.index]
	d := t.Work / r.net.nodes[v].Speed * r.slow[v]
	r.running[v] = w.chain
	r.eng.After(d, func() { r.done(v, w, d) })
}

func (r *jobRun) before(a, b waiting) bool {
	ka, kb := r.job.Chains[a.chain][a.index].Kind, r.job.Chains[b.chain][b.index].Kind
	if ka != kb {
		return ka < kb
	}
	if a.since != b.since {
		return a.since < b.since
	}
	return a.chain < b.chain
}

// done ends a task and moves its chain on: to the same node, over a link, or
// to the finish.
func (r *jobRun) done(v int, w waiting, d float64) {
	if r.dead[v] {
		return // fail() already marked the chain lost
	}
	r.running[v] = -1
	r.res.ComputeBusy[v] += d
	chain := r.job.Chains[w.chain]
	if w.index == len(chain)-1 {
		r.res.Finish[w.chain] = r.eng.Now()
	} else {
		r.send(v, chain[w.index].Bytes, waiting{chain: w.chain, index: w.index + 1})
	}
	r.startNext(v)
}

// send moves a chain's next task to its node: through v's uplink queue, then
// the link's latency and pace. Bytes still leaving v when it dies are lost with it.
func (r *jobRun) send(v int, bytes float64, next waiting) {
	to := r.job.Chains[next.chain][next.index].Node
	if to == v {
		r.arrive(v, next)
		return
	}
	link := r.net.Link(v, to)
	start := max(r.eng.Now(), r.upFree[v])
	end := start + link.Serialize(bytes)
	r.upFree[v] = end
	r.res.UplinkBusy[v] += end - start
	r.eng.At(end+link.Latency+link.Pace, func() {
		if r.failAt[v] < end {
			r.lost[next.chain] = true
			return
		}
		r.arrive(to, next)
	})
}

// fail kills node v: its running and waiting tasks are lost.
func (r *jobRun) fail(v int) {
	r.dead[v] = true
	if c := r.running[v]; c >= 0 {
		r.lost[c] = true
		r.running[v] = -1
	}
	for _, w := range r.queue[v] {
		r.lost[w.chain] = true
	}
	r.queue[v] = nil
}
