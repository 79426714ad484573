package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/skein-ml/skein/bootstrap/status"
	"github.com/skein-ml/skein/data"
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
	root, err := data.GoRoot()
	if err != nil {
		t.Skip(err)
	}
	goSrc := filepath.Join(root, "src")
	run := startBootstrap(t, shardedRun, append([]string{"--corpus", filepath.Join(goSrc, "strings"),
		"--corpus", filepath.Join(goSrc, "bufio")}, loop...))
	ctx, dir, bin, addr := run.ctx, run.dir, run.bin, run.addr

	const volunteers, rounds = 3, 2
	// The manifest alone: no run-wide setting on the command line.
	outs := trainTogether(t, run, volunteers, rounds, append(loop[:2], loop[4:]...))
	for i, o := range outs {
		if !strings.Contains(o, "fetching the run's corpus") {
			t.Fatalf("volunteer %d did not fetch the corpus shards:\n%s", i, o)
		}
	}
	// The status API saw every round: the validation loss fell, and every
	// volunteer agrees with the majority's state hash.
	snap := waitForStatus(t, run, func(s status.Snapshot) bool { return s.Round == rounds && len(s.Curve) == rounds })
	first, last := snap.Curve[0].Val, snap.Curve[rounds-1].Val
	if first == nil || last == nil || !(*last < *first) {
		t.Fatalf("validation loss did not fall: curve %+v", snap.Curve)
	}
	vols := 0
	for _, m := range snap.Members {
		if m.Role == "volunteer" {
			vols++
			if m.Agreement != status.Agree || m.Round != rounds {
				t.Fatalf("member %s: round %d, agreement %q; want round %d, agree", m.Peer, m.Round, m.Agreement, rounds)
			}
		}
	}
	if vols != volunteers {
		t.Fatalf("status shows %d volunteers, want %d: %+v", vols, volunteers, snap.Members)
	}

	// `skein status` prints the same from the terminal.
	out, err := exec.CommandContext(ctx, bin, "status", strings.TrimPrefix(run.http, "http://")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "skein-demo") || !strings.Contains(string(out), "agree") {
		t.Fatalf("skein status (err %v):\n%s", err, out)
	}

	// A restarted bootstrap still has the history.
	run.stop()
	run.start(t)
	snap = waitForStatus(t, run, func(s status.Snapshot) bool { return len(s.Curve) == rounds })
	if snap.TokensTrained == 0 || snap.Reports < uint64(volunteers*rounds) {
		t.Fatalf("history lost across a bootstrap restart: %d tokens, %d reports", snap.TokensTrained, snap.Reports)
	}
	addr = run.addr

	// A volunteer whose settings disagree with the manifest is refused,
	// with the field's name.
	out, err = exec.CommandContext(ctx, bin, "--log-level", "warn", "node", "join", "--bootstrap", addr,
		"--data-dir", filepath.Join(dir, "n", "x"), "--preset", "small", "--inner-steps", "4",
		"--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--timing", "lan").CombinedOutput()
	if err == nil || !strings.Contains(string(out), `model.preset: this volunteer says "small", the run says "tiny"`) {
		t.Fatalf("mismatched volunteer not refused with the field's name (err %v):\n%s", err, out)
	}

	// A volunteer restarted on its data dir resumes its checkpoint; a shard
	// corrupted on its disk meanwhile is fetched again, never used.
	shards, _ := filepath.Glob(filepath.Join(dir, "n", "a", "shards", "*.shard"))
	if len(shards) < 2 {
		t.Fatalf("volunteer a holds %d shards, want several", len(shards))
	}
	f, err := os.OpenFile(shards[1], os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("corrupt"), 100)
	f.Close()
	out, err = exec.CommandContext(ctx, bin, "--log-level", "warn", "node", "join", "--bootstrap", addr,
		"--data-dir", filepath.Join(dir, "n", "a"), "--batch", "2", "--seq-len", "32",
		"--rounds", "1", "--threads", "1", "--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--timing", "lan").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "resumed local checkpoint at round 2") {
		t.Fatalf("restart did not resume (err %v):\n%s", err, out)
	}
	if !strings.Contains(string(out), "fetching the run's corpus: 1 of") {
		t.Fatalf("the corrupted shard was not fetched again:\n%s", out)
	}
	// ... and the restarted bootstrap's page shows it reporting again.
	waitForStatus(t, run, func(s status.Snapshot) bool { return len(s.Curve) == rounds+1 })
}

