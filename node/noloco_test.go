package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/kernels"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
	"github.com/skein-ml/skein/transport"
)

// nolocoRun is a NoLoCo run in this process: a bootstrap seed serving the
// manifest on loopback, and volunteers joined through it.
type nolocoRun struct {
	t      *testing.T
	seed   *p2p.Seed
	m      manifest.Manifest
	addr   string
	corpus []string
	ctx    context.Context // ends the whole test
}

func newNoLoCoRun(t *testing.T, edits ...func(*manifest.Manifest)) *nolocoRun {
	root, err := data.GoRoot()
	if err != nil {
		t.Skip(err)
	}
	m := manifest.Default()
	m.RunID = "noloco-test"
	m.Model.Batch, m.Model.SeqLen = 2, 32
	o := &m.Optimizer
	o.Kind, o.InnerSteps, o.InnerLR, o.Warmup, o.TotalSteps = manifest.KindNoLoCo, 4, 2e-3, 8, 1000
	o.OuterLR, o.OuterMomentum, o.GroupSize, o.Gamma = 0.7, 0.5, 2, 0.7
	for _, e := range edits {
		e(&m)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), p2ptest.Slowdown*3*time.Minute)
	t.Cleanup(cancel)
	sc := p2p.DefaultSeedConfig(m.RunID, t.TempDir())
	// LAN timers: the fast ones suspect members that are merely starved of
	// CPU while the others train.
	sc.ListenAddrs, sc.Timing, sc.Logger = []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, testTiming(), testLogger("seed")
	seed, err := p2p.NewSeed(ctx, sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seed.Close() })
	if err := ServeManifest(seed.Node, m); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(root, "src")
	return &nolocoRun{t: t, seed: seed, m: m, addr: seed.FullAddr().String(), ctx: ctx,
		corpus: []string{filepath.Join(src, "strings"), filepath.Join(src, "bufio")}}
}

// testTiming is LAN timing, more patient under the race detector: a
// volunteer building its model there is starved of CPU long enough to be
// declared dead otherwise.
func testTiming() p2p.Timing {
	t := p2p.LANTiming()
	if p2ptest.Slowdown > 1 {
		t.ProbeInterval, t.ProbeTimeout, t.SuspicionMult = 3*time.Second, 2*time.Second, 6
	}
	return t
}

func testLogger(name string) *slog.Logger {
	if os.Getenv("SKEIN_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", name)
}

// testVolunteer is one volunteer of a nolocoRun, run in a goroutine: its
// progress lines, its round reports and Run's (and Close's) result.
type testVolunteer struct {
	name   string
	dir    string
	cancel context.CancelFunc
	done   chan error

	mu   sync.Mutex
	out  bytes.Buffer
	reps []RoundReport
	id   transport.PeerID
	addr string // full multiaddr, once joined
}

func (tv *testVolunteer) Write(p []byte) (int, error) {
	tv.mu.Lock()
	defer tv.mu.Unlock()
	return tv.out.Write(p)
}

func (tv *testVolunteer) output() string {
	tv.mu.Lock()
	defer tv.mu.Unlock()
	return tv.out.String()
}

func (tv *testVolunteer) reports() []RoundReport {
	tv.mu.Lock()
	defer tv.mu.Unlock()
	return slices.Clone(tv.reps)
}

func (tv *testVolunteer) lastRound() uint64 {
	if r := tv.reports(); len(r) > 0 {
		return r[len(r)-1].Round
	}
	return 0
}

