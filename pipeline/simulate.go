package pipeline

import "github.com/skein-ml/skein/sim"

// Job turns paths into the simulator's task chains: for a path v0..v_{L-1},
// the forwards on v0, v1, ..., v_{L-1}; the head and loss back on v0; the
// backwards on v_{L-1}, ..., v1; the backward on v0. Every boundary between
// two nodes carries w.ActivationBytes (activations forward, their gradients
// backward).
func Job(paths []Path, stages int, w Workload) sim.Job {
	return JobOf(paths, func(s int, k sim.TaskKind) float64 {
		switch k {
		case sim.Forward:
			return w.Forward(s, stages)
		case sim.Loss:
			return w.Loss(stages)
		}
		return w.Backward(s, stages)
	}, w.ActivationBytes)
}

// StageCost is a task's work in reference seconds by stage and kind: a
// Workload's model (Job), or times measured on a real run.
type StageCost func(stage int, kind sim.TaskKind) float64

// JobOf is Job with each task's work from cost and actBytes crossing every
// boundary between two nodes.
func JobOf(paths []Path, cost StageCost, actBytes float64) sim.Job {
	job := sim.Job{Chains: make([][]sim.Task, len(paths))}
	for m, p := range paths {
		job.Chains[m] = chain(p, cost, actBytes)
	}
	return job
}

func chain(p Path, cost StageCost, act float64) []sim.Task {
	tasks := make([]sim.Task, 0, 2*len(p.Nodes)+1)
	for i, v := range p.Nodes {
		tasks = append(tasks, sim.Task{Node: v, Kind: sim.Forward, Work: cost(p.Stages[i], sim.Forward), Bytes: act})
	}
	tasks = append(tasks, sim.Task{Node: p.Nodes[0], Kind: sim.Loss, Work: cost(0, sim.Loss), Bytes: act})
	for i := len(p.Nodes) - 1; i >= 0; i-- {
		bytes := act
		if i == 0 {
			bytes = 0 // the last task: nothing to send
		}
		tasks = append(tasks, sim.Task{Node: p.Nodes[i], Kind: sim.Backward, Work: cost(p.Stages[i], sim.Backward), Bytes: bytes})
	}
	return tasks
}

// Simulate runs one iteration of paths on net with the given faults and
// returns the simulator's result; its Makespan is the iteration time.
func Simulate(net *sim.Network, paths []Path, stages int, w Workload, faults sim.Faults) (sim.Result, error) {
	return sim.RunJob(net, Job(paths, stages, w), faults)
}
