package sim

import (
	"math"
	"slices"
	"testing"
)

// twoNodes is the hand-computable network: nodes A (0) and B (1) in one
// region, speed 1, links of exactly 0.25 s latency and 1e6 bytes/s
// (16 Mbit/s at goodput 0.5). Every time below is a multiple of 0.25, so the
// float sums are exact and the expected values can be compared with ==.
func twoNodes(t *testing.T) *Network {
	t.Helper()
	node := func(id string) NodeSpec {
		return NodeSpec{ID: id, Region: "r", Speed: 1, MemoryGiB: 1, UpMbps: 16, DownMbps: 16}
	}
	net, err := NewNetwork(Spec{
		Name: "two", Goodput: 0.5, Regions: []string{"r"}, LatencyMs: [][]float64{{250}},
		Nodes: []NodeSpec{node("A"), node("B")},
	})
	if err != nil {
		t.Fatal(err)
	}
	return net
}

// twoStage is one microbatch of a 2-stage pipeline on A (stage 0) and B:
// forward 1 s per stage, loss 0.5 s on A, backward 2 s per stage, 1e6 bytes
// (1 s of uplink) across every boundary.
func twoStage() []Task {
	const b = 1e6
	return []Task{
		{Node: 0, Kind: Forward, Work: 1, Bytes: b},
		{Node: 1, Kind: Forward, Work: 1, Bytes: b},
		{Node: 0, Kind: Loss, Work: 0.5, Bytes: b},
		{Node: 1, Kind: Backward, Work: 2, Bytes: b},
		{Node: 0, Kind: Backward, Work: 2},
	}
}

func TestRunJobHandComputed(t *testing.T) {
	tests := []struct {
		name         string
		chains       int
		faults       Faults
		finish       []float64 // +Inf: lost
		busyA, busyB float64
	}{
		{
			// A.F 0-1, send 1-2 +0.25, B.F 2.25-3.25, send -4.25 +0.25,
			// A.loss 4.5-5, send -6 +0.25, B.B 6.25-8.25, send -9.25 +0.25,
			// A.B 9.5-11.5.
			name: "one microbatch", chains: 1,
			finish: []float64{11.5}, busyA: 3.5, busyB: 3,
		},
		{
			// A: m0.F 0-1, m1.F 1-2; sends 1-2 and 2-3 reach B at 2.25 and 3.25.
			// B: m0.F 2.25-3.25 (m1 arrives at 3.25 and waits), m1.F 3.25-4.25;
			// its sends 3.25-4.25 and 4.25-5.25 reach A at 4.5 and 5.5.
			// A: m0.loss 4.5-5 (send 5-6, at B 6.25), m1.loss 5.5-6 (send 6-7, at B 7.25).
			// B: m0.B 6.25-8.25, m1.B 8.25-10.25 (backward waits its turn);
			// sends 8.25-9.25 and 10.25-11.25 reach A at 9.5 and 11.5.
			// A: m0.B 9.5-11.5, m1.B 11.5-13.5.
			name: "two microbatches", chains: 2,
			finish: []float64{11.5, 13.5}, busyA: 7, busyB: 6,
		},
		{
			// B twice as slow. A: m0.F 0-1, m1.F 1-2, sends reach B at 2.25, 3.25.
			// B: m0.F 2.25-4.25, m1.F 4.25-6.25; sends 4.25-5.25 (A at 5.5),
			// 6.25-7.25 (A at 7.5).
			// A: m0.loss 5.5-6 (send 6-7, B at 7.25); m1.loss 7.5-8 (send 8-9, B at 9.25).
			// B: m0.B 7.25-11.25, m1.B 11.25-15.25; sends 11.25-12.25 (A at 12.5),
			// 15.25-16.25 (A at 16.5).
			// A: m0.B 12.5-14.5, m1.B 16.5-18.5.
			name: "straggler", chains: 2, faults: Faults{Slowdown: map[int]float64{1: 2}},
			finish: []float64{14.5, 18.5}, busyA: 7, busyB: 12,
		},
		{
			// The straggler case with B dying at 12.5: m0's gradient left B by
			// 12.25, so m0 ends at 14.5; m1 was computing on B: lost.
			name: "straggler dies after sending", chains: 2,
			faults: Faults{Slowdown: map[int]float64{1: 2}, FailAt: map[int]float64{1: 12.5}},
			finish: []float64{14.5, math.Inf(1)}, busyA: 5, busyB: 8,
		},
		{
			// B dying at 12 is still sending m0's gradient (11.25-12.25): both lost.
			name: "straggler dies while sending", chains: 2,
			faults: Faults{Slowdown: map[int]float64{1: 2}, FailAt: map[int]float64{1: 12}},
			finish: []float64{math.Inf(1), math.Inf(1)}, busyA: 3, busyB: 8,
		},
	}
	net := twoNodes(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var job Job
			for range tt.chains {
				job.Chains = append(job.Chains, twoStage())
			}
			res, err := RunJob(net, job, tt.faults)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(res.Finish, tt.finish) {
				t.Errorf("finish times %v, want %v", res.Finish, tt.finish)
			}
			var makespan float64
			var lost []int
			for c, f := range tt.finish {
				if math.IsInf(f, 1) {
					lost = append(lost, c)
				} else {
					makespan = max(makespan, f)
				}
			}
			if res.Makespan != makespan || !slices.Equal(res.Lost, lost) {
				t.Errorf("makespan %v lost %v, want %v and %v", res.Makespan, res.Lost, makespan, lost)
			}
			if res.ComputeBusy[0] != tt.busyA || res.ComputeBusy[1] != tt.busyB {
				t.Errorf("compute busy A %v B %v, want %v and %v", res.ComputeBusy[0], res.ComputeBusy[1], tt.busyA, tt.busyB)
			}
		})
	}
}

func TestRunJobRejectsBadJobs(t *testing.T) {
	net := twoNodes(t)
	bad := []struct {
		name   string
		job    Job
		faults Faults
	}{
		{"empty chain", Job{Chains: [][]Task{{}}}, Faults{}},
		{"node out of range", Job{Chains: [][]Task{{{Node: 2}}}}, Faults{}},
		{"negative work", Job{Chains: [][]Task{{{Work: -1}}}}, Faults{}},
		{"NaN bytes", Job{Chains: [][]Task{{{Bytes: math.NaN()}}}}, Faults{}},
		{"zero slowdown", Job{}, Faults{Slowdown: map[int]float64{0: 0}}},
		{"failure on unknown node", Job{}, Faults{FailAt: map[int]float64{5: 1}}},
	}
	for _, tt := range bad {
		if _, err := RunJob(net, tt.job, tt.faults); err == nil {
			t.Errorf("%s: accepted", tt.name)
		}
	}
}

func TestEngineOrder(t *testing.T) {
	var e Engine
	var got []int
	e.At(2, func() { got = append(got, 3) })
	e.At(1, func() {
		got = append(got, 1)
		e.After(0, func() { got = append(got, 2) }) // same time, scheduled later: runs after
		e.At(0, func() { got = append(got, 2) })    // the past is now
	})
	if end := e.Run(); end != 2 {
		t.Errorf("Run ended at %v, want 2", end)
	}
	if !slices.Equal(got, []int{1, 2, 2, 3}) {
		t.Errorf("order %v", got)
	}
}
