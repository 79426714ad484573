// Package pipeline owns SkipPipe's and CheckFree's logic: which node serves
// which stage (Plan), the path each microbatch takes through the stages
// (SchedulePaths) and the rules every path obeys (Validate), the cost of a
// schedule under the simulator's model (Simulate), CheckFree's recovery of
// a lost stage from its neighbours (Rebuild, CheckFreePlus), and the relay
// that carries a schedule out (Relay, RelayDriver).
//
// Everything but RelayDriver is a pure function of its inputs and a seed:
// no I/O, no goroutines, no clock. RelayDriver is the thin driver that owns
// a goroutine and a ticker and moves the relay's messages over
// transport.Peers, the interface the collectives use too (p2p.Peers over
// libp2p; transport.MemNetwork in tests). It must not touch optimizer, p2p,
// node or the network. It reads costs from sim, which in turn takes them from
// BENCHMARKS.md.
//
// # Paths (ALGORITHMS.md 3)
//
// A microbatch's path is a sequence of (node, stage) visits starting at a
// stage-0 node; after the last visit the microbatch returns to that same node
// for the head and the loss, and its backward pass retraces the path. The
// rules, each with its sentinel error:
//
//  1. stage 0 first (and, by the return, last), never skipped nor revisited: ErrStageZero
//  2. no stage visited twice: ErrRepeat
//  3. every microbatch skips the same number of stages: ErrSkips
//  4. a jump skips at most Rules.MaxJump (3) stages, counting the stages
//     after the last visit as a jump back to stage 0's head: ErrJump
//  5. the order is the ascending order with at most Rules.MaxSwaps (2)
//     disjoint swaps of neighbouring visits: ErrSwaps
//  6. each non-first stage receives at most n_1*mu microbatches, n_1 being
//     the number of stage-0 nodes: ErrStageLoad
//     6b. (ours, off unless Rules.MinStageLoad > 0) and at least
//     MinStageLoad, so that no stage goes untrained: ErrStageUnderload
//  7. each node holds at most mu activations: it is on at most mu paths in
//     an iteration, since all of them stay stashed until the backward: ErrNodeMemory
//
// and every visit must be to a node that serves that stage: ErrPlacement.
//
// # Scheduling
//
// SchedulePaths is simpler than the paper's genetic placement and
// conflict-based A* search: a greedy construction (each microbatch, in turn,
// takes the valid stage sequence and nodes that add the least estimated
// cost, by dynamic programming over the stages), then a local search
// (reroute a microbatch, move one visit to another node of its stage, trade
// two microbatches' nodes) that keeps a move only when the event simulation
// (sim.RunJob) says the iteration got shorter. Every candidate is checked
// against the rules, so what it returns always passes Validate.
//
// # Relay
//
// Relay carries one iteration's schedule out: activations forward and
// their gradients backward along each microbatch's path, with deadlines
// in ticks, as a Step/Tick/Done/Ready state machine with no I/O, clock or
// model (relay.go; wire format in relay_wire.go). The compute sits behind
// StageRunner (ModelRunner runs model stages); RelayDriver, the one part
// with goroutines and a ticker, moves its messages over transport.Peers.
package pipeline
