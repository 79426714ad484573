package pipeline

import (
	"errors"
	"testing"
)

// fixedPlacement: 6 stages; nodes 0,1 serve stage 0, nodes 2..11 serve
// stages 1..5 two each (node 2+2(s-1) and 3+2(s-1) serve stage s).
func fixedPlacement() Placement {
	return Placement{Stages: 6, StageOf: []int{0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5}}
}

func path(nodes ...int) Path {
	p := Path{Nodes: nodes}
	pl := fixedPlacement()
	for _, v := range nodes {
		s := -1
		if v >= 0 && v < len(pl.StageOf) {
			s = pl.StageOf[v]
		}
		p.Stages = append(p.Stages, s)
	}
	return p
}

func TestValidate(t *testing.T) {
	r := DefaultRules() // 6 stages, L = 4, jumps <= 3, swaps <= 2, mu = 3
	pl := fixedPlacement()
	tests := []struct {
		name  string
		paths []Path
		rules Rules
		want  error // nil: valid
	}{
		{"ascending", []Path{path(0, 2, 4, 6)}, r, nil},
		{"one swap", []Path{path(0, 4, 2, 6)}, r, nil},
		{"two disjoint swaps", []Path{Path{Nodes: []int{0, 4, 2, 8, 6}, Stages: []int{0, 2, 1, 4, 3}}}, Rules{Stages: 6, Skip: 1, MaxJump: 3, MaxSwaps: 2, Mu: 3}, nil},
		{"swap not allowed", []Path{path(0, 4, 2, 6)}, Rules{Stages: 6, Skip: 2, MaxJump: 3, MaxSwaps: 0, Mu: 3}, ErrSwaps},
		{"a stage moved two places", []Path{path(0, 6, 2, 4)}, r, ErrSwaps},
		{"reversed", []Path{path(0, 10, 8, 6)}, r, ErrSwaps},
		{"starts past stage 0", []Path{path(2, 4, 6, 8)}, r, ErrStageZero},
		{"revisits stage 0", []Path{path(0, 2, 1, 4)}, r, ErrStageZero},
		{"repeats a stage", []Path{path(0, 2, 3, 4)}, r, ErrRepeat},
		{"too short", []Path{path(0, 2, 4)}, r, ErrSkips},
		{"too long", []Path{path(0, 2, 4, 6, 8)}, r, ErrSkips},
		// Jumps: with 6 stages and L = 2, {0, 1} leaves 4 stages before the head.
		{"jump to the head too long", []Path{path(0, 2)}, Rules{Stages: 6, Skip: 4, MaxJump: 3, MaxSwaps: 2, Mu: 3}, ErrJump},
		{"jump to the head of 3", []Path{path(0, 4)}, Rules{Stages: 6, Skip: 4, MaxJump: 3, MaxSwaps: 2, Mu: 3}, nil},
		{"jump of 4 from stage 0", []Path{path(0, 10)}, Rules{Stages: 6, Skip: 4, MaxJump: 3, MaxSwaps: 2, Mu: 3}, ErrJump},
		{"jump of 2 with max 1", []Path{path(0, 2, 8, 10)}, Rules{Stages: 6, Skip: 2, MaxJump: 1, MaxSwaps: 2, Mu: 3}, ErrJump},
		{"wrong node for stage", []Path{{Nodes: []int{0, 3, 4, 6}, Stages: []int{0, 2, 2, 3}}}, r, ErrPlacement},
		{"node out of range", []Path{{Nodes: []int{0, 99, 4, 6}, Stages: []int{0, 1, 2, 3}}}, r, ErrMalformed},
		{"stage out of range", []Path{{Nodes: []int{0, 2, 4, 6}, Stages: []int{0, 1, 2, 9}}}, r, ErrMalformed},
		{"lengths differ", []Path{{Nodes: []int{0, 2}, Stages: []int{0}}}, r, ErrMalformed},
		{"empty path", []Path{{}}, r, ErrMalformed},
		{"node at mu", []Path{path(0, 2, 4, 6), path(0, 2, 4, 8), path(0, 2, 6, 8)}, r, nil},
		{"node over mu", []Path{path(0, 2, 4, 6), path(0, 2, 4, 8), path(0, 2, 6, 8), path(1, 2, 6, 8)}, r, ErrNodeMemory},
		// mu = 1: n_1*mu = 2, and stage 1 receives 3 (the stage cap is
		// checked before the node cap, which node 2 breaks too).
		{"stage over n_1*mu", []Path{path(0, 2, 4, 6), path(1, 3, 5, 7), path(0, 2, 6, 8)}, Rules{Stages: 6, Skip: 2, MaxJump: 3, MaxSwaps: 2, Mu: 1}, ErrStageLoad},
		// Floor 2: stages 1 and 3 get 2, stage 2 gets 1.
		{"stage under its floor", []Path{path(0, 2, 4, 6), path(0, 2, 6, 8)}, Rules{Stages: 6, Skip: 2, MaxJump: 3, MaxSwaps: 2, Mu: 3, MinStageLoad: 2}, ErrStageUnderload},
		{"stages 4 and 5 never visited", []Path{path(0, 2, 4, 6), path(1, 3, 5, 7)}, Rules{Stages: 6, Skip: 2, MaxJump: 3, MaxSwaps: 2, Mu: 3, MinStageLoad: 1}, ErrStageUnderload},
		{"every stage at its floor", []Path{path(0, 2, 4, 6), path(1, 3, 9, 11)}, Rules{Stages: 6, Skip: 2, MaxJump: 3, MaxSwaps: 2, Mu: 3, MinStageLoad: 1}, nil},
		{"bad rules", []Path{path(0, 2, 4, 6)}, Rules{Stages: 6, Skip: 6, MaxJump: 3, Mu: 3}, ErrConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(tt.paths, pl, tt.rules)
			if tt.want == nil && err != nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("Validate: %v, want %v", err, tt.want)
			}
		})
	}
}

