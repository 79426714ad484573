package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBootstrapAndVolunteersTrainTogether runs the real binary: a bootstrap
// and three `skein node join` processes on loopback train two DiLoCo rounds
// and must report the same state hash after each round.
func TestBootstrapAndVolunteersTrainTogether(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs four processes")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "skein")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// LAN timers: the fast ones suspect members that are merely starved of
	// CPU when other test packages run beside this one.
	loop := []string{"--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--listen", "/ip4/127.0.0.1/tcp/0", "--timing", "lan"}
	bs := exec.CommandContext(ctx, bin, append([]string{"--log-level", "warn", "bootstrap", "--data-dir", filepath.Join(dir, "bs")}, loop...)...)
	stdout, _ := bs.StdoutPipe()
	if err := bs.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { bs.Process.Signal(os.Interrupt); bs.Wait() }()
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("bootstrap printed no address: %v", err)
	}
	addr = strings.TrimSpace(addr)
	if !strings.Contains(addr, "/p2p/") {
		t.Fatalf("bootstrap address %q has no peer ID", addr)
	}

	const volunteers, rounds = 3, 2
	hashes := make([][]string, volunteers)
	var wg sync.WaitGroup
	errs := make([]error, volunteers)
	outs := make([]string, volunteers)
	re := regexp.MustCompile(`round (\d+): .*\(state ([0-9a-f]{16})\)`)
	for i := 0; i < volunteers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := append([]string{"--log-level", logLevel(), "node", "join", "--bootstrap", addr,
				"--data-dir", filepath.Join(dir, "n", string(rune('a'+i))), "--batch", "2", "--seq-len", "32",
				"--inner-steps", "4", "--rounds", "2", "--min-peers", "3", "--threads", "1"}, loop[:2]...)
			args = append(args, loop[4:]...)
			out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
			outs[i] = string(out)
			errs[i] = err
			for _, m := range re.FindAllStringSubmatch(string(out), -1) {
				hashes[i] = append(hashes[i], m[2])
			}
			if err != nil || len(hashes[i]) != rounds {
				t.Logf("volunteer %d output:\n%s", i, out)
			}
		}()
	}
	wg.Wait()
	for i := range errs {
		if errs[i] != nil {
			t.Fatalf("volunteer %d: %v", i, errs[i])
		}
		if len(hashes[i]) != rounds {
			t.Fatalf("volunteer %d reported %d rounds, want %d", i, len(hashes[i]), rounds)
		}
		for r := range hashes[i] {
			if hashes[i][r] != hashes[0][r] {
				for j, o := range outs {
					t.Logf("volunteer %d output:\n%s", j, o)
				}
				t.Fatalf("round %d: volunteer %d state %s, volunteer 0 state %s", r+1, i, hashes[i][r], hashes[0][r])
			}
		}
	}
	// A volunteer restarted on its data dir resumes its checkpoint.
	out, err := exec.CommandContext(ctx, bin, "--log-level", "warn", "node", "join", "--bootstrap", addr,
		"--data-dir", filepath.Join(dir, "n", "a"), "--batch", "2", "--seq-len", "32", "--inner-steps", "2",
		"--rounds", "1", "--threads", "1", "--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--timing", "lan").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "resumed local checkpoint at round 2") {
		t.Fatalf("restart did not resume (err %v):\n%s", err, out)
	}
}

// logLevel lets SKEIN_TEST_LOG=debug show the volunteers' logs on failure.
func logLevel() string {
	if l := os.Getenv("SKEIN_TEST_LOG"); l != "" {
		return l
	}
	return "warn"
}
