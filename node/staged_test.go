package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skein-ml/skein/bootstrap"
	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
	"github.com/skein-ml/skein/pipeline"
	"github.com/skein-ml/skein/trainer"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// smallRun is the default manifest at a batch of 2 x 32 under runID, and
// the Go sources' root for its corpus (the test skips without them).
func smallRun(t *testing.T, runID string) (manifest.Manifest, string) {
	t.Helper()
	root, err := data.GoRoot()
	if err != nil {
		t.Skip(err)
	}
	m := manifest.Default()
	m.RunID = runID
	m.Model.Batch, m.Model.SeqLen = 2, 32
	return m, root
}

// startBootstrap runs a real bootstrap on loopback until the test ends:
// cfg with a data directory, listen address, timing and console of its own.
func startBootstrap(ctx context.Context, t *testing.T, cfg bootstrap.Config) (bootstrap.Info, *syncBuf) {
	t.Helper()
	out := &syncBuf{}
	ready := make(chan bootstrap.Info, 1)
	done := make(chan error, 1)
	bctx, stop := context.WithCancel(ctx)
	cfg.DataDir, cfg.Listen, cfg.Timing, cfg.Out = t.TempDir(), []string{"/ip4/127.0.0.1/udp/0/quic-v1"}, testTiming(), out
	cfg.Ready = func(i bootstrap.Info) { ready <- i }
	go func() { done <- bootstrap.Run(bctx, cfg) }()
	t.Cleanup(func() {
		stop()
		<-done
	})
	select {
	case info := <-ready:
		return info, out
	case err := <-done:
		t.Fatalf("bootstrap: %v\n%s", err, out.String())
	}
	return bootstrap.Info{}, nil
}

var stageOfRe = regexp.MustCompile(`stage plan (\d+): stage (\d+) of`)

// stageOf is the stage a volunteer's console last said it holds, or -1.
func stageOf(tv *testVolunteer) int {
	m := stageOfRe.FindAllStringSubmatch(tv.output(), -1)
	if m == nil {
		return -1
	}
	s, _ := strconv.Atoi(m[len(m)-1][2])
	return s
}

// stagedReports counts a volunteer's round reports after a point, and
// whether their losses (stage 0 only) are finite.
func stagedReports(tv *testVolunteer, after int) (n int, finite bool) {
	finite = true
	reps := tv.reports()
	for _, r := range reps[min(after, len(reps)):] {
		n++
		if !math.IsNaN(float64(r.Loss)) && (math.IsInf(float64(r.Loss), 0) || r.Loss <= 0) {
			finite = false
		}
	}
	return n, finite
}