// join starts a volunteer on dir (a fresh one when ""), which trains rounds
// outer steps (0: until stopped) once it sees minPeers volunteers; onRound,
// if set, is called after each report is recorded.
func (r *nolocoRun) join(name, dir string, rounds, minPeers int, onRound func(RoundReport), opts ...func(*VolunteerConfig)) *testVolunteer {
	if dir == "" {
		dir = r.t.TempDir()
	}
	tv := &testVolunteer{name: name, dir: dir, done: make(chan error, 1)}
	cfg := DefaultVolunteerConfig(r.m.RunID)
	cfg.DataDir, cfg.Bootstrap, cfg.Listen = dir, []string{r.addr}, []string{"/ip4/127.0.0.1/udp/0/quic-v1"}
	cfg.Timing, cfg.Corpus, cfg.ManifestWait = testTiming(), r.corpus, 30*time.Second
	cfg.Rounds, cfg.MinPeers, cfg.Threads, cfg.ValBatches = rounds, minPeers, 1, 0
	// A partner that is not there is given up after 2 s (members train in
	// step here, each inner phase is a fraction of a second).
	cfg.Collective.InitialDeadline = p2ptest.Slowdown * 10 * time.Second
	cfg.Collective.MinDeadline, cfg.Collective.MaxDeadline = p2ptest.Slowdown*2*time.Second, p2ptest.Slowdown*10*time.Second
	cfg.Logger, cfg.Progress = testLogger(name), tv
	cfg.OnRound = func(rep RoundReport) {
		tv.mu.Lock()
		tv.reps = append(tv.reps, rep)
		tv.mu.Unlock()
		if onRound != nil {
			onRound(rep)
		}
	}
	for _, o := range opts {
		o(&cfg)
	}
	ctx, cancel := context.WithCancel(r.ctx)
	tv.cancel = cancel
	go func() {
		v, err := NewVolunteer(ctx, cfg)
		if err != nil {
			tv.done <- fmt.Errorf("%s: joining: %w", name, err)
			return
		}
		tv.mu.Lock()
		tv.id = transport.PeerID(v.pn.ID().String())
		tv.addr = v.pn.Addrs()[0].String()
		tv.mu.Unlock()
		err = v.Run(ctx)
		if cerr := v.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("%s: leaving: %w", name, cerr)
		}
		tv.done <- err
	}()
	return tv
}

// wait returns the volunteer's result, or fails the test after timeout.
func (r *nolocoRun) wait(tv *testVolunteer, timeout time.Duration) error {
	r.t.Helper()
	select {
	case err := <-tv.done:
		return err
	case <-time.After(timeout):
		r.t.Fatalf("%s did not finish in %v:\n%s", tv.name, timeout, tv.output())
		return nil
	}
}

