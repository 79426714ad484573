// Package sim is a deterministic discrete-event simulator of a volunteer
// swarm: nodes with a compute speed and memory, links with a latency and a
// bandwidth, stragglers and failures. It owns
//
//   - the event engine (Engine): a clock and a queue of callbacks ordered by
//     (time, insertion order), so equal-time events run in a fixed order;
//   - the network description (Network, Spec) and its JSON file format,
//     with the networks the repository ships under networks/;
//   - the execution of a pipeline iteration (RunJob): microbatches as chains
//     of compute tasks on nodes, activations and gradients crossing links;
//   - the cost constants measured in BENCHMARKS.md (measured.go), which every
//     simulated duration is built from;
//   - the projection of the outer-step designs (DiLoCo ring, hierarchical
//     DiLoCo, NoLoCo, butterfly) to 10,000 volunteers (Project), with an SVG
//     plot and a markdown table of the result.
//
// It must not touch the network, the disk (beyond the files it embeds), the
// wall clock or goroutines: every result is a pure function of its inputs and
// a seed, so a scheduler can evaluate thousands of candidate schedules and a
// test can state exact expected times. It imports nothing from the project;
// pipeline builds on it, never the other way round.
//
// # Units
//
// Times are float64 seconds, sizes float64 bytes, bandwidths bytes per
// second. Node compute is a speed relative to the reference machine of
// BENCHMARKS.md (one thread of the 2-core AMD EPYC): a task of work w
// reference-seconds takes w/speed seconds on a node of that speed.
//
// # Link model
//
// A transfer of b bytes from node i to node j occupies i's uplink for
// b / (Goodput * min(up_i, down_j)) seconds, first come first served (a node
// sends one message at a time, as transport.MemNetwork emulates it), and
// arrives Latency(i, j) after its last byte left. Downlinks are not queued:
// home connections are asymmetric, and the uplink is the narrow end.
package sim
