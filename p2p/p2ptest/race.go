//go:build race

package p2ptest

const raceEnabled = true

// Slowdown scales time budgets in tests: the race detector makes
// everything several times slower.
const Slowdown = 5
