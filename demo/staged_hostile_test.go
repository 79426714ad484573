package demo

import (
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