// TestStagedVolunteers runs a staged run end to end over libp2p on
// loopback, in this process: a real bootstrap places four volunteers in the
// four stages of the tiny model and they train it together (stage 0's
// loss falls); the member of stage 2 leaves, a newcomer is placed there and
// rebuilds the stage with CheckFree from the weights stages 1 and 3 serve,
// and training goes on; a sixth volunteer joins a stage that has a member
// and takes that member's outer state, and the two replicas average with
// DiLoCo.
func TestStagedVolunteers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a bootstrap and six volunteers over libp2p")
	}
	m, root := smallRun(t, "staged-test")
	o := &m.Optimizer
	o.InnerSteps, o.InnerLR, o.Warmup, o.TotalSteps = 4, 3e-3, 4, 1000
	m.Pipeline = manifest.Pipeline{Stages: 4, Microbatches: 2}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	long := p2ptest.Slowdown * 2 * time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), p2ptest.Slowdown*5*time.Minute)
	defer cancel()
	corpus := []string{filepath.Join(root, "src", "strings"), filepath.Join(root, "src", "bufio")}
	info, bout := startBootstrap(ctx, t, bootstrap.Config{Manifest: m, Logger: testLogger("bootstrap"),
		PlanTiming: bootstrap.PlanTiming{Settle: time.Second, Lead: 2 * time.Second}})
	r := &nolocoRun{t: t, m: info.Manifest, addr: info.Addrs[0], ctx: ctx, corpus: corpus}
	var all []*testVolunteer
	defer func() {
		for _, tv := range all {
			tv.cancel()
		}
		for _, tv := range all { // their data directories are removed next
			select {
			case <-tv.done:
			case <-time.After(30 * time.Second):
				t.Errorf("%s did not stop", tv.name)
			}
		}
		if t.Failed() || testing.Verbose() {
			t.Logf("--- bootstrap:\n%s", bout.String())
			for _, tv := range all {
				t.Logf("--- %s:\n%s", tv.name, tv.output())
			}
		}
	}()
	for _, name := range []string{"a", "b", "c", "d"} {
		all = append(all, r.join(name, "", 0, 1, nil))
	}
	byStage := func() map[int]*testVolunteer {
		out := map[int]*testVolunteer{}
		for _, tv := range all {
			if s := stageOf(tv); s >= 0 {
				out[s] = tv
			}
		}
		return out
	}
	r.until("four volunteers placed in the four stages, two rounds trained", long, func() bool {
		if len(byStage()) != 4 {
			return false
		}
		for _, tv := range all {
			if n, _ := stagedReports(tv, 0); n < 2 {
				return false
			}
		}
		return true
	}, all...)
	first := byStage()[0]
	if n, ok := stagedReports(first, 0); !ok || n == 0 || math.IsNaN(float64(first.reports()[0].Loss)) {
		t.Fatalf("stage 0 reports no finite loss: %+v", first.reports())
	}

	// Stage 2's member leaves; a newcomer rebuilds the stage from stages 1
	// and 3.
	lost := byStage()[2]
	left := time.Now()
	lost.cancel()
	if err := r.wait(lost, long); err != nil {
		t.Fatalf("%s leaving: %v", lost.name, err)
	}
	kept := all[:0:0]
	for _, tv := range all {
		if tv != lost {
			kept = append(kept, tv)
		}
	}
	all = kept
	e := r.join("e", "", 0, 1, nil)
	all = append(all, e)
	r.until("the newcomer rebuilt stage 2 with CheckFree", long, func() bool {
		return strings.Contains(e.output(), "stage 2 was lost: rebuilt by CheckFree from stages 1 and 3")
	}, all...)
	rebuilt := time.Since(left)
	before := len(first.reports())
	r.until("stage 0 and the newcomer trained two more rounds", long, func() bool {
		n, _ := stagedReports(first, before)
		ne, _ := stagedReports(e, 0)
		return n >= 2 && ne >= 2
	}, all...)
	t.Logf("stage 2's member left: the newcomer had rebuilt it %.1fs later, and two rounds later (%.1fs) the run went on",
		rebuilt.Seconds(), time.Since(left).Seconds())
	if !strings.Contains(bout.String(), "stage plan 2") {
		t.Fatalf("the bootstrap did not re-plan:\n%s", bout.String())
	}

	// A sixth volunteer joins a stage that has a member, takes its outer
	// state and averages with it.
	f := r.join("f", "", 0, 1, nil)
	all = append(all, f)
	r.until("the sixth volunteer took a member's weights and trained two rounds", long, func() bool {
		n, _ := stagedReports(f, 0)
		return strings.Contains(f.output(), "took the stage's weights from") && n >= 2
	}, all...)
	for _, tv := range all {
		if _, ok := stagedReports(tv, 0); !ok {
			t.Errorf("%s reported a loss that is not a positive finite number: %+v", tv.name, tv.reports())
		}
	}
	if s := stageOf(f); s < 0 || strings.Contains(f.output(), "stage round failed") {
		t.Fatalf("the sixth volunteer (stage %d):\n%s", s, f.output())
	}
	t.Logf("stage 0's losses: %v", lossesOf(first))
}

func lossesOf(tv *testVolunteer) string {
	var parts []string
	for _, r := range tv.reports() {
		parts = append(parts, fmt.Sprintf("%.3f", r.Loss))
	}
	return strings.Join(parts, " ")
}

// A volunteer given --max-memory below what the run needs is refused
// before it allocates anything, and says which cap it was; caps that make
// no sense are refused at once.
func TestVolunteerCaps(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	r := newNoLoCoRun(t)
	tv := r.join("small", "", 1, 1, nil, func(c *VolunteerConfig) { c.MaxMemoryMiB = 1 })
	err := r.wait(tv, p2ptest.Slowdown*time.Minute)
	if !errors.Is(err, trainer.ErrMemory) || !strings.Contains(err.Error(), "--max-memory 1 MiB") {
		t.Fatalf("a run that needs more than the cap: %v", err)
	}
	for _, c := range []func(*VolunteerConfig){
		func(c *VolunteerConfig) { c.MaxUploadMbps = -1 },
		func(c *VolunteerConfig) { c.MaxDownloadMbps = math.NaN() },
		func(c *VolunteerConfig) { c.MaxUploadMbps = 0.01 },
		func(c *VolunteerConfig) { c.MaxMemoryMiB = -5 },
	} {
		cfg := DefaultVolunteerConfig("caps")
		cfg.Bootstrap = []string{r.addr}
		c(&cfg)
		if err := cfg.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: %v, want ErrConfig", cfg, err)
		}
	}
}