// waitForStatus polls the run's status API until ok or the test's context
// ends, and returns the last snapshot.
func waitForStatus(t *testing.T, r *testRun, ok func(status.Snapshot) bool) status.Snapshot {
	t.Helper()
	var last status.Snapshot
	var err error
	for r.ctx.Err() == nil {
		if last, err = status.Fetch(r.ctx, r.http); err == nil && ok(last) {
			return last
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("status never became as expected (last error %v): %+v", err, last)
	return last
}

// roundState matches a volunteer's round line: the round and its state hash.
var roundState = regexp.MustCompile(`(?m)^round (\d+): .*\(state ([0-9a-f]{16})\)`)

// trainTogether runs n volunteers of run for the given rounds (extra:
// more flags for each) and checks that they report the same state hash
// after every round; it returns their outputs.
func trainTogether(t *testing.T, run *testRun, n, rounds int, extra []string) []string {
	t.Helper()
	hashes := make([][]string, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	outs := make([]string, n)
	re := roundState
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := append([]string{"--log-level", logLevel(), "node", "join", "--bootstrap", run.addr,
				"--data-dir", filepath.Join(run.dir, "n", string(rune('a'+i))), "--rounds", strconv.Itoa(rounds),
				"--min-peers", strconv.Itoa(n), "--threads", "1"}, extra...)
			out, err := exec.CommandContext(run.ctx, run.bin, args...).CombinedOutput()
			outs[i], errs[i] = string(out), err
			for _, m := range re.FindAllStringSubmatch(string(out), -1) {
				hashes[i] = append(hashes[i], m[2])
			}
		}()
	}
	wg.Wait()
	fail := func(format string, args ...any) {
		t.Helper()
		for j, o := range outs {
			t.Logf("volunteer %d output:\n%s", j, o)
		}
		t.Fatalf(format, args...)
	}
	for i := range errs {
		if errs[i] != nil {
			fail("volunteer %d: %v", i, errs[i])
		}
		if len(hashes[i]) != rounds {
			fail("volunteer %d reported %d rounds, want %d", i, len(hashes[i]), rounds)
		}
		for r := range hashes[i] {
			if hashes[i][r] != hashes[0][r] {
				fail("round %d: volunteer %d state %s, volunteer 0 state %s", r+1, i, hashes[i][r], hashes[0][r])
			}
		}
	}
	return outs
}

// TestDelayedVolunteersAgree: with the one-step-delayed outer step (each
// round's all-reduce runs during the next inner phase) three volunteers
// still end every round with the same state, and the status page's
// validation loss falls.
func TestDelayedVolunteersAgree(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs four processes")
	}
	net := []string{"--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--timing", "lan"}
	run := startBootstrap(t, strings.Replace(smallRun, "inner_steps = 4", "inner_steps = 4\ndelayed = true", 1), net)
	const rounds = 4
	outs := trainTogether(t, run, 3, rounds, net)
	if !strings.Contains(outs[0], "round 1 started; its result lands during the next inner phase") {
		t.Fatalf("volunteer 0 did not run delayed rounds:\n%s", outs[0])
	}
	snap := waitForStatus(t, run, func(s status.Snapshot) bool { return len(s.Curve) >= rounds })
	first, last := snap.Curve[0].Val, snap.Curve[rounds-1].Val
	if first == nil || last == nil || !(*last < *first) {
		t.Fatalf("validation loss did not fall: curve %+v", snap.Curve)
	}
}

