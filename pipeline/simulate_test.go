package pipeline

import (
	"slices"
	"testing"

	"github.com/skein-ml/skein/sim"
)

// TestJobChain: a path of 3 stages becomes forwards out, loss at the origin,
// backwards back, with the workload's costs.
func TestJobChain(t *testing.T) {
	w := Workload{Layers: 6, LayerForward: 1, BackwardRatio: 2, LossFactor: 0.25, ActivationBytes: 100}
	job := Job([]Path{{Nodes: []int{7, 3, 5}, Stages: []int{0, 2, 1}}}, 3, w)
	var nodes []int
	var kinds []sim.TaskKind
	var work, bytes []float64
	for _, task := range job.Chains[0] {
		nodes = append(nodes, task.Node)
		kinds = append(kinds, task.Kind)
		work = append(work, task.Work)
		bytes = append(bytes, task.Bytes)
	}
	F, L, B := sim.Forward, sim.Loss, sim.Backward
	// 2 layers per stage: forward 2 s, backward 4 s, loss 0.25 * 2 = 0.5 s.
	if !slices.Equal(nodes, []int{7, 3, 5, 7, 5, 3, 7}) ||
		!slices.Equal(kinds, []sim.TaskKind{F, F, F, L, B, B, B}) ||
		!slices.Equal(work, []float64{2, 2, 2, 0.5, 4, 4, 4}) ||
		!slices.Equal(bytes, []float64{100, 100, 100, 100, 100, 100, 0}) {
		t.Errorf("chain: nodes %v kinds %v work %v bytes %v", nodes, kinds, work, bytes)
	}
}

// TestSimulateTwoStages runs sim's hand-computed case through the pipeline:
// nodes A (stage 0) and B, 1 s per forward, 2 s per backward, 0.5 s loss,
// 1 s to send an activation and 0.25 s latency: 11.5 s for one microbatch
// (sim's TestRunJobHandComputed has the timeline), 13.5 s for two.
func TestSimulateTwoStages(t *testing.T) {
	node := func(id string) sim.NodeSpec {
		return sim.NodeSpec{ID: id, Region: "r", Speed: 1, MemoryGiB: 1, UpMbps: 16, DownMbps: 16}
	}
	net, err := sim.NewNetwork(sim.Spec{Name: "two", Goodput: 0.5, Regions: []string{"r"}, LatencyMs: [][]float64{{250}}, Nodes: []sim.NodeSpec{node("A"), node("B")}})
	if err != nil {
		t.Fatal(err)
	}
	w := Workload{Layers: 2, LayerForward: 1, BackwardRatio: 2, LossFactor: 0.5, ActivationBytes: 1e6}
	p := Path{Nodes: []int{0, 1}, Stages: []int{0, 1}}
	for _, tt := range []struct {
		paths []Path
		want  float64
	}{{[]Path{p}, 11.5}, {[]Path{p, p}, 13.5}} {
		res, err := Simulate(net, tt.paths, 2, w, sim.Faults{})
		if err != nil || res.Makespan != tt.want {
			t.Errorf("%d microbatches: %v s (%v), want %v", len(tt.paths), res.Makespan, err, tt.want)
		}
	}
}
