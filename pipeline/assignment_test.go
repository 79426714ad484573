package pipeline

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

func testAssignment() Assignment {
	return Assignment{Epoch: 3, Start: 41, Stages: 3,
		Peers:   []string{"12D3KooWa", "12D3KooWb", "12D3KooWc", "12D3KooWd"},
		StageOf: []int{0, 1, 2, 2}, Since: []uint64{1, 1, 3, 2},
		Paths: []Path{{Nodes: []int{0, 1, 2}, Stages: []int{0, 1, 2}}, {Nodes: []int{0, 3}, Stages: []int{0, 2}}}}
}

func TestAssignmentRoundTrip(t *testing.T) {
	rotating := testAssignment()
	rotating.Paths = nil
	got, err := ParseAssignment(must(rotating.MarshalBinary()))
	if err != nil || !reflect.DeepEqual(got, rotating) {
		t.Fatalf("without paths: %+v, %v", got, err)
	}
	if p := got.PathsAt(RotatingSchedule{Microbatches: 2}, 1); len(p) != 2 {
		t.Fatalf("rotating paths %v", p)
	}
	a := testAssignment()
	if p := a.PathsAt(RotatingSchedule{Microbatches: 5}, 1); !reflect.DeepEqual(p, a.Paths) {
		t.Fatalf("scheduled paths %v, want the plan's %v", p, a.Paths)
	}
	b, err := a.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	got, err = ParseAssignment(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, a) {
		t.Fatalf("decoded %+v, want %+v", got, a)
	}
	if s := got.Survivors(2); !reflect.DeepEqual(s, []int{3}) {
		t.Fatalf("survivors of stage 2: %v, want [3] (node 2 is new this epoch)", s)
	}
	if got.Index("12D3KooWc") != 2 || got.Index("nobody") != -1 {
		t.Fatal("Index")
	}
}

func TestAssignmentValidate(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(a *Assignment)
	}{
		{"epoch 0", func(a *Assignment) { a.Epoch = 0 }},
		{"start 0", func(a *Assignment) { a.Start = 0 }},
		{"stage without members", func(a *Assignment) { a.StageOf[1] = 2 }},
		{"stage out of range", func(a *Assignment) { a.StageOf[3] = 3 }},
		{"duplicate peer", func(a *Assignment) { a.Peers[3] = a.Peers[0] }},
		{"empty peer", func(a *Assignment) { a.Peers[1] = "" }},
		{"since after epoch", func(a *Assignment) { a.Since[0] = 4 }},
		{"since 0", func(a *Assignment) { a.Since[0] = 0 }},
		{"lengths differ", func(a *Assignment) { a.Since = a.Since[:2] }},
		{"path to a node of another stage", func(a *Assignment) { a.Paths[1].Nodes[1] = 1 }},
		{"path not starting at stage 0", func(a *Assignment) { a.Paths[0] = Path{Nodes: []int{1}, Stages: []int{1}} }},
		{"empty path", func(a *Assignment) { a.Paths[0] = Path{} }},
		{"fewer members than stages", func(a *Assignment) {
			a.Peers, a.StageOf, a.Since = a.Peers[:2], a.StageOf[:2], a.Since[:2]
		}},
	} {
		a := testAssignment()
		c.edit(&a)
		if err := a.Validate(); !errors.Is(err, ErrBadAssignment) {
			t.Errorf("%s: %v, want ErrBadAssignment", c.name, err)
		}
		if _, err := a.MarshalBinary(); err == nil {
			t.Errorf("%s: encoded", c.name)
		}
	}
}

func TestParseAssignmentRejects(t *testing.T) {
	good, _ := testAssignment().MarshalBinary()
	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"header only", good[:assignmentHeader]},
		{"truncated", good[:len(good)-1]},
		{"trailing", append(append([]byte{}, good...), 0)},
		{"magic", append([]byte("XXXX"), good[4:]...)},
		{"huge count", func() []byte { b := append([]byte{}, good...); b[22], b[23] = 0xff, 0xff; return b }()},
	} {
		if _, err := ParseAssignment(c.b); !errors.Is(err, ErrBadAssignment) {
			t.Errorf("%s: %v, want ErrBadAssignment", c.name, err)
		}
	}
}

func FuzzAssignment(f *testing.F) {
	good, _ := testAssignment().MarshalBinary()
	f.Add(good)
	f.Add(good[:30])
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseAssignment(b)
		if err != nil {
			return
		}
		again, err := a.MarshalBinary()
		if err != nil {
			t.Fatalf("a decoded assignment does not encode: %v", err)
		}
		if string(again) != string(b) {
			t.Fatal("decode then encode changed the bytes")
		}
	})
}

// Every path RotatingSchedule emits obeys every rule, on random placements
// where stages hold different numbers of nodes (as Plan leaves them: no
// stage fewer than stage 0's), at every skip the rules allow, with and
// without random routing and CheckFree+.
func TestRotatingScheduleObeysRules(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for trial := range 2000 {
		S := 2 + rng.IntN(7)
		n0 := 1 + rng.IntN(3)
		var stageOf []int
		for s := range S {
			n := n0
			if s > 0 {
				n += rng.IntN(3)
			}
			for range n {
				stageOf = append(stageOf, s)
			}
		}
		rng.Shuffle(len(stageOf), func(i, j int) { stageOf[i], stageOf[j] = stageOf[j], stageOf[i] })
		pl := Placement{Stages: S, StageOf: stageOf}
		maxSkip := min(S-2, 3)
		skip := 0
		if maxSkip > 0 {
			skip = rng.IntN(maxSkip + 1)
		}
		M := n0 * (1 + rng.IntN(4))
		M = max(M, S-1)
		rs := RotatingSchedule{Microbatches: M, Skip: skip, Seed: uint64(trial), Random: rng.IntN(2) == 0,
			CheckFreePlus: skip == 0 && S >= 3 && rng.IntN(2) == 0}
		rules := Rules{Stages: S, Skip: skip, MaxJump: 3, MaxSwaps: 2, Mu: (M + n0 - 1) / n0}
		for iter := uint64(1); iter <= 3; iter++ {
			paths := rs.Paths(pl, iter)
			if err := Validate(paths, pl, rules); err != nil {
				t.Fatalf("trial %d (S=%d, placement %v, %+v, iteration %d): %v\n%v", trial, S, stageOf, rs, iter, err, fmt.Sprint(paths))
			}
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}
