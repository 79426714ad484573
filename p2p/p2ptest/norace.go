//go:build !race

package p2ptest

const raceEnabled = false

// Slowdown scales time budgets in tests: 1 without the race detector.
const Slowdown = 1
