package demo

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/skein-ml/skein/pipeline"
)

// TestCheckFreeSources: the demo's copy of the rule (it does not import
// pipeline) names the stages pipeline.Recover rebuilds from.
func TestCheckFreeSources(t *testing.T) {
	for S := 2; S <= 8; S++ {
		for _, plus := range []bool{false, true} {
			for lost := range S {
				var want []int
				if rec, err := pipeline.Recover(lost, S, plus); err == nil {
					want = rec.From
				}
				if got := checkFreeSources(lost, S, plus); !slices.Equal(got, want) {
					t.Errorf("stage %d of %d (plus %v): %v, pipeline.Recover %v", lost, S, plus, got, want)
				}
			}
		}
	}
}

// TestFailStage: the stage lost halfway holds no hostile member and, for
// checkfree-norm, is rebuilt from a hostile member's stage.
func TestFailStage(t *testing.T) {
	tests := []struct {
		name       string
		mode       string
		want, S    int
		held       []int
		got        int
		cannotLand bool
	}{
		{name: "staged-grad elsewhere", mode: hostileStagedGrad, want: 2, S: 3, held: []int{0}, got: 2},
		{name: "staged-grad in the fail stage", mode: hostileStagedGrad, want: 2, S: 3, held: []int{2}, got: 1},
		{name: "checkfree-norm beside the fail stage", mode: hostileCheckFreeNorm, want: 2, S: 3, held: []int{1}, got: 2},
		{name: "checkfree-norm in the fail stage", mode: hostileCheckFreeNorm, want: 2, S: 3, held: []int{2}, got: 1},
		{name: "checkfree-norm in stage 0", mode: hostileCheckFreeNorm, want: 2, S: 3, held: []int{0}, got: 2, cannotLand: true},
		{name: "checkfree-norm, 5 stages", mode: hostileCheckFreeNorm, want: 4, S: 5, held: []int{1}, got: 2},
		{name: "not placed yet", mode: hostileCheckFreeNorm, want: 2, S: 3, got: 2, cannotLand: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, note := failStage(tt.want, tt.S, true, tt.mode, tt.held)
			if got != tt.got || (note != "") != tt.cannotLand {
				t.Fatalf("stage %d (%q), want %d (a note: %v)", got, note, tt.got, tt.cannotLand)
			}
		})
	}
}

// TestLossRounds: the rounds counted before a hostile staged run is judged
// are the distinct iterations with a stage-0 loss, across logs; a round
// whose microbatches all failed (no loss) and other stages' lines do not
// count.
func TestLossRounds(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")
	for name, text := range map[string]string{
		a: "iteration 5 (round 1): stage 0, loss 5.2865, 5.2s\niteration 10 (round 2): stage 0, loss 4.7, 1.1s\n" +
			"iteration 15 (round 3): stage 0, 4 microbatches failed, 8.4s\n",
		b: "iteration 10 (round 2): stage 0, loss 4.8, 1.1s\niteration 35 (round 7): stage 0, loss 3.7, 1 microbatches failed, 16.4s\n" +
			"iteration 40 (round 8): stage 1, loss 3.1, 1.0s\n",
	} {
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		logs []string
		want int
	}{
		{nil, 0},
		{[]string{a}, 2},
		{[]string{b}, 2},
		{[]string{a, b}, 3},
		{[]string{a, filepath.Join(dir, "missing.log")}, 2},
	} {
		if got := lossRounds(tc.logs); got != tc.want {
			t.Errorf("lossRounds(%v) = %d, want %d", tc.logs, got, tc.want)
		}
	}
}
