package experiment

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/p2p/wan"
	"github.com/skein-ml/skein/pipeline"
	"github.com/skein-ml/skein/sim"
	"github.com/skein-ml/skein/trainer"
)

// StagedTiming compares a staged run over a StagedNetwork with what the
// simulator predicts for it. The simulator gets the run's own measured
// costs: each stage's mean forward, head-and-loss and backward time on
// this machine, the mean bytes an activation (or its gradient) took on the
// wire, the emulated links (latency, rate, sim.Goodput) and the median
// handoff between two nodes' tasks beyond latency and serialization
// (encoding, QUIC's pacing, decoding, a busy CPU: every node is in this
// process, one clock times both ends); it then plays out
// every iteration's schedule (pipeline.JobOf, sim.RunJob) and models each
// stage's DiLoCo all-reduce (sim.ButterflySeconds). The first iteration
// of fresh relays (connections being set up: the run's first step and the
// first after a stage is replaced) is left out of both sides.
type StagedTiming struct {
	Iterations int `json:"iterations"` // compared
	// IterSeconds is the mean relay phase of a step: every microbatch's
	// forward and backward along its path.
	IterSeconds          float64 `json:"iter_seconds"`
	PredictedIterSeconds float64 `json:"predicted_iter_seconds"`
	// AllReduceSeconds is the mean outer exchange, all stages at once: the
	// DiLoCo all-reduce, or NoLoCo's exchange with a group.
	Rounds                    int     `json:"rounds"`
	AllReduceSeconds          float64 `json:"allreduce_seconds"`
	PredictedAllReduceSeconds float64 `json:"predicted_allreduce_seconds"`
	// RoundSeconds is H iterations and one all-reduce.
	RoundSeconds          float64 `json:"round_seconds"`
	PredictedRoundSeconds float64 `json:"predicted_round_seconds"`
	// ActivationBytes is the mean size of one activation (or gradient)
	// message on the wire, headers included.
	ActivationBytes float64 `json:"activation_bytes"`
	// MessagePaceMs is the median handoff between two nodes' tasks beyond
	// the link's latency and the message's serialization.
	MessagePaceMs float64 `json:"message_pace_ms"`
	// TaskSeconds is the measured compute, by stage: forward, head and
	// loss (stage 0), backward.
	TaskSeconds [][3]float64 `json:"task_seconds"`
}

// Error returns the prediction's relative errors: iteration and round.
func (t StagedTiming) Error() (iter, round float64) {
	return t.PredictedIterSeconds/t.IterSeconds - 1, t.PredictedRoundSeconds/t.RoundSeconds - 1
}

// String is the comparison as the demo prints it.
func (t StagedTiming) String() string {
	ie, re := t.Error()
	return fmt.Sprintf("simulator vs measured (%d iterations, %d rounds; measured compute, %.0f-byte messages paced %.1f ms): "+
		"iteration %.3fs predicted, %.3fs measured (%+.0f%%); outer exchange %.3fs predicted, %.3fs measured; "+
		"round of H steps %.2fs predicted, %.2fs measured (%+.0f%%)",
		t.Iterations, t.Rounds, t.ActivationBytes, t.MessagePaceMs, t.PredictedIterSeconds, t.IterSeconds, 100*ie,
		t.PredictedAllReduceSeconds, t.AllReduceSeconds, t.PredictedRoundSeconds, t.RoundSeconds, 100*re)
}

// stagedIter is one step's relay phase as run.
type stagedIter struct {
	paths   []pipeline.Path
	seconds float64
	cold    bool // the first of fresh relays
}

// taskCost is the run's mean measured compute of each stage and task kind,
// over all its replicas, in seconds.
func (r *stagedRun) taskCost() [][3]float64 {
	R := r.cfg.Replicas
	out := make([][3]float64, r.cfg.Stages)
	for s := range out {
		for k := range 3 {
			var busy time.Duration
			var calls int
			for j := range R {
				b, c := r.nodes[s*R+j].TaskTimes(k)
				busy, calls = busy+b, calls+c
			}
			if calls > 0 {
				out[s][k] = busy.Seconds() / float64(calls)
			}
		}
	}
	return out
}

