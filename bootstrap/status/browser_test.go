package status

// The status page in headless Chromium (internal/browsertest): live data, a
// drawn loss curve, live updates without reload, and a screenshot.

import (
	"fmt"
	"math"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/skein-ml/skein/internal/browsertest"
	"github.com/skein-ml/skein/telemetry"
)

// fakeSwarm feeds the store like a small run would: members with their own
// devices and throughput, one outer round at a time.
type fakeSwarm struct {
	t     testing.TB
	store *Store
	peers []string

	mu    sync.Mutex // round is read by the server's members callback
	round uint64
	// data: the reports carry data progress (a run over a packed dataset
	// of 10 rounds an epoch).
	data bool
}

var fakeDevices = []string{"cuda: NVIDIA RTX 4090", "cpu (16 threads)", "cuda: NVIDIA A100 80GB", "cpu (8 threads)"}

func (f *fakeSwarm) members() []Member {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Member
	for i, p := range f.peers {
		out = append(out, Member{Peer: p, Role: "trainer", Device: fakeDevices[i%len(fakeDevices)], Round: f.round,
			StateHash: f.hash(i, f.round)})
	}
	return out
}

// hash is member i's state hash after round r: the same for all, except
// that the last member is out of step every fourth round.
func (f *fakeSwarm) hash(i int, r uint64) uint64 {
	h := (r + 1) * 0x9e3779b97f4a7c15
	if i == len(f.peers)-1 && r%4 == 0 {
		h ^= 1
	}
	return h
}

// rounds records n more rounds from every member, ending now.
func (f *fakeSwarm) rounds(n int) {
	end := time.Now()
	for k := range n {
		f.mu.Lock()
		f.round++
		r := f.round
		f.mu.Unlock()
		at := end.Add(-time.Duration(n-1-k) * 20 * time.Second)
		for i, p := range f.peers {
			val := float32(math.NaN())
			if i == 0 || r%3 == 0 {
				val = float32(1.45 + 2.8*math.Exp(-float64(r)/6) + 0.02*float64(i))
			}
			rep := telemetry.Report{
				Round: r, StateHash: f.hash(i, r),
				TrainLoss:    float32(1.35 + 2.9*math.Exp(-float64(r)/5) + 0.05*math.Sin(float64(r*7+uint64(i)))),
				ValLoss:      val,
				Tokens:       uint64(120_000 * (i + 1)),
				TokensPerSec: 6000 * float64(i+1),
				BytesSent:    16_700_000, BytesRecv: 16_500_000, // int8 pseudo-gradients of 12.6M parameters
				ComputeSeconds: 18, WallSeconds: 20,
				Members: len(f.peers), Device: fakeDevices[i%len(fakeDevices)], Version: "v0.4.0",
				UnixMS: at.UnixMilli(),
			}
			if f.data {
				rep.HasData, rep.Epoch, rep.EpochTrained = true, r/10, float32(r%10)/10
			}
			if err := f.store.Record(p, rep, at.Add(time.Duration(i)*time.Millisecond)); err != nil {
				f.t.Fatalf("record round %d: %v", r, err)
			}
		}
	}
}