// TestSupportVolunteersAgree: with a shared support on the wire, 1536 of
// every 4096 coordinates a round as signs, three volunteers end every
// round with the same state, send a fraction of the dense exchange's bits
// per parameter, and the status page's validation loss falls and shows the
// bits. Two rules: plain coordinates with a scale per 1024, residual decay
// 0.5 and outer SGD; and the demo's --outer support, rotated coordinates
// (every member must rotate back to the same bits) with a scale per 256,
// no residual and the outer momentum.
func TestSupportVolunteersAgree(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs four processes")
	}
	for _, tc := range []struct {
		name, optimizer, wire string
		residual              bool // a residual carries between rounds (decay > 0)
	}{
		{"plain", "outer_lr = 2\nouter_momentum = 0", "residual_decay = 0.5\nblock_size = 1024\n", true},
		{"rotated, tiled (the demo's)", "outer_lr = 1.87\nouter_momentum = 0.9", "residual_decay = 0\nblock_size = 256\nrotate = true\ntiled = true\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) { testSupportVolunteers(t, tc.optimizer, tc.wire, tc.residual) })
	}
}

func testSupportVolunteers(t *testing.T, optimizer, wire string, residual bool) {
	net := []string{"--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--timing", "lan"}
	toml := strings.Replace(smallRun, "inner_steps = 4", "inner_steps = 4\n"+optimizer, 1) +
		"[wire]\ncodec = \"sign\"\nouter = \"support\"\nsupport_k = 1536\n" + wire
	run := startBootstrap(t, toml, net)
	const rounds = 4
	outs := trainTogether(t, run, 3, rounds, net)
	re := regexp.MustCompile(`bits/param ([0-9.]+)`)
	for i, o := range outs {
		ms := re.FindAllStringSubmatch(o, -1)
		if len(ms) != rounds {
			t.Fatalf("volunteer %d: %d round lines with bits/param, want %d:\n%s", i, len(ms), rounds, o)
		}
		// A dense minmax8 round sends about 18 bits per parameter (two
		// owners per part, aggregates back); the support's signs send
		// 1536/4096 x 1.03/8.25 = 5% of it plus the run's gossip,
		// certificates and telemetry.
		if b, _ := strconv.ParseFloat(ms[rounds-1][1], 64); !(b > 0 && b < maxSupportBits) {
			t.Fatalf("volunteer %d: %v bits/param in its last round, want under %v:\n%s", i, b, maxSupportBits, o)
		}
	}
	snap := waitForStatus(t, run, func(s status.Snapshot) bool { return len(s.Curve) >= rounds && s.BitsPerParam != nil })
	first, last := snap.Curve[0].Val, snap.Curve[rounds-1].Val
	if first == nil || last == nil || !(*last < *first) {
		t.Fatalf("validation loss did not fall: curve %+v", snap.Curve)
	}
	if b := *snap.BitsPerParam; !(b > 0 && b < maxSupportBits) {
		t.Fatalf("status page: %v bits/param, want under %v", b, maxSupportBits)
	}
	// Restarted on its data dir, a volunteer resumes what it had not sent;
	// without decay nothing carries between rounds, and nothing is saved.
	dataDir := filepath.Join(run.dir, "n", "a")
	residualPath := filepath.Join(dataDir, "volunteer.safetensors.residual")
	if _, err := os.Stat(residualPath); (err == nil) != residual {
		t.Fatalf("residual file %s: %v, want saved = %v", residualPath, err, residual)
	}
	out, err := exec.CommandContext(run.ctx, run.bin, append([]string{"--log-level", "warn", "node", "join", "--bootstrap", run.addr,
		"--data-dir", dataDir, "--rounds", "1", "--threads", "1"}, net...)...).CombinedOutput()
	if err != nil || strings.Contains(string(out), fmt.Sprintf("resumed the residual of round %d", rounds)) != residual {
		t.Fatalf("restart resumed a residual: %v, want %v (err %v):\n%s", !residual, residual, err, out)
	}
}

