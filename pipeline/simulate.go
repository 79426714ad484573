package pipeline

import "github.com/skein-ml/skein/sim"

// Job turns paths into the simulator's task chains: for a path v0..v_{L-1},
// the forwards on v0, v1, ..., v_{L-1}; the head and loss back on v0; the
// backwards on v_{L-1}, ..., v1; the backward on v0. Every boundary between
// two nodes carries w.ActivationBytes (activations forward, their gradients
// backward).
func Job(paths []Path, stages int, w Workload) sim.Job {
	job := sim.Job{Chains: make([][]sim.Task, len(paths))}
	for m, p := range paths {
		job.Chains[m] = chain(p, stages, w)
	}
	return job
}

func chain(p Path, stages int, w Workload) []sim.Task {
	act := w.ActivationBytes
	tasks := make([]sim.Task, 0, 2*len(p.Nodes)+1)
	for i, v := range p.Nodes {
		tasks = append(tasks, sim.Task{Node: v, Kind: sim.Forward, Work: w.Forward(p.Stages[i], stages), Bytes: act})
	}
	tasks = append(tasks, sim.Task{Node: p.Nodes[0], Kind: sim.Loss, Work: w.Loss(stages), Bytes: act})
	for i := len(p.Nodes) - 1; i >= 0; i-- {
		bytes := act
		if i == 0 {
			bytes = 0 // the last task: nothing to send
		}
		tasks = append(tasks, sim.Task{Node: p.Nodes[i], Kind: sim.Backward, Work: w.Backward(p.Stages[i], stages), Bytes: bytes})
	}
	return tasks
}

// Simulate runs one iteration of paths on net with the given faults and
// returns the simulator's result; its Makespan is the iteration time.
func Simulate(net *sim.Network, paths []Path, stages int, w Workload, faults sim.Faults) (sim.Result, error) {
	return sim.RunJob(net, Job(paths, stages, w), faults)
}
