package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skein-ml/skein/bootstrap/status"
)

// `skein demo --stages 3` end to end, as processes: a bootstrap with a
// staged manifest places six `skein node join` volunteers in 3 stages of 2,
// stage 2's volunteers are killed -9 halfway, two new volunteers join, the
// bootstrap re-plans and the stage is rebuilt by CheckFree+ from its
// neighbour's weights, trains a round again, and the demo prints the
// summary; no child outlives it.
func TestStagedDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a bootstrap and eight volunteers")
	}
	d := startDemoWith(t, "--stages", "3", "--steps", "30")
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the demo failed: %v; its output:\n%s", err, d.out)
		}
	case <-time.After(4 * time.Minute):
		t.Fatalf("the demo did not end in 4 minutes; its output:\n%s", d.out)
	}
	out := d.out.String()
	t.Logf("output:\n%s", out)
	for _, want := range []string{
		"status page: http://127.0.0.1:",
		"3 stages x 2 replicas",
		"visiting 2 of 3 stages",
		"stage 2 lost: kill -9 volunteer-",
		"stage 2 was lost: rebuilt by CheckFree+ as a copy of stage 1",
		"finished its first round in the rebuilt stage",
		"summary after",
		"train loss",
		"MB (activations, gradients",
		"stages: 0: ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the output", want)
		}
	}
	waitNoProcesses(t, d.dir, 10*time.Second)
	// The bootstrap's history: the stage's volunteers failed, the new ones
	// joined.
	st, err := status.Open(filepath.Join(d.dir, "bootstrap", "history.db"), status.DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	kinds := map[string]int{}
	for _, e := range st.Events(100) {
		kinds[e.Kind]++
	}
	if kinds["join"] < 8 || kinds["fail"] < 2 {
		t.Errorf("membership events %v: want 6 + 2 joins and 2 failures", kinds)
	}
}

// `skein demo --hostile staged-grad` and `--hostile checkfree-norm` end
// to end: the mode brings a 3-stage run (no --stages given), a hostile
// volunteer joins beside the six honest ones, a stage without it is lost
// and rebuilt, and the demo checks the run's invariants itself (it fails
// if one broke) and prints them; no child outlives it. CI runs
// checkfree-norm (the relay's refusals have TestRelayHostileSwarm);
// SKEIN_ALL_SOAKS=1 runs both.
func TestStagedDemoHostile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a bootstrap and seven volunteers")
	}
	modes := []string{"checkfree-norm"}
	if os.Getenv("SKEIN_ALL_SOAKS") != "" {
		modes = append(modes, "staged-grad")
	}
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			d := startDemoWith(t, "--hostile", mode, "--steps", "30")
			done := make(chan error, 1)
			go func() { done <- d.cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the demo failed: %v; its output:\n%s", err, d.out)
				}
			case <-time.After(6 * time.Minute):
				t.Fatalf("the demo did not end in 6 minutes; its output:\n%s", d.out)
			}
			out := d.out.String()
			t.Logf("output:\n%s", out)
			for _, want := range []string{"3 stages x 2 replicas", "starting a hostile volunteer (" + mode, "hostile: " + mode, "invariants:"} {
				if !strings.Contains(out, want) {
					t.Errorf("no %q in the output", want)
				}
			}
			if strings.Count(out, "  ok   ") != 6 || strings.Contains(out, "FAIL") {
				t.Errorf("invariants:\n%s", out)
			}
			waitNoProcesses(t, d.dir, 10*time.Second)
		})
	}
}

// Settings a staged demo cannot run are refused before anything starts,
// with what is wrong.
func TestStagedDemoRefusesBadSettings(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--stages", "1"}, "needs 2 or more"},
		{[]string{"--stages", "9"}, "pipeline.stages = 9"},
		{[]string{"--stages", "3", "--skip-ratio", "0.7"}, "pipeline.skip_ratio"},
		{[]string{"--stages", "3", "--fail-stage", "7"}, "--fail-stage 7"},
		{[]string{"--stages", "3", "--recovery", "random"}, "flag provided but not defined: -recovery"},
		{[]string{"--stages", "3", "--chaos"}, "--chaos applies to the data-parallel demo"},
		{[]string{"--stages", "3", "--optimizer", "noloco"}, `--optimizer "noloco": a staged run's volunteers average`},
		{[]string{"--stages", "3", "--optimizer", "sgd"}, `--optimizer "sgd"`},
		{[]string{"--stages", "3", "--hostile", "scale"}, "--hostile scale attacks a run that is not staged"},
		{[]string{"--stages", "3", "--hostile", "noloco-jump"}, "--hostile noloco-jump attacks a run that is not staged"},
		{[]string{"--stages", "0", "--hostile", "staged-grad"}, "--hostile staged-grad attacks a staged run"},
		{[]string{"--hostile", "checkfree-norm", "--chaos"}, "--chaos applies to the data-parallel demo"},
		{[]string{"--hostile", "checkfree-norm", "--hostile-count", "6"}, "the hostile ones must be fewer"},
		{[]string{"--device", "tpu"}, `--device "tpu": want auto, cpu or cuda:N`},
		{[]string{"--support-k", "0"}, "--support-k 0: want 1..4096"}, // a support's setting asks for one
		{[]string{"--outer", "sparse"}, `--outer "sparse"`},
		{[]string{"--optimizer", "noloco", "--outer", "support"}, "wire.outer"},
		{[]string{"--stages", "3", "--outer", "support"}, "wire.outer"},
		{[]string{"--stages", "3", "--device", "cuda:0,bf16"}, `unknown option "bf16"`},
	} {
		dir := t.TempDir()
		var out bytes.Buffer
		app := newApp()
		app.Writer, app.ErrWriter = &out, &out
		err := app.Run(append([]string{"skein", "demo", "--dir", dir}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %q", tc.args, err, tc.want)
		}
		if entries, _ := os.ReadDir(dir); len(entries) > 0 {
			t.Errorf("%v: the refused demo wrote %d files in its directory", tc.args, len(entries))
		}
	}
}