// until polls cond every 50 ms and fails the test after timeout.
func (r *nolocoRun) until(what string, timeout time.Duration, cond func() bool, show ...*testVolunteer) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			for _, tv := range show {
				r.t.Logf("--- %s:\n%s", tv.name, tv.output())
			}
			// Where everything is stuck, for a failure seen once under load.
			buf := make([]byte, 4<<20)
			r.t.Logf("goroutines:\n%s", buf[:runtime.Stack(buf, true)])
			r.t.Fatalf("%s: not after %v", what, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var caughtUpRe = regexp.MustCompile(`caught up with the run: took the median of members' states at round (\d+)`)

// TestNoLoCoVolunteers runs NoLoCo volunteers over libp2p on loopback, in
// this process: three train together; one of them stalls and, two steps
// behind, jumps to a member's state; a late joiner takes a member's step
// and weights, trains four steps with the others and leaves; restarted on
// its data directory, it resumes its checkpoint. The members' losses fall
// and they average with each other.
func TestNoLoCoVolunteers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs four volunteers over libp2p")
	}
	began := time.Now()
	r := newNoLoCoRun(t)
	long := p2ptest.Slowdown * 90 * time.Second
	var a, b, c *testVolunteer
	// c stalls after its second round until a and b are two steps ahead
	// (a majority of the others: one is not followed; the test fails below
	// if that never happens).
	stall := func(rep RoundReport) {
		for deadline := time.Now().Add(long); rep.Round == 2 && min(a.lastRound(), b.lastRound()) < 4 && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
	}
	a, b, c = r.join("a", "", 0, 3, nil), r.join("b", "", 0, 3, nil), r.join("c", "", 0, 3, stall)
	all := []*testVolunteer{a, b, c}
	stop := func() {
		for _, tv := range all {
			tv.cancel()
		}
	}
	defer stop()
	r.until("c jumped to a member's state", long, func() bool {
		return slices.ContainsFunc(c.reports(), func(rep RoundReport) bool { return rep.Adopted })
	}, all...)
	t.Logf("c jumped after %v", time.Since(began))

	// d trains until it has averaged with a partner and an original member
	// with it (on a loaded machine that can take more than a few steps:
	// members drift apart and jump), then stops.
	d := r.join("d", "", 0, 1, nil)
	all = append(all, d)
	dHeard := func() bool {
		return slices.ContainsFunc(d.reports(), func(rep RoundReport) bool {
			return !rep.Adopted && len(rep.Stats.Group) > 1 && rep.Stats.BytesRecv > 0
		})
	}
	usedD := func() bool { // did an original average with d?
		for _, tv := range all[:3] {
			for _, rep := range tv.reports() {
				if slices.Contains(rep.Stats.Group, d.id) {
					return true
				}
			}
		}
		return false
	}
	r.until("the late joiner and an original averaged with each other", long, func() bool {
		d.mu.Lock()
		joined := d.id != ""
		d.mu.Unlock()
		return joined && dHeard() && usedD()
	}, all...)
	d.cancel()
	if err := r.wait(d, long); err != nil {
		t.Fatalf("late joiner: %v\n%s", err, d.output())
	}
	dReps := d.reports()
	t.Logf("d done after %v: rounds %v", time.Since(began), rounds(dReps))
	last := dReps[len(dReps)-1].Round
	for _, tv := range all[:3] {
		r.until(tv.name+" past the late joiner's last step", long, func() bool { return tv.lastRound() >= last }, all...)
	}

	// Restarted on its data directory, d resumes its checkpoint.
	d2 := r.join("d2", d.dir, 1, 1, nil)
	if err := r.wait(d2, long); err != nil {
		t.Fatalf("restarted joiner: %v\n%s", err, d2.output())
	}
	stop()
	for _, tv := range all[:3] {
		if err := r.wait(tv, long); err != nil {
			t.Fatalf("%v\n%s", err, tv.output())
		}
	}
	t.Logf("all done after %v", time.Since(began))
	for _, tv := range append(all, d2) {
		t.Logf("--- %s:\n%s", tv.name, tv.output())
	}

	// Everyone trained and averaged with the others; the losses fell.
	var first float64
	for _, tv := range all[:3] {
		reps := tv.reports()
		t.Logf("%s: rounds %v", tv.name, rounds(reps))
		if len(reps) < 5 {
			t.Fatalf("%s reported %d rounds, want 5 or more", tv.name, len(reps))
		}
		heard := 0
		for i, rep := range reps {
			if i > 0 && rep.Round <= reps[i-1].Round {
				t.Fatalf("%s: round %d after %d", tv.name, rep.Round, reps[i-1].Round)
			}
			if !rep.Adopted && len(rep.Stats.Group) > 1 && rep.Stats.BytesRecv > 0 && rep.Stats.BytesSent > 0 {
				heard++
			}
		}
		if heard < max(2, len(reps)/3) {
			t.Fatalf("%s averaged with a partner in %d of %d rounds", tv.name, heard, len(reps))
		}
		// The last rounds, not the last alone: one batch of 2 x 32 tokens,
		// right after averaging with a partner that just resumed an older
		// checkpoint or right after taking the members' median, can spike
		// (seen under load: 3.38 then 4.88; and c, just after its jump,
		// 4.87, 6.18, 3.68 on a machine running far more than this test).
		// The best of the last 3 computed rounds shows that the loss fell;
		// their mean, that it did not diverge.
		l0 := reps[0].Loss
		var last3 []float64
		for _, rep := range reps[len(reps)-3:] {
			if !rep.Adopted {
				last3 = append(last3, float64(rep.Loss))
			}
		}
		if len(last3) == 0 || !(slices.Min(last3) < float64(l0)-0.5) || !(mean(last3) < float64(l0)) {
			t.Fatalf("%s: loss %.3f in the first round, %.3f in the last 3 computed", tv.name, l0, last3)
		}
		first += float64(l0) / 3
	}
	// c fell two steps behind and took a member's state.
	cReps := c.reports()
	i := slices.IndexFunc(cReps, func(rep RoundReport) bool { return rep.Adopted })
	if i < 1 || cReps[i].Round < cReps[i-1].Round+2 {
		t.Fatalf("c's rounds %v: want a jump of two or more", rounds(cReps))
	}

	// The late joiner took a member's step and weights, then took part: at
	// start, or (when too few members served a state at once as it joined,
	// seen under load) at a later step, jumping from the rounds it trained
	// alone; the rounds after the catch-up are judged.
	var start uint64
	after := dReps
	if m := caughtUpRe.FindStringSubmatch(d.output()); m != nil {
		start, _ = strconv.ParseUint(m[1], 10, 64)
	} else if i := slices.IndexFunc(dReps, func(rep RoundReport) bool { return rep.Adopted }); i >= 0 {
		start, after = dReps[i].Round, dReps[i+1:]
	} else {
		t.Fatalf("late joiner did not catch up: rounds %v", rounds(dReps))
	}
	if start < 4 || len(after) == 0 || after[0].Round <= start {
		t.Fatalf("late joiner caught up at round %d and reported %v", start, rounds(dReps))
	}
	// One batch of 2 x 32 tokens is noisy (seen under load: 5.17, then
	// 3.65): the mean of its first two computed rounds, against the
	// others' first (a fresh model two rounds in is about 5.07 to their 5.26).
	var early []float64
	for _, rep := range after {
		if !rep.Adopted && len(early) < 2 {
			early = append(early, float64(rep.Loss))
		}
	}
	if e := mean(early); !(e < first-0.3) {
		t.Fatalf("late joiner's first losses %.3f, the others' first %.3f: weights not adopted", early, first)
	}
	// The restart resumed the checkpoint d left with (at its last step, or
	// one later when it stopped inside an outer step).
	rm := regexp.MustCompile(`resumed local checkpoint at round (\d+)`).FindStringSubmatch(d2.output())
	if rm == nil {
		t.Fatalf("restart did not resume:\n%s", d2.output())
	}
	if at, _ := strconv.ParseUint(rm[1], 10, 64); at < last || at > last+1 {
		t.Fatalf("restart resumed at round %d, d left at %d", at, last)
	}
	if reps := d2.reports(); len(reps) != 1 || reps[0].Round <= last || !(float64(reps[0].Loss) < first-0.3) {
		t.Fatalf("restart reported %v", reps)
	}
}