// TestValidateThreeSwaps needs 7 stages: three disjoint neighbour swaps.
func TestValidateThreeSwaps(t *testing.T) {
	pl := Placement{Stages: 7, StageOf: []int{0, 1, 2, 3, 4, 5, 6}}
	p := Path{Nodes: []int{0, 2, 1, 4, 3, 6, 5}, Stages: []int{0, 2, 1, 4, 3, 6, 5}}
	r := Rules{Stages: 7, Skip: 0, MaxJump: 3, MaxSwaps: 2, Mu: 1}
	if err := Validate([]Path{p}, pl, r); !errors.Is(err, ErrSwaps) {
		t.Errorf("three swaps with MaxSwaps 2: %v", err)
	}
	r.MaxSwaps = 3
	if err := Validate([]Path{p}, pl, r); err != nil {
		t.Errorf("three swaps with MaxSwaps 3: %v", err)
	}
}

// TestValidateStageLoad: rule 6 follows from rule 7 (every path starts at
// a stage-0 node, so no more than n_1*mu paths exist while no node is over
// mu), so a stage over its cap always comes with a stage-0 node over mu;
// Validate reports the stage, the rule the paper states. One stage-0 node
// and mu = 2 give a cap of 2 microbatches per stage.
func TestValidateStageLoad(t *testing.T) {
	pl := Placement{Stages: 2, StageOf: []int{0, 1, 1}}
	r := Rules{Stages: 2, Skip: 0, MaxJump: 3, Mu: 2}
	paths := []Path{{Nodes: []int{0, 1}, Stages: []int{0, 1}}, {Nodes: []int{0, 2}, Stages: []int{0, 1}}}
	if err := Validate(paths, pl, r); err != nil {
		t.Fatal(err)
	}
	third := append(paths, Path{Nodes: []int{0, 2}, Stages: []int{0, 1}})
	if err := Validate(third, pl, r); !errors.Is(err, ErrStageLoad) {
		t.Errorf("Validate: %v, want ErrStageLoad", err)
	}
}