func TestBrowserStatusPage(t *testing.T) {
	ctx := browsertest.Start(t)
	consoleErrors := browsertest.WatchConsole(ctx)

	s, _ := openStore(t, testConfig())
	swarm := &fakeSwarm{t: t, store: s}
	for i := range 3 {
		swarm.peers = append(swarm.peers, fmt.Sprintf("12D3KooW%s%02dNodeQm7xKpV4cZbWnS2dEuFy9", []string{"Hx3q", "Lm8v", "Rt2c"}[i], i))
	}
	start := time.Now().Add(-20 * time.Minute)
	for i, p := range swarm.peers {
		if err := s.RecordEvent(Event{At: start.Add(time.Duration(i) * 40 * time.Second), Peer: p, Kind: Join, Role: "trainer", Device: fakeDevices[i]}); err != nil {
			t.Fatal(err)
		}
	}
	late := "12D3KooWZz9LateJoinerPeerXq4sT8uVwY"
	for _, e := range []Event{{Peer: late, Kind: Join, Role: "trainer", Device: "cpu (4 threads)"}, {Peer: late, Kind: Fail}} {
		e.At = time.Now().Add(-5 * time.Minute)
		if err := s.RecordEvent(e); err != nil {
			t.Fatal(err)
		}
	}
	swarm.rounds(12)

	info := RunInfo{RunID: "shakespeare-demo", ManifestHash: "9f2c41d07be35a6e", Preset: "gpt-small", ParamCount: 12_582_912,
		InnerSteps: 500, Optimizer: "diloco", BootstrapAddrs: []string{"/dns4/boot.skein.example/udp/4001/quic-v1"}, Started: start}
	srv := NewServer(s, info, swarm.members, WithStreamTiming(100*time.Millisecond, 15*time.Second, time.Second))
	ts := httptest.NewServer(srv) // 127.0.0.1
	t.Cleanup(ts.Close)
	t.Cleanup(srv.Close)

	if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL)); err != nil {
		t.Fatal(err)
	}
	browsertest.WaitJS(t, ctx, `document.querySelectorAll('#members tbody tr').length === 3 &&
		+document.getElementById('loss-chart').dataset.trainPoints === 12 &&
		document.getElementById('conn-text').textContent === 'live'`, 10*time.Second)
	for _, c := range []struct{ expr, want string }{
		{`document.getElementById('stat-round').textContent`, "12"},
		{`[...document.querySelectorAll('#members tbody tr code')].map(e => e.textContent).join(' ')`, "Hx3q00No"},
		{`document.querySelector('#timeline li').textContent`, "failed"},
		{`document.getElementById('stat-saved').textContent`, "less"},
		{`String(document.getElementById('stat-epoch').hidden)`, "true"}, // no dataset yet
		// 16.7 MB sent a round by each member of a 12.6M-parameter model.
		{`document.getElementById('stat-bits').hidden + ' ' + document.getElementById('stat-bits').textContent`, "false 10.6 bits/param per round"},
	} {
		got, err := browsertest.EvalJS[string](ctx, c.expr)
		if err != nil || !strings.Contains(got, c.want) {
			t.Errorf("%s = %q (%v), want it to contain %q", c.expr, got, err, c.want)
		}
	}
	length, err := browsertest.EvalJS[float64](ctx, `document.querySelector('#loss-chart path.line.train').getTotalLength()`)
	if err != nil || length < 200 {
		t.Errorf("train curve is %v px long (%v)", length, err)
	}

	// Live: more rounds arrive; the same page (no reload) shows them.
	if _, err := browsertest.EvalJS[chromedp.Void](ctx, `window.__sameDocument = true`); err != nil {
		t.Fatal(err)
	}
	swarm.data = true // and now carry data progress: round 16 is epoch 1, 60% trained
	swarm.rounds(4)
	srv.Notify() // the member list moved to round 16
	browsertest.WaitJS(t, ctx, `document.getElementById('stat-round').textContent === '16' &&
		+document.getElementById('loss-chart').dataset.trainPoints === 16`, 10*time.Second)
	browsertest.WaitJS(t, ctx, `!document.getElementById('stat-epoch').hidden &&
		document.getElementById('stat-epoch').textContent === 'epoch 1 · 60.0% trained'`, 5*time.Second)
	if same, err := browsertest.EvalJS[bool](ctx, `window.__sameDocument === true`); err != nil || !same {
		t.Errorf("the page reloaded instead of updating live (%v)", err)
	}
	if got, err := browsertest.EvalJS[string](ctx, `[...document.querySelectorAll('#members .badge')].map(e => e.textContent).join(' ')`); err != nil || got != "agree agree differs" {
		t.Errorf("state agreement badges %q (%v), want the last member to differ at round 16", got, err)
	}
	if errs := consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
	browsertest.WaitJS(t, ctx, `!document.getAnimations().some(a => a.animationName === 'flash')`, 5*time.Second)
	browsertest.Screenshot(t, ctx, "status-page")

	// A phone-sized viewport.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2))); err != nil {
		t.Fatal(err)
	}
	browsertest.WaitJS(t, ctx, `document.getElementById('loss-chart').getBoundingClientRect().width < 390`, 5*time.Second)
	browsertest.Screenshot(t, ctx, "status-page-narrow")
}