// timing is the comparison of a run over a StagedNetwork with the
// simulator; nil without a network or with nothing to compare.
func (r *stagedRun) timing() (*StagedTiming, error) {
	if r.sw == nil {
		return nil, nil
	}
	t := &StagedTiming{TaskSeconds: r.taskCost()}
	cost := func(s int, k sim.TaskKind) float64 {
		switch k {
		case sim.Forward:
			return t.TaskSeconds[s][trainer.TaskForward]
		case sim.Loss:
			return t.TaskSeconds[0][trainer.TaskLoss]
		}
		return t.TaskSeconds[s][trainer.TaskBackward]
	}
	// Bytes per crossing: what the relay sent, over the boundaries the
	// schedules crossed (counted for every step, r.crossings).
	if r.crossings == 0 {
		return nil, nil
	}
	t.ActivationBytes = float64(r.sw.activationBytes()) / float64(r.crossings)
	t.MessagePaceMs = 1e3 * r.handoffs.pace(r.cfg.Network.Link, t.ActivationBytes)
	net, err := r.simNetwork(t.MessagePaceMs / 1e3)
	if err != nil {
		return nil, err
	}
	var measured, predicted float64
	for _, it := range r.iters {
		if it.cold {
			continue
		}
		res, err := sim.RunJob(net, pipeline.JobOf(it.paths, cost, t.ActivationBytes), sim.Faults{})
		if err != nil {
			return nil, err
		}
		measured += it.seconds
		predicted += res.Makespan
		t.Iterations++
	}
	if t.Iterations == 0 {
		return nil, nil
	}
	t.IterSeconds, t.PredictedIterSeconds = measured/float64(t.Iterations), predicted/float64(t.Iterations)
	H := float64(r.cfg.InnerSteps)
	t.RoundSeconds, t.PredictedRoundSeconds = H*t.IterSeconds, H*t.PredictedIterSeconds
	if t.Rounds = len(r.reduces); t.Rounds > 0 && r.cfg.Replicas > 1 {
		for _, d := range r.reduces {
			t.AllReduceSeconds += d
		}
		t.AllReduceSeconds /= float64(t.Rounds)
		if t.PredictedAllReduceSeconds, err = r.predictAllReduce(net); err != nil {
			return nil, err
		}
		t.RoundSeconds += t.AllReduceSeconds
		t.PredictedRoundSeconds += t.PredictedAllReduceSeconds
	}
	return t, nil
}

// simNetwork is the emulated network as the simulator sees it: one node
// per stage replica, each with the emulated uplink (the emulator shapes
// what a node sends; its downlink is not limited) and half the one-way
// latency as its access latency, so that a link's latency is the
// emulator's; the measured pace of a handoff; compute speed 1, since the
// costs are this machine's.
func (r *stagedRun) simNetwork(pace float64) (*sim.Network, error) {
	l := r.cfg.Network.Link
	const unlimited = 1_000_000 // Mbit/s: sim's ceiling
	up := float64(unlimited)
	if l.Rate > 0 {
		up = min(l.Rate/1e6, unlimited)
	}
	spec := sim.Spec{Name: "staged-demo", Goodput: sim.Goodput, MessagePaceMs: 1e3 * pace,
		Regions: []string{"loopback"}, LatencyMs: [][]float64{{0}}}
	for v := range r.nodes {
		spec.Nodes = append(spec.Nodes, sim.NodeSpec{ID: fmt.Sprintf("n%d", v), Region: "loopback", Speed: 1, MemoryGiB: 1,
			UpMbps: up, DownMbps: unlimited, AccessMs: float64(l.Latency) / float64(time.Millisecond) / 2})
	}
	return sim.NewNetwork(spec)
}

