//go:build race

package pipeline

// raceEnabled cuts the property tests' counts under -race, which runs them
// about ten times slower; -short cuts them further.
const raceEnabled = true