// maxSupportBits bounds the bits per parameter a support round of the
// demo's sends, everything counted (dense minmax8: about 18).
const maxSupportBits = 3

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
	run := startBootstrap(t, smallRun, net)
	ctx, dir := run.ctx, run.dir
	join := func(name string, rounds, minPeers int) *exec.Cmd { return run.join(name, rounds, minPeers, net) }
	re := roundState
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
	// A second volunteer on a's data directory is refused at once.
	began := time.Now()
	out, err := join("a", 1, 1).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "in use by another process") || time.Since(began) > 20*time.Second {
		t.Fatalf("second volunteer on a's data dir: err %v after %v:\n%s", err, time.Since(began), out)
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

// join is a small volunteer of r named name (its data directory under
// r.dir): batch 2 x 32, 4 inner steps, rounds rounds, waiting for minPeers.
func (r *testRun) join(name string, rounds, minPeers int, net []string) *exec.Cmd {
	args := append([]string{"--log-level", logLevel(), "node", "join", "--bootstrap", r.addr, "--data-dir", filepath.Join(r.dir, name),
		"--batch", "2", "--seq-len", "32", "--inner-steps", "4", "--rounds", fmt.Sprint(rounds),
		"--min-peers", fmt.Sprint(minPeers), "--threads", "1"}, net...)
	return dumpOnTimeout(exec.CommandContext(r.ctx, r.bin, args...))
}

// dumpOnTimeout makes a command that outlives the test's context quit with
// SIGQUIT, so that its output ends with every goroutine's stack: a stalled
// volunteer then shows where it waits.
func dumpOnTimeout(c *exec.Cmd) *exec.Cmd {
	c.Cancel = func() error { return c.Process.Signal(syscall.SIGQUIT) }
	c.WaitDelay = 5 * time.Second
	return c
}

// smallRun is the manifest of the multi-process tests: the tiny model at
// batch 2 x 32 tokens, 4 inner steps per round, on each volunteer's own
// corpus (the Go sources).
const smallRun = `
[model]
preset = "tiny"
batch = 2
seq_len = 32
[optimizer]
inner_steps = 4
[data]
source = "local"
`

// shardedRun is smallRun with its corpus (a few packages of the Go sources,
// given to the bootstrap with --corpus) packed into shards that travel with
// the run.
var shardedRun = strings.Replace(smallRun, `source = "local"`, "source = \"shards\"\nshard_bytes = 262144", 1)

// testRun is a bootstrap started by a test, with what the test needs of it.
type testRun struct {
	ctx                  context.Context
	dir, bin, addr, http string // http: the status page's base URL
	args                 []string
	cmd                  *exec.Cmd
}

// startBootstrap builds the binary, starts `skein bootstrap` with the run's
// manifest (TOML), a status page on a free port and the network flags, and
// returns it with a 2-minute context for the test's processes. The
// bootstrap is stopped when the test ends.
func startBootstrap(t *testing.T, runTOML string, netFlags []string) *testRun {
	t.Helper()
	r := &testRun{dir: t.TempDir()}
	if err := os.WriteFile(filepath.Join(r.dir, "run.toml"), []byte(runTOML), 0o644); err != nil {
		t.Fatal(err)
	}
	r.bin = filepath.Join(r.dir, "skein")
	if out, err := exec.Command("go", "build", "-o", r.bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	r.ctx = ctx
	r.args = append([]string{"--log-level", "warn", "bootstrap", "--data-dir", filepath.Join(r.dir, "bs"),
		"--manifest", filepath.Join(r.dir, "run.toml"), "--http", "127.0.0.1:0"}, netFlags...)
	r.start(t)
	t.Cleanup(r.stop)
	return r
}

// start runs the bootstrap and waits for its address and status page.
func (r *testRun) start(t *testing.T) {
	t.Helper()
	r.cmd = exec.CommandContext(r.ctx, r.bin, r.args...)
	stdout, _ := r.cmd.StdoutPipe()
	var stderr bytes.Buffer
	r.cmd.Stderr = &syncWriter{w: &stderr}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("bootstrap printed no address: %v\n%s", err, r.cmd.Stderr.(*syncWriter).String())
	}
	r.addr = strings.TrimSpace(line)
	if !strings.Contains(r.addr, "/p2p/") {
		t.Fatalf("bootstrap address %q has no peer ID", r.addr)
	}
	// stderr is copied from the child by a goroutine: it may lag stdout.
	re := regexp.MustCompile(`status page: (\S+)`)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if m := re.FindStringSubmatch(r.cmd.Stderr.(*syncWriter).String()); m != nil {
			r.http = m[1]
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("bootstrap printed no status page:\n%s", r.cmd.Stderr.(*syncWriter).String())
		}
	}
}

