package bootstrap

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/pipeline"
)

func testVolunteers(names ...string) []volunteer {
	var out []volunteer
	for _, n := range names {
		out = append(out, volunteer{id: "12D3KooW" + n, meta: p2p.Meta{Role: p2p.RoleVolunteer}})
	}
	return out
}

// The placement of a staged run as the bootstrap makes it: the first plan
// places everyone from iteration 1; a re-plan after a member left keeps
// every other member in its stage (and its Since), starts after the run's
// iteration and never before the previous plan's start, hands the lost
// stage to the newcomer and notes on the status page how it is rebuilt;
// a newcomer that never took its stage (it still announces none) is new
// to it in the next plan too, so that it rebuilds the stage instead of
// being waited on as a survivor; too few volunteers is a wait, not a plan.
func TestStagePlannerPlans(t *testing.T) {
	m := manifest.Default()
	m.Pipeline = manifest.Pipeline{Stages: 4, Microbatches: 2}
	p, err := newStagePlanner(m, nil, slog.New(slog.DiscardHandler), io.Discard, DefaultPlanTiming())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.plan(nil, testVolunteers("a", "b", "c"), 0); err == nil || !strings.Contains(err.Error(), "3 of the 4") {
		t.Fatalf("three volunteers for four stages: %v", err)
	}
	first, err := p.plan(nil, testVolunteers("a", "b", "c", "d"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if first.Epoch != 1 || first.Start != 1 || len(first.Peers) != 4 {
		t.Fatalf("first plan %+v", first)
	}
	// The plan carries SchedulePaths' schedule: every microbatch, every rule.
	rules := pipeline.Rules{Stages: 4, MaxJump: 3, MaxSwaps: 2, Mu: 2, MinStageLoad: 1}
	if len(first.Paths) != 2 {
		t.Fatalf("the plan's paths %v, want the manifest's 2 microbatches", first.Paths)
	}
	if err := pipeline.Validate(first.Paths, first.Placement(), rules); err != nil {
		t.Fatal(err)
	}
	stage := map[string]int{}
	for i, id := range first.Peers {
		stage[id] = first.StageOf[i]
	}
	// The member of stage 2 leaves; e joins. The others announce their
	// stages, e none.
	var vols []volunteer
	for _, v := range testVolunteers("a", "b", "c", "d", "e") {
		s, ok := stage[v.id]
		if ok && s == 2 {
			continue
		}
		v.meta.Stage = -1
		if ok {
			v.meta.Stage = int16(s)
		}
		vols = append(vols, v)
	}
	second, err := p.plan(&first, vols, 40)
	if err != nil {
		t.Fatal(err)
	}
	if second.Epoch != 2 || second.Start <= 41 {
		t.Fatalf("re-plan epoch %d from iteration %d, want epoch 2 after iteration 40", second.Epoch, second.Start)
	}
	for i, id := range second.Peers {
		if s, ok := stage[id]; ok {
			if second.StageOf[i] != s || second.Since[i] != 1 {
				t.Errorf("%s moved from stage %d to %d (since %d)", id, s, second.StageOf[i], second.Since[i])
			}
		} else if second.StageOf[i] != 2 || second.Since[i] != 2 {
			t.Errorf("newcomer %s in stage %d since %d, want the lost stage 2 since 2", id, second.StageOf[i], second.Since[i])
		}
	}
	if got := second.Survivors(2); len(got) != 0 {
		t.Fatalf("stage 2's survivors %v", got)
	}
	if note := p.rebuilt[2]; !strings.Contains(note, "CheckFree from stages 1 and 3") {
		t.Fatalf("status note %q", note)
	}
	third, err := p.plan(&second, vols, 3) // the members' announcements lag
	if err != nil {
		t.Fatal(err)
	}
	if third.Start < second.Start {
		t.Fatalf("plan 3 starts at %d, before plan 2's %d", third.Start, second.Start)
	}
	if _, err := pipeline.ParseAssignment(must(third.MarshalBinary())); err != nil {
		t.Fatal(err)
	}
	e := vols[len(vols)-1]
	if i := third.Index(e.id); i < 0 || third.StageOf[i] != 2 || third.Since[i] != 3 || len(third.Survivors(2)) != 0 {
		t.Fatalf("plan 3: e, which never took stage 2, at %d; stage 2's survivors %v", i, third.Survivors(2))
	}
	vols[len(vols)-1].meta.Stage = 2 // e took it
	fourth, err := p.plan(&third, vols, 3)
	if err != nil {
		t.Fatal(err)
	}
	if i := fourth.Index(e.id); i < 0 || fourth.Since[i] != 3 {
		t.Fatalf("plan 4: e, which announces stage 2, is not its survivor since plan 3: %+v", fourth)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(fmt.Sprint(err))
	}
	return b
}

// A volunteer Plan leaves unassigned (too little memory for any stage) is
// not a reason to plan again and again: the planner re-plans when the
// volunteers change, not while its plan leaves one out.
func TestStagePlannerSettles(t *testing.T) {
	m := manifest.Default()
	m.Pipeline = manifest.Pipeline{Stages: 2, Microbatches: 2}
	p, err := newStagePlanner(m, nil, slog.New(slog.DiscardHandler), io.Discard, DefaultPlanTiming())
	if err != nil {
		t.Fatal(err)
	}
	vols := testVolunteers("a", "b", "c")
	vols[2].meta.CapMemMiB = 1 // fits no stage
	p.list = func() []volunteer { return vols }
	t0 := time.Now()
	for s := range 20 {
		p.step(t0.Add(time.Duration(s) * time.Second))
	}
	if p.cur == nil || p.cur.Epoch != 1 || len(p.cur.Peers) != 2 {
		t.Fatalf("plan %+v: want one plan of the two volunteers that fit", p.cur)
	}
	vols = vols[:2]
	for s := 20; s < 30; s++ {
		p.step(t0.Add(time.Duration(s) * time.Second))
	}
	if p.cur.Epoch != 2 {
		t.Fatalf("epoch %d after the spare left, want 2 (one re-plan)", p.cur.Epoch)
	}
}
