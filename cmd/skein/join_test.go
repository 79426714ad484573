package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
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
	// LAN timers: the fast ones suspect members that are merely starved of
	// CPU when other test packages run beside this one.
	loop := []string{"--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--listen", "/ip4/127.0.0.1/tcp/0", "--timing", "lan"}
	ctx, dir, bin, addr := startBootstrap(t, loop)

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

// TestLateJoinerAdoptsRunState: two volunteers train; a third joins after
// their second round, downloads the run's state, takes part in one round
// (or, when it is too slow for them, takes their state after it) and
// leaves; all three agree on that round's state, and the two go on without
// it and still agree. Its arrival mid-run is what makes the members' views
// of the membership differ at a round's start (DESIGN.md, node).
func TestLateJoinerAdoptsRunState(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs four processes")
	}
	net := []string{"--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--timing", "lan"}
	ctx, dir, bin, addr := startBootstrap(t, net)
	join := func(name string, rounds, minPeers int) *exec.Cmd {
		args := append([]string{"--log-level", logLevel(), "node", "join", "--bootstrap", addr, "--data-dir", filepath.Join(dir, name),
			"--batch", "2", "--seq-len", "32", "--inner-steps", "4", "--rounds", fmt.Sprint(rounds),
			"--min-peers", fmt.Sprint(minPeers), "--threads", "1"}, net...)
		return dumpOnTimeout(exec.CommandContext(ctx, bin, args...))
	}
	re := regexp.MustCompile(`(?m)^round (\d+): .*\(state ([0-9a-f]{16})\)`)
	states := func(out []byte) map[string]string {
		m := map[string]string{}
		for _, g := range re.FindAllSubmatch(out, -1) {
			m[string(g[1])] = string(g[2])
		}
		return m
	}
	// a and b write to files; the test polls a's for its second round.
	aLog, bLog := filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")
	start := func(c *exec.Cmd, path string) {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		c.Stdout, c.Stderr = f, f
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	a, b := join("a", 12, 2), join("b", 12, 2)
	start(a, aLog)
	start(b, bLog)
	for {
		out, _ := os.ReadFile(aLog)
		if len(states(out)) >= 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("volunteer a did not reach round 2:\n%s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cOut, cErr := join("c", 1, 1).CombinedOutput()
	if cErr != nil {
		a.Process.Kill()
		b.Process.Kill()
	}
	errA, errB := a.Wait(), b.Wait()
	aOut, _ := os.ReadFile(aLog)
	bOut, _ := os.ReadFile(bLog)
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\n--- a:\n%s\n--- b:\n%s\n--- c:\n%s", append(args, aOut, bOut, cOut)...)
	}
	if cErr != nil {
		fail("late joiner: %v", cErr)
	}
	if errA != nil || errB != nil {
		fail("a: %v, b: %v", errA, errB)
	}
	// c reports one round: one it trained in, or one the others finished
	// while it was too slow for them (then it took their state). Either way
	// its state after that round is theirs.
	as, bs2, cs := states(aOut), states(bOut), states(cOut)
	if len(cs) != 1 {
		fail("late joiner reported %d rounds", len(cs))
	}
	for r, h := range cs {
		if r == "1" || r == "2" {
			fail("late joiner ran round %s: it did not adopt the run's state", r)
		}
		if as[r] != h || bs2[r] != h {
			fail("round %s: c %s, a %s, b %s", r, h, as[r], bs2[r])
		}
	}
	if as["12"] == "" || as["12"] != bs2["12"] {
		fail("after c left, a and b disagree or stopped: a %v, b %v", as, bs2)
	}
}

// dumpOnTimeout makes a command that outlives the test's context quit with
// SIGQUIT, so that its output ends with every goroutine's stack: a stalled
// volunteer then shows where it waits.
func dumpOnTimeout(c *exec.Cmd) *exec.Cmd {
	c.Cancel = func() error { return c.Process.Signal(syscall.SIGQUIT) }
	c.WaitDelay = 5 * time.Second
	return c
}

// startBootstrap builds the binary, starts `skein bootstrap` with the
// network flags, and returns a 2-minute context for the test's processes,
// the test directory, the binary and the bootstrap's full multiaddr. The
// bootstrap is stopped when the test ends.
func startBootstrap(t *testing.T, netFlags []string) (ctx context.Context, dir, bin, addr string) {
	t.Helper()
	dir = t.TempDir()
	bin = filepath.Join(dir, "skein")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	bs := exec.CommandContext(ctx, bin, append([]string{"--log-level", "warn", "bootstrap", "--data-dir", filepath.Join(dir, "bs")}, netFlags...)...)
	stdout, _ := bs.StdoutPipe()
	if err := bs.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bs.Process.Signal(os.Interrupt); bs.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("bootstrap printed no address: %v", err)
	}
	addr = strings.TrimSpace(line)
	if !strings.Contains(addr, "/p2p/") {
		t.Fatalf("bootstrap address %q has no peer ID", addr)
	}
	return ctx, dir, bin, addr
}
