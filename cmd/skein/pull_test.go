package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// `skein node pull` downloads the round the bootstrap countersigned from
// the volunteers training it: the checkpoint's state is the one they
// reported for that round, and eval and export take it.
func TestNodePull(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs four processes")
	}
	net := []string{"--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--timing", "lan"}
	// Rounds of 40 steps (a few hundred ms): a pull takes the state a
	// round's certificate names, and volunteers serve only their latest
	// state and the one before, so rounds much shorter than a
	// certificate's gossip plus a download could leave nothing to pull.
	// (With 4-step rounds, under 100 ms, it failed 2 runs in 3 when
	// volunteers served only their latest; it passed 6 in 6, 3 of them
	// with both cores busy, once they served the one before too.)
	run := startBootstrap(t, strings.Replace(smallRun, "inner_steps = 4", "inner_steps = 40", 1), net)
	ctx, dir, bin, addr := run.ctx, run.dir, run.bin, run.addr
	var logs []string
	for _, name := range []string{"a", "b"} {
		c := run.join(name, 1000, 2, net)
		for i, a := range c.Args[:len(c.Args)-1] {
			if a == "--inner-steps" {
				c.Args[i+1] = "40" // the run's, above
			}
		}
		path := filepath.Join(dir, name+".log")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		c.Stdout, c.Stderr = f, f
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		logs = append(logs, path)
	}
	out := filepath.Join(dir, "pulled.safetensors")
	pull, err := exec.CommandContext(ctx, bin, append([]string{"--log-level", "warn", "node", "pull", "--bootstrap", addr,
		"--out", out, "--wait", "90s"}, net...)...).CombinedOutput()
	aLog, _ := os.ReadFile(logs[0])
	if err != nil {
		t.Fatalf("pull: %v\n%s\n--- a:\n%s", err, pull, aLog)
	}
	m := regexp.MustCompile(`pulled round (\d+) \(state ([0-9a-f]{16})\)`).FindSubmatch(pull)
	if m == nil {
		t.Fatalf("pull said:\n%s", pull)
	}
	// a reported that round with that state (it may have to catch up on
	// its log first).
	want := regexp.MustCompile(fmt.Sprintf(`(?m)^round %s: .*\(state %s\)`, m[1], m[2]))
	for deadline := time.Now().Add(30 * time.Second); !want.Match(aLog); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no volunteer reported round %s with state %s:\n%s", m[1], m[2], aLog)
		}
		aLog, _ = os.ReadFile(logs[0])
	}
	text := filepath.Join(dir, "text.txt")
	os.WriteFile(text, []byte(strings.Repeat("func main() { fmt.Println(\"hello\") }\n", 20)), 0o644)
	ev, err := exec.CommandContext(ctx, bin, "eval", "--checkpoint", out, "--data", text, "--device", "cpu").Output()
	if err != nil || !regexp.MustCompile(`^loss \d+\.\d{4}\nperplexity \d+\.\d{4}\n$`).Match(ev) {
		t.Fatalf("eval of the pulled checkpoint (err %v): %q", err, ev)
	}
	if ex, err := exec.CommandContext(ctx, bin, "export", "--checkpoint", out, "--out", filepath.Join(dir, "hf")).CombinedOutput(); err != nil {
		t.Fatalf("export: %v\n%s", err, ex)
	}
}