func rounds(reps []RoundReport) string {
	var b bytes.Buffer
	for _, rep := range reps {
		fmt.Fprintf(&b, " %d", rep.Round)
		if rep.Adopted {
			b.WriteString("(adopted)")
		} else {
			fmt.Fprintf(&b, "(%.2f, %d)", rep.Loss, len(rep.Stats.Group))
		}
	}
	return b.String()
}

// A NoLoCo checkpoint (stage plus step, phi and momentum) restores the
// stage and the optimizer's state; a damaged state file is refused.
func TestNoLoCoCheckpointRoundTrip(t *testing.T) {
	cfg, err := model.Preset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Layers = 1
	stage := func(seed uint64) *model.Stage {
		s, err := model.NewStage(kernels.NewCPU(1), cfg, model.FullSpec(cfg), 1, 8, seed)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	st := stage(7)
	n := st.NumParams()
	net := transport.NewMemNetwork()
	defer net.Close()
	phi := make([]float32, n)
	for i := range phi {
		phi[i] = float32(i%97) / 97
	}
	nl, err := optimizer.NewNoLoCo(context.Background(), optimizer.DefaultNoLoCo(), net.Join("a"), phi)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	delta := make([]float32, n)
	delta[3] = 0.25
	if err := nl.SetState(7, phi, delta); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), volunteerCheckpoint)
	if err := saveState(path, st, 28, nl); err != nil {
		t.Fatal(err)
	}

	got, err := optimizer.NewNoLoCo(context.Background(), optimizer.DefaultNoLoCo(), net.Join("b"), make([]float32, n))
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	st2 := stage(8)
	step, err := resumeState(path, st2, got)
	if err != nil {
		t.Fatal(err)
	}
	same := slices.Equal(kernels.Host(st2.Params), kernels.Host(st.Params))
	if step != 28 || got.Step != 7 || !slices.Equal(got.Phi, phi) || !slices.Equal(got.Delta, delta) || !same {
		t.Fatalf("resumed inner step %d, step %d, phi equal %v, delta equal %v, weights equal %v", step, got.Step,
			slices.Equal(got.Phi, phi), slices.Equal(got.Delta, delta), same)
	}

	raw, err := os.ReadFile(path + ".state")
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 1
	if err := os.WriteFile(path+".state", raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := resumeState(path, stage(7), got); !errors.Is(err, ErrBadState) || got.Step != 7 {
		t.Fatalf("damaged state: err %v, step %d", err, got.Step)
	}
}