// predictAllReduce models every stage's outer exchange (they run at once,
// each among its own replicas): the butterfly (DiLoCo) or one exchange
// with the group (NoLoCo); it returns the slowest.
func (r *stagedRun) predictAllReduce(net *sim.Network) (float64, error) {
	R := r.cfg.Replicas
	var worst float64
	for s := range r.cfg.Stages {
		n := r.nodes[s*R].Len()
		enc, err := compression.NewEncoder(codecConfig(r.cfg.Outer))
		if err != nil {
			return 0, err
		}
		wire, err := enc.Append(nil, make([]float32, n), 0)
		enc.Close()
		if err != nil {
			return 0, err
		}
		up, down := make([]float64, R), make([]float64, R)
		var lat, pace float64
		for k := range R {
			v := s*R + k
			l := net.Link(v, (v+1)%len(r.nodes))
			up[k], down[k] = l.Rate, math.Inf(1)
			lat, pace = max(lat, l.Latency), max(pace, l.Pace)
		}
		fp32 := 4 * float64(n)
		if r.cfg.Outer == compression.FP32 {
			fp32 = 0 // no codec to run
		}
		if r.cfg.StageOuter == NoLoCo {
			// One exchange with the group: phi (bf16, 2 bytes a value)
			// and the outer gradient on the wire, to each partner.
			partners := float64(min(r.cfg.NoLoCo.GroupSize, R) - 1)
			bytes := partners * (2*float64(n) + float64(len(wire)))
			worst = max(worst, lat+pace+bytes/up[0])
			continue
		}
		worst = max(worst, sim.ButterflySeconds(up, down, lat, pace, float64(len(wire)), fp32))
	}
	return worst, nil
}

// handoffs collects the compute tasks of every microbatch, by iteration
// and microbatch, as the nodes run them (one process, one clock): the gap
// between one task's end and the next one's start on another node is a
// handoff, what the simulator models as latency, serialization and pace.
type handoffs struct {
	mu    sync.Mutex
	spans map[[2]uint64][]trainer.TaskSpan
}

func (h *handoffs) add(iter uint64, mb int, sp trainer.TaskSpan) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := [2]uint64{iter, uint64(mb)}
	if _, ok := h.spans[k]; !ok && len(h.spans) >= maxHandoffMicrobatches {
		return
	}
	h.spans[k] = append(h.spans[k], sp)
}

// pace is the median handoff beyond the link's latency and the bytes'
// serialization at the emulated rate (with sim.Goodput), at least 0:
// encoding, the stream, QUIC's pacing, decoding and the wait for the
// receiver's compute goroutine, all of which the link model leaves out.
func (h *handoffs) pace(l wan.Link, bytes float64) float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	ser := 0.0
	if l.Rate > 0 {
		ser = bytes * 8 / (l.Rate * sim.Goodput)
	}
	var extra []float64
	for _, spans := range h.spans {
		slices.SortFunc(spans, func(a, b trainer.TaskSpan) int { return a.Began.Compare(b.Began) })
		for i := 0; i+1 < len(spans); i++ {
			if spans[i].Node != spans[i+1].Node {
				extra = append(extra, spans[i+1].Began.Sub(spans[i].Ended).Seconds()-l.Latency.Seconds()-ser)
			}
		}
	}
	if len(extra) == 0 {
		return 0
	}
	slices.Sort(extra)
	return max(0, extra[len(extra)/2])
}

// crossings counts the boundaries between two nodes that paths cross:
// one message each (an activation forward or a gradient back).
func crossings(paths []pipeline.Path) int {
	n := 0
	for _, ch := range pipeline.JobOf(paths, func(int, sim.TaskKind) float64 { return 0 }, 1).Chains {
		for i := 0; i+1 < len(ch); i++ {
			if ch[i].Bytes > 0 && ch[i].Node != ch[i+1].Node {
				n++
			}
		}
	}
	return n
}

// Bounds on what a long run keeps for the comparison: the first
// maxTimedIters steps' schedules and times, and the handoffs of the first
// maxHandoffMicrobatches microbatches, far more than the means need.
const (
	maxTimedIters          = 5000
	maxHandoffMicrobatches = 20000
)
