package sim

import "container/heap"

// Engine is a discrete-event clock: callbacks scheduled at a time run in
// order of (time, scheduling order). Callbacks may schedule more callbacks;
// Run returns when none is left. An Engine is not safe for concurrent use,
// and needs none: there are no goroutines in a simulation.
type Engine struct {
	now   float64
	seq   uint64
	queue eventQueue
}

type event struct {
	at  float64
	seq uint64 // ties at equal times run in scheduling order: determinism
	fn  func()
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// Now returns the current simulated time.
func (e *Engine) Now() float64 { return e.now }

// At schedules fn at time t. A time in the past is taken as now: the clock
// never runs backwards.
func (e *Engine) At(t float64, fn func()) {
	if t < e.now {
		t = e.now
	}
	e.seq++
	heap.Push(&e.queue, event{at: t, seq: e.seq, fn: fn})
}

// After schedules fn d seconds from now.
func (e *Engine) After(d float64, fn func()) { e.At(e.now+d, fn) }

// Run processes events until none is left and returns the time of the last.
func (e *Engine) Run() float64 {
	for e.queue.Len() > 0 {
		ev := heap.Pop(&e.queue).(event)
		e.now = ev.at
		ev.fn()
	}
	return e.now
}