// fakePipeline is a staged run of 3 stages of 2 replicas whose stage 2 was
// rebuilt, at iteration 41.
func fakePipeline() *Pipeline {
	id := func(s, k int) string { return fmt.Sprintf("12D3KooWStage%dRep%dxQm7xKpV4cZbWnS2dEuFy9", s, k) }
	p := &Pipeline{SkipRatio: 1.0 / 3, Iteration: 41}
	for s, holds := range []string{"embedding, head, layers 0-1", "layer 2", "layer 3"} {
		st := StageView{Stage: s, Holds: holds, Replicas: []string{id(s, 0), id(s, 1)}}
		if s == 2 {
			st.Rebuilt = "CheckFree+ from stage 1, after step 30"
		}
		p.Stages = append(p.Stages, st)
	}
	p.Paths = []PathView{{Microbatch: 0, Stages: []int{0, 2}, Peers: []string{id(0, 0), id(2, 1)}},
		{Microbatch: 1, Stages: []int{0, 1}, Peers: []string{id(0, 1), id(1, 0)}}}
	return p
}

// TestBrowserPipeline: a staged run's status page shows its stages, their
// replicas, the rebuilt stage and the latest iteration's paths; a
// data-parallel run's page has no pipeline card.
func TestBrowserPipeline(t *testing.T) {
	ctx := browsertest.Start(t)
	consoleErrors := browsertest.WatchConsole(ctx)
	s, _ := openStore(t, testConfig())
	var mu sync.Mutex
	pipe := fakePipeline()
	srv := NewServer(s, RunInfo{RunID: "staged"}, nil, WithStreamTiming(100*time.Millisecond, 15*time.Second, time.Second),
		WithPipeline(func() *Pipeline {
			mu.Lock()
			defer mu.Unlock()
			return pipe
		}))
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	t.Cleanup(srv.Close)
	if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL)); err != nil {
		t.Fatal(err)
	}
	browsertest.WaitJS(t, ctx, `!document.getElementById('pipeline-card').hidden &&
		document.querySelectorAll('#stages tbody tr').length === 3`, 10*time.Second)
	for _, c := range []struct{ expr, want string }{
		{`document.getElementById('pipeline-meta').textContent`, "3 stages · each microbatch skips 1"},
		{`document.querySelector('#stages tr[data-stage="0"]').textContent`, "embedding, head, layers 0-1Stage0Re"},
		{`document.querySelector('#stages tr.rebuilt').textContent`, "CheckFree+ from stage 1"},
		{`document.getElementById('paths-iter').textContent`, "41"},
		{`document.querySelector('#paths li').textContent`, "stage 0 @ Stage0Re → stage 2 @ Stage2Re → stage 0 (loss)"},
	} {
		got, err := browsertest.EvalJS[string](ctx, c.expr)
		if err != nil || !strings.Contains(got, c.want) {
			t.Errorf("%s = %q (%v), want it to contain %q", c.expr, got, err, c.want)
		}
	}
	// Live: the next iteration's paths replace these.
	mu.Lock()
	pipe = fakePipeline()
	pipe.Iteration = 42
	mu.Unlock()
	srv.Notify()
	browsertest.WaitJS(t, ctx, `document.getElementById('paths-iter').textContent === '42'`, 10*time.Second)
	browsertest.Screenshot(t, ctx, "status-page-pipeline")
	// Without a pipeline the card stays hidden.
	mu.Lock()
	pipe = nil
	mu.Unlock()
	srv.Notify()
	browsertest.WaitJS(t, ctx, `document.getElementById('pipeline-card').hidden`, 10*time.Second)
	if errs := consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
}