// TestJoinWhileBootstrapDown: any member serves the manifest, so a newcomer
// joins through a volunteer while the bootstrap is down; the volunteer's
// Prometheus endpoint shows its rounds.
func TestJoinWhileBootstrapDown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two volunteers over libp2p")
	}
	r := newNoLoCoRun(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metrics := ln.Addr().String()
	ln.Close()
	long := p2ptest.Slowdown * 90 * time.Second
	a := r.join("a", "", 0, 1, nil, func(c *VolunteerConfig) { c.MetricsAddr = metrics })
	defer func() {
		a.cancel()
		if err := r.wait(a, long); err != nil {
			t.Errorf("a: %v", err)
		}
	}()
	r.until("a trained a round", long, func() bool { return a.lastRound() >= 1 }, a)
	r.seed.Close()

	a.mu.Lock()
	aAddr := a.addr
	a.mu.Unlock()
	dev := &countingDevice{CPU: kernels.NewCPU(1)}
	b := r.join("b", "", 2, 2, nil, func(c *VolunteerConfig) { c.Bootstrap, c.Device = []string{aAddr}, dev })
	if err := r.wait(b, long); err != nil {
		t.Fatalf("joining through a volunteer: %v\n%s", err, b.output())
	}
	if dev.steps.Load() == 0 || !strings.Contains(b.output(), "on "+dev.Name()) {
		t.Fatalf("b did not train on the device it was given (%d updates on it):\n%s", dev.steps.Load(), b.output())
	}
	if out := b.output(); !strings.Contains(out, `run "noloco-test": manifest `+r.m.ShortHash()) {
		t.Fatalf("b did not take the run's manifest from a:\n%s", out)
	}

	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`(?m)^skein_node_round (\d+)`).FindSubmatch(body)
	if m == nil {
		t.Fatalf("no skein_node_round in /metrics:\n%s", body)
	}
	if n, _ := strconv.Atoi(string(m[1])); n < 1 {
		t.Fatalf("skein_node_round %d, want >= 1", n)
	}
	for _, name := range []string{"skein_node_tokens_total", "skein_node_bytes_sent_total", "skein_node_validation_loss", "skein_node_active 1", "skein_node_cap_threads 1"} {
		if !strings.Contains(string(body), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// countingDevice is a CPU that counts its AdamW updates: proof that a
// volunteer trains on the device it is given (--device).
type countingDevice struct {
	*kernels.CPU
	steps atomic.Int64
}

func (d *countingDevice) AdamW(p, g, m, v kernels.Buffer, lr, b1, b2, eps, wd float32, t int) {
	d.steps.Add(1)
	d.CPU.AdamW(p, g, m, v, lr, b1, b2, eps, wd, t)
}

// AdamWSegments is how optimizer.AdamW steps a whole stage.
func (d *countingDevice) AdamWSegments(p, g, m, v kernels.Buffer, ends []int, decay []bool, gscale, lr, b1, b2, eps, wd float32, t int) {
	d.steps.Add(1)
	d.CPU.AdamWSegments(p, g, m, v, ends, decay, gscale, lr, b1, b2, eps, wd, t)
}

func TestCatchUpTarget(t *testing.T) {
	for _, tt := range []struct {
		own, slack uint64
		steps      []uint64
		want       uint64
		jump       bool
	}{
		{0, 0, nil, 0, false},
		{0, 0, []uint64{9}, 0, false},                        // one other: no majority to follow
		{0, 0, []uint64{9, 9}, 9, true},                      // both ahead
		{0, 0, []uint64{9, 1 << 62}, 0, false},               // the far one is not followed, and 9 is one member's
		{5, 0, []uint64{5, 5, 1 << 62}, 5, false},            // a lone far announcer
		{5, 0, []uint64{5, 1 << 62, 1 << 62}, 1 << 62, true}, // a majority is followed
		{5, 1, []uint64{7, 7, 1 << 62}, 7, true},             // the latest step a majority reached
		{5, 1, []uint64{6, 7, 1 << 62}, 6, false},            // and two members announce (6 and 7 for 6)
		{5, 0, []uint64{6, 9, 1 << 62}, 0, false},            // 9 is one member's, 6 too
		{5, 0, []uint64{6, 8, 9, 1 << 62}, 8, true},          // 8 and 9 serve 8
		{5, 0, []uint64{6, 6, 9, 1 << 62}, 6, true},          // 9 is one member's: 6
		{5, 2, []uint64{6, 7, 1 << 62}, 7, false},            // within slack
		{3, 0, []uint64{0, 0, 9, 9, 9}, 9, true},             // 3 of 5
		{3, 0, []uint64{0, 0, 0, 9, 9}, 0, false},            // 2 of 5
	} {
		got, jump := catchUpTarget(tt.own, tt.slack, tt.steps)
		if jump != tt.jump || (jump && got != tt.want) {
			t.Errorf("own %d slack %d steps %v: %d %v, want %d %v", tt.own, tt.slack, tt.steps, got, jump, tt.want, tt.jump)
		}
	}
}

// fixedState is an outerState for tests.
type fixedState struct {
	round    uint64
	phi, mom []float32
}

func (s *fixedState) State() (uint64, []float32, []float32) { return s.round, s.phi, s.mom }
func (s *fixedState) SetState(round uint64, phi, mom []float32) error {
	s.round, s.phi, s.mom = round, slices.Clone(phi), slices.Clone(mom)
	return nil
}

// A hostile volunteer that announces a far step and serves weights of its
// choosing is not followed by a member catching up: alone it moves no one,
// and where the honest members are ahead the member goes to their step with
// the median of several members' states, so the hostile one moves no
// coordinate outside the honest range.
func TestNoLoCoCatchUpIgnoresLoneJump(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 5, p2ptest.Options{})
	me, honest, hostile := sw.Nodes[1], sw.Nodes[2:4], sw.Nodes[4]
	const n = 1000
	vec := func(v float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = v + float32(i%7)/100
		}
		return x
	}
	// announce makes node a volunteer at step round serving a state of
	// phi and momentum all v (plus a pattern), at served (its own choice).
	announce := func(node *p2p.Node, round, served uint64, v float32) {
		blob, _ := encodeServed(served, vec(v), vec(v))
		node.ServeBulk(func(_ context.Context, _ peer.ID, key string) (io.ReaderAt, int64, error) {
			return servedState{blob, served}.open(key)
		}, 0)
		if err := node.UpdateMeta(context.Background(), func(m *p2p.Meta) { m.Role, m.Round = p2p.RoleVolunteer, round }); err != nil {
			t.Fatal(err)
		}
	}
	far := uint64(1) << 62
	for _, tt := range []struct {
		name            string
		own, honest     uint64
		hostile, served uint64 // what the hostile member announces and serves
		jump            bool
		wantRound       uint64
	}{
		{"lone far step", 5, 5, far, far, false, 0},
		{"far step, honest ahead", 0, 10, far, far, true, 10},
		{"the honest step, hostile weights", 0, 10, 10, 10, true, 10},
		{"a step past the honest one", 0, 10, 11, 11, true, 10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for i, h := range honest {
				announce(h, tt.honest, tt.honest, float32(i+1)) // 1 and 2
			}
			announce(hostile, tt.hostile, tt.served, 1e30)
			want := map[peer.ID]uint64{honest[0].ID(): tt.honest, honest[1].ID(): tt.honest, hostile.ID(): tt.hostile}
			deadline := time.Now().Add(p2ptest.Slowdown * 30 * time.Second)
			for seen := 0; seen < len(want); {
				if time.Now().After(deadline) {
					t.Fatal("announced steps not seen")
				}
				seen = 0
				for _, m := range me.Members() {
					if r, ok := want[m.ID]; ok && m.Meta.Role == p2p.RoleVolunteer && m.Meta.Round == r {
						seen++
					}
				}
				time.Sleep(20 * time.Millisecond)
			}
			st := &fixedState{round: tt.own, phi: vec(0), mom: vec(0)}
			jumped, err := nolocoCatchUp(context.Background(), me, testLogger("me"), st, tt.own, 0, n, nil)
			if err != nil || jumped != tt.jump {
				t.Fatalf("jumped %v, err %v; want %v", jumped, err, tt.jump)
			}
			if !jumped {
				if st.round != tt.own || st.phi[0] != 0 {
					t.Fatalf("state changed: round %d, phi[0] %v", st.round, st.phi[0])
				}
				return
			}
			if st.round != tt.wantRound {
				t.Fatalf("took round %d, want %d", st.round, tt.wantRound)
			}
			lo, hi := vec(1), vec(2)
			for i := range st.phi {
				if st.phi[i] < lo[i] || st.phi[i] > hi[i] || st.mom[i] < lo[i] || st.mom[i] > hi[i] {
					t.Fatalf("element %d: phi %v mom %v, outside the honest range [%v, %v]", i, st.phi[i], st.mom[i], lo[i], hi[i])
				}
			}
		})
	}
}

// mean is the mean of xs (NaN for none).
func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
