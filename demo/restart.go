package demo

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"time"
)

// Restarts is how long the honest volunteers took, from starting, to
// compute a round of their own (not one adopted): each life in their logs,
// a first start and every restart of the chaos soak.
type Restarts struct {
	Lives  int             // starts that computed a round
	Wall   []time.Duration // per such start, sorted
	Rounds []int           // per start, the round computed minus the run's round when it began, sorted
}

// firstRound is a volunteer's line for its first computed round
// (node/volunteer.go).
var firstRound = regexp.MustCompile(`first round computed ([0-9.]+)s after starting: round \d+, (-?\d+) after`)

// readRestarts reads the first-round lines of logs.
func readRestarts(logs []string) Restarts {
	var r Restarts
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		for _, m := range firstRound.FindAllSubmatch(b, -1) {
			sec, err1 := strconv.ParseFloat(string(m[1]), 64)
			k, err2 := strconv.Atoi(string(m[2]))
			if err1 != nil || err2 != nil {
				continue
			}
			r.Lives++
			r.Wall = append(r.Wall, time.Duration(sec*float64(time.Second)))
			r.Rounds = append(r.Rounds, k)
		}
	}
	slices.Sort(r.Wall)
	slices.Sort(r.Rounds)
	return r
}

// String is the summary's line: the median and the worst.
func (r Restarts) String() string {
	if r.Lives == 0 {
		return "no volunteer computed a round"
	}
	return fmt.Sprintf("%d starts: median %v, worst %v; rounds after the run's round at start: median %d, worst %d",
		r.Lives, r.Wall[len(r.Wall)/2].Round(100*time.Millisecond), r.Wall[len(r.Wall)-1].Round(100*time.Millisecond),
		r.Rounds[len(r.Rounds)/2], r.Rounds[len(r.Rounds)-1])
}