// Stage plans come only from the bootstrap a volunteer dialled, and their
// epoch moves by one: a member that signs role bootstrap and serves a plan
// of epoch 2^64-1 (which would win for good) is never taken, and the
// bootstrap's own jump past the next epoch is refused.
func TestStagedPlanOnlyFromBootstrap(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a libp2p swarm")
	}
	sw := p2ptest.NewSwarm(t, 3, p2ptest.Options{Node: func(i int, c *p2p.NodeConfig) {
		if i == 2 {
			c.Meta.Role = p2p.RoleBootstrap // anyone may sign this role
		}
	}})
	boot, vol, hostile := sw.Nodes[0], sw.Nodes[1], sw.Nodes[2]
	if m, ok := vol.Member(hostile.ID()); !ok || m.Meta.Role != p2p.RoleBootstrap {
		t.Fatalf("the volunteer does not see the hostile member as a bootstrap: %+v", m)
	}
	serve := func(n *p2p.Node, epoch func() uint64) {
		err := n.Handle(p2p.ProtoStagePlan, p2p.MessageFrameConfig(pipeline.MaxAssignmentBytes), func(_ context.Context, s *p2p.Stream) error {
			a := pipeline.Assignment{Epoch: epoch(), Start: 1, Stages: 1, Peers: []string{vol.ID().String()}, StageOf: []int{0}, Since: []uint64{1}}
			b, err := a.MarshalBinary()
			if err != nil {
				return err
			}
			return s.WriteFrame(pipeline.AssignmentFrame, b)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	var epoch atomic.Uint64
	serve(boot, epoch.Load)
	serve(hostile, func() uint64 { return math.MaxUint64 })
	boots, err := planSources([]string{sw.NodeConfig(1).Bootstrap[0]})
	if err != nil || len(boots) != 1 || boots[0] != boot.ID() {
		t.Fatalf("plan sources %v, %v; want the seed %s", boots, err, boot.ID())
	}
	st := &stagedVolunteer{v: &Volunteer{pn: vol, log: testLogger("volunteer")}, boots: boots}
	ctx, cancel := context.WithTimeout(context.Background(), p2ptest.Slowdown*time.Minute)
	defer cancel()
	for _, step := range []struct{ served, want uint64 }{{1, 1}, {2, 2}, {4, 2}, {2, 2}, {3, 3}} {
		epoch.Store(step.served)
		st.pollOnce(ctx)
		if a := st.newest.Load(); a == nil || a.Epoch != step.want {
			t.Fatalf("the bootstrap served epoch %d: the volunteer holds %+v, want epoch %d", step.served, a, step.want)
		}
	}
	if _, err := planSources(nil); !errors.Is(err, ErrConfig) {
		t.Fatalf("no bootstrap: %v, want ErrConfig", err)
	}
}

// pickState takes a stage's state only where a strict majority of its
// holders (the plan's, answering or not) serve it; the round a member
// claims decides nothing.
func TestStagedPickState(t *testing.T) {
	st := func(from string, round uint64, v float32) heldState {
		return heldState{from: from, round: round, phi: []float32{v, 1}, mom: []float32{0, 0}}
	}
	tests := []struct {
		name    string
		got     []heldState
		holders int
		floor   uint64
		want    string // "": none
	}{
		{"lone holder", []heldState{st("a", 3, 1)}, 1, 0, "a"},
		{"a lone claim of a later round", []heldState{st("liar", 9, 5), st("b", 3, 1), st("c", 3, 1)}, 3, 0, "b"},
		{"two sybils of four at a later round", []heldState{st("s1", 9, 5), st("s2", 9, 5), st("b", 3, 1), st("c", 3, 1)}, 4, 0, ""},
		{"three of four", []heldState{st("s1", 9, 5), st("b", 3, 1), st("c", 3, 1), st("d", 3, 1)}, 4, 0, "b"},
		{"the majority, not the first served", []heldState{st("x", 4, 7), st("b", 4, 2), st("c", 4, 2), st("y", 4, 7), st("d", 4, 2)}, 5, 0, "b"},
		{"no two agree", []heldState{st("a", 3, 1), st("b", 3, 2)}, 2, 0, ""},
		{"only one answered of two", []heldState{st("a", 3, 1)}, 2, 0, ""},
		{"two answered of five", []heldState{st("a", 3, 1), st("b", 3, 1)}, 5, 0, ""},
		{"behind the floor", []heldState{st("a", 3, 1), st("b", 3, 1)}, 2, 4, ""},
		{"none", nil, 1, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, ok := pickState(tt.got, tt.holders, tt.floor)
			if got := map[bool]string{true: h.from}[ok]; got != tt.want {
				t.Fatalf("picked %q (ok %v), want %q", got, ok, tt.want)
			}
		})
	}
}

// A member behind the run jumps to the latest iteration two of the stage
// plan's other members announce, not to the latest any one announces.
func TestStagedReachedByTwo(t *testing.T) {
	for _, tt := range []struct {
		rounds []uint64
		want   uint64
	}{
		{nil, 0},
		{[]uint64{7}, 7},
		{[]uint64{7, 1 << 62}, 7},
		{[]uint64{7, 8, 1 << 62}, 8},
		{[]uint64{39, 39, 41, 41}, 41},
		{[]uint64{1 << 62, 7, 1 << 62, 9}, 1 << 62}, // the breakdown: two liars
	} {
		if got := reachedByTwo(tt.rounds); got != tt.want {
			t.Errorf("%v: %d, want %d", tt.rounds, got, tt.want)
		}
	}
}
