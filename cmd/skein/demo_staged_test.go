package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/skein-ml/skein/bootstrap/status"
)

// `skein demo --stages 3` end to end, in this process: six libp2p nodes on
// loopback through the WAN emulator train the staged model, stage 2's nodes
// are killed after step 10 and replaced, CheckFree+ rebuilds the stage from
// weights fetched over the network, training goes on, and the summary
// compares the simulator's prediction with the measured times.
func TestStagedDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a staged demo over libp2p")
	}
	var out bytes.Buffer
	app := newApp()
	app.Writer = &out
	dir := t.TempDir()
	err := app.Run([]string{"skein", "demo", "--stages", "3", "--steps", "20", "--inner-steps", "5", "--latency", "5ms", "--rate", "200",
		"--http", "127.0.0.1:0", "--dir", dir})
	t.Logf("output:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`run "skein-staged-demo": manifest `,
		"status page: http://127.0.0.1:",
		"3 stages x 2 replicas = 6 libp2p nodes",
		"visits 2 of 3 stages",
		"step 10: stage 2 lost: its 2 node(s) killed",
		"stage 2 rebuilt by CheckFree+ as a copy of its swap partner, stage 1 (weights fetched over the network)",
		"step 20: validation loss",
		"summary: validation loss",
		"MB of activations and gradients on the wire",
		"simulator vs measured",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in the output", want)
		}
	}
	// The status page's history: a report from every node each round,
	// with the validation loss, and the stage's replacement on the
	// membership timeline.
	st, err := status.Open(filepath.Join(dir, "history.db"), status.DefaultStoreConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rounds, err := st.History(0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(rounds) != 4 || rounds[3].Reporters != 6 || rounds[3].ValLoss == nil || !(*rounds[3].ValLoss < *rounds[0].ValLoss) {
		t.Fatalf("history %+v: want 4 rounds of 6 reports with a falling validation loss", rounds)
	}
	kinds := map[string]int{}
	for _, e := range st.Events(100) {
		kinds[e.Kind]++
	}
	if kinds["join"] != 8 || kinds["fail"] != 2 {
		t.Fatalf("membership events %v: want 6 + 2 joins and 2 failures", kinds)
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
		{[]string{"--stages", "3", "--fail-stage", "7", "--steps", "40"}, "stage 7"},
		{[]string{"--stages", "3", "--recovery", "pray", "--steps", "40"}, `recovery "pray"`},
		{[]string{"--stages", "3", "--chaos"}, "--chaos applies to the data-parallel demo"},
		{[]string{"--stages", "3", "--optimizer", "sgd"}, `--optimizer "sgd"`},
	} {
		var out bytes.Buffer
		app := newApp()
		app.Writer = &out
		err := app.Run(append([]string{"skein", "demo"}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}