// stop interrupts the bootstrap and waits for it.
func (r *testRun) stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		r.cmd.Process.Signal(os.Interrupt)
		r.cmd.Wait()
	}
}

// syncWriter is a bytes.Buffer safe for a child's writes and the test's reads.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

// TestDelayedStopLandsRound: volunteers of an overlapped run interrupted
// together (as the demo stops them) do not drop the round whose exchange
// was under way, or the one that landed during the interrupted phase: with
// P the lowest round any of them had reported when interrupted, every one
// of them had started round P+1, so every one reports round P+1, with the
// same state. (A volunteer ahead of the others may abandon the round after
// it: the others, stopped first, never start it.)
func TestDelayedStopLandsRound(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs four processes")
	}
	net := []string{"--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--timing", "lan"}
	run := startBootstrap(t, strings.Replace(smallRun, "inner_steps = 4", "inner_steps = 20\ndelayed = true", 1), net)
	const n = 3
	re := roundState
	cmds := make([]*exec.Cmd, n)
	outs := make([]*syncWriter, n)
	for i := range n {
		outs[i] = &syncWriter{w: &bytes.Buffer{}}
		cmds[i] = exec.CommandContext(run.ctx, run.bin, append([]string{"--log-level", "warn", "node", "join", "--bootstrap", run.addr,
			"--data-dir", filepath.Join(run.dir, "n", string(rune('a'+i))), "--min-peers", strconv.Itoa(n), "--threads", "1"}, net...)...)
		cmds[i].Stdout, cmds[i].Stderr = outs[i], outs[i]
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	dump := func() {
		for i, o := range outs {
			t.Logf("volunteer %d output:\n%s", i, o.String())
		}
	}
	// lastRound is the highest round a volunteer has reported so far.
	lastRound := func(i int) int {
		r := 0
		for _, m := range re.FindAllStringSubmatch(outs[i].String(), -1) {
			k, _ := strconv.Atoi(m[1])
			r = max(r, k)
		}
		return r
	}
	lowest := func() int {
		p := lastRound(0)
		for i := 1; i < n; i++ {
			p = min(p, lastRound(i))
		}
		return p
	}
	for deadline := time.Now().Add(90 * time.Second); lowest() < 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			dump()
			t.Fatal("the volunteers did not report 3 rounds")
		}
	}
	p := lowest() // read before the interrupts: at most what it is when they land
	for _, c := range cmds {
		c.Process.Signal(os.Interrupt)
	}
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			dump()
			t.Fatalf("volunteer %d: %v", i, err)
		}
	}
	want := strconv.Itoa(p + 1)
	state := ""
	for i, o := range outs {
		got := ""
		for _, m := range re.FindAllStringSubmatch(o.String(), -1) {
			if m[1] == want {
				got = m[2]
			}
		}
		switch {
		case got == "":
			dump()
			t.Fatalf("volunteer %d did not report round %s, which every volunteer had started when interrupted", i, want)
		case state != "" && got != state:
			dump()
			t.Fatalf("round %s: volunteer %d state %s, another's %s", want, i, got, state)
		}
		state = got
	}
}
