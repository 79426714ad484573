package demo

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/skein-ml/skein/bootstrap/status"
	"github.com/skein-ml/skein/manifest"
)

// Config configures Run: a whole run on one machine, a bootstrap
// and Volunteers `skein node join` processes on loopback, every link slowed
// by the WAN emulator so that the run shows what the internet costs.
type Config struct {
	// Binary is the skein executable the children run (os.Executable()).
	Binary string
	// Dir holds the children's data directories and logs.
	Dir        string
	Volunteers int
	// Manifest is the run; its corpus is packed into shards by the
	// bootstrap when it is a shards run listing none.
	Manifest manifest.Manifest
	// Corpus is what the bootstrap packs (empty: the Go standard library
	// sources).
	Corpus []string
	// Dataset, if set, is a packed dataset directory (skein data pack) the
	// run trains on instead (bootstrap --dataset).
	Dataset string
	// Duration ends the run (0: until TargetLoss or ctx).
	Duration time.Duration
	// TargetLoss ends the run once the validation loss reaches it (0: none).
	TargetLoss float64
	// RateMbit and Latency are each emulated link's bandwidth and one-way
	// delay; 0 disables that part of the emulation.
	RateMbit float64
	Latency  time.Duration
	// HTTPAddr is where the status page listens (port 0: any free port).
	HTTPAddr string
	// Threads per volunteer.
	Threads int
	// Device is the volunteers' --device (auto, cpu or cuda:N[,options]);
	// empty leaves node join's default (auto: GPU 0 if one answers). The
	// volunteers of one machine share its GPU, a context each.
	Device string
	// LogLevel of the children (their logs go to Dir).
	LogLevel string
	// Out receives the demo's progress and summary.
	Out    io.Writer
	Logger *slog.Logger
	// Started, if set, is called with the status page's URL once it is up.
	Started func(statusURL string)

	// Chaos runs the soak (chaos.go): every ChaosEvery (default 1 min) a
	// ChaosShare of the honest volunteers (default a third) are killed -9
	// and restarted, and between two waves one is paused (SIGSTOP) for
	// ChaosPause (default 20 s). At the end the run's invariants are
	// checked; Run fails with ErrInvariant if one did not hold.
	Chaos      bool
	ChaosEvery time.Duration
	ChaosPause time.Duration
	ChaosShare float64
	ChaosSeed  uint64
	// Hostile adds volunteers that misbehave: scale, signflip, nan, forge,
	// collude, lonejump or telemetry (node join --hostile); HostileCount of
	// them (default 1), a minority of the volunteers.
	Hostile      string
	HostileCount int
}

// DefaultConfig returns the README's demo: 4 volunteers training the
// tiny model on the Go sources (packed into shards that travel with the
// run) with DiLoCo, over 50 Mbit/s links with 30 ms of latency, for three
// minutes.
func DefaultConfig() Config {
	return Config{Volunteers: 4, Manifest: manifest.Demo(), Duration: 3 * time.Minute, RateMbit: 50, Latency: 30 * time.Millisecond,
		HTTPAddr: "127.0.0.1:8080", Threads: 1, LogLevel: "warn"}
}

// Result summarizes a demo run.
type Result struct {
	StatusURL        string
	Rounds           uint64
	ValStart, ValEnd float64 // validation loss of the first and last measured rounds (NaN if none)
	TokensTrained    uint64
	BytesSent        uint64
	FP32DPBytes      uint64 // what fp32 data-parallel training would have sent for the same work
	// BitsPerParam is what a volunteer sent in the last certified round,
	// per parameter (the status page's median; nil when unknown).
	BitsPerParam      *float64
	FirstStep         []time.Duration
	ComputeFraction   []float64 // per volunteer: inner-step time / round wall time
	Wall              time.Duration
	ReachedTargetLoss bool
	VolunteerLogs     []string
	BootstrapLog      string
	// The chaos soak's report and the invariants it checked (Chaos only).
	Chaos      *ChaosReport
	Invariants []Invariant
	// FirstRound: from each honest start (restarts included) to its first
	// computed round.
	FirstRound Restarts
	// Stopped: each child's exit after Ctrl-C (SIGINT) at the end.
	Stopped []Stopped
}

// Run starts the bootstrap and the volunteers, shows the run's progress
// until Duration, TargetLoss or ctx, stops every child (gracefully, then by
// force), and returns the summary. Children die with this process, even
// when it is killed (Linux: parent-death signal).
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Volunteers < 2 {
		return nil, fmt.Errorf("%w: %d volunteers; a run needs at least 2", ErrConfig, cfg.Volunteers)
	}
	if cfg.Binary == "" || cfg.Dir == "" {
		return nil, fmt.Errorf("%w: binary %q and directory %q are required", ErrConfig, cfg.Binary, cfg.Dir)
	}
	if cfg.HostileCount < 0 || cfg.hostiles() >= cfg.Volunteers {
		return nil, fmt.Errorf("%w: %d hostile volunteers with %d honest ones; the hostile ones must be fewer", ErrConfig, cfg.hostiles(), cfg.Volunteers)
	}
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	began := time.Now()
	res := &Result{ValStart: math.NaN(), ValEnd: math.NaN(), BootstrapLog: filepath.Join(cfg.Dir, "bootstrap.log")}
	var kids children
	defer kids.stop(out)
	addr, netFlags, err := cfg.startBootstrap(ctx, &kids, out, cfg.Volunteers+cfg.hostiles(), &res.StatusURL)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "starting %d volunteers (logs in %s); links emulated at %g Mbit/s, %v one way\n",
		cfg.Volunteers, cfg.Dir, cfg.RateMbit, cfg.Latency)
	var honest []*child
	for i := 0; i < cfg.Volunteers; i++ {
		log := filepath.Join(cfg.Dir, fmt.Sprintf("volunteer-%d.log", i+1))
		res.VolunteerLogs = append(res.VolunteerLogs, log)
		c, err := kids.start(cfg.Binary, log, false, cfg.joinArgs(addr, fmt.Sprintf("volunteer-%d", i+1), netFlags,
			"--min-peers", strconv.Itoa(cfg.Volunteers))...)
		if err != nil {
			return nil, err
		}
		honest = append(honest, c)
	}
	for i := range cfg.hostiles() {
		name := "volunteer-hostile"
		if i > 0 {
			name = fmt.Sprintf("volunteer-hostile-%d", i+1)
		}
		log := filepath.Join(cfg.Dir, name+".log")
		fmt.Fprintf(out, "starting a hostile volunteer (%s; log %s)\n", cfg.Hostile, log)
		if _, err := kids.start(cfg.Binary, log, false, cfg.joinArgs(addr, name, netFlags,
			"--min-peers", strconv.Itoa(cfg.Volunteers), "--hostile", cfg.Hostile)...); err != nil {
			return nil, err
		}
	}
	chaosCtx, stopChaos := context.WithCancel(ctx)
	defer stopChaos()
	chaosDone := make(chan struct{})
	if cfg.Chaos {
		res.Chaos = &ChaosReport{}
		m := &chaosMonkey{kids: &kids, honest: honest, every: cmp.Or(cfg.ChaosEvery, time.Minute), pause: cmp.Or(cfg.ChaosPause, 20*time.Second),
			share: cmp.Or(cfg.ChaosShare, 1.0/3), rng: rand.New(rand.NewPCG(cfg.ChaosSeed, 1)), out: out, report: res.Chaos}
		fmt.Fprintf(out, "chaos: every %v, kill -9 and restart %.0f%% of the honest volunteers; pause one for %v between waves\n",
			m.every, 100*m.share, m.pause)
		go func() { defer close(chaosDone); m.run(chaosCtx) }()
	} else {
		close(chaosDone)
	}

	// Watch the run through the status API until it ends.
	var deadline <-chan time.Time
	if cfg.Duration > 0 {
		t := time.NewTimer(cfg.Duration)
		defer t.Stop()
		deadline = t.C
	}
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	var last status.Snapshot
	var shown uint64
	quiet := time.Now()
	var held time.Time // when a round not yet shown was first seen
watch:
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(out, "interrupted: stopping the volunteers")
			break watch
		case <-deadline:
			fmt.Fprintf(out, "%v elapsed: stopping the volunteers\n", cfg.Duration)
			break watch
		case err := <-kids.exited:
			if !cfg.Chaos {
				return res, err
			}
			res.Chaos.Crashes = append(res.Chaos.Crashes, err.Error()) // judged at the end
			fmt.Fprintf(out, "chaos: %v\n", err)
		case <-tick.C:
		}
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		snap, err := status.Fetch(fctx, res.StatusURL)
		cancel()
		if err != nil {
			continue
		}
		last = snap
		// Until the first round lands (the volunteers fetch the corpus, then
		// train a whole inner phase), say what is happening now and then.
		if shown == 0 && snap.Round == 0 && time.Since(quiet) >= 10*time.Second {
			quiet = time.Now()
			fmt.Fprintf(out, "  %s: %d volunteers in the run, fetching the corpus or training the first round (their logs: %s)\n",
				time.Since(began).Round(time.Second), max(snap.MembersOnline-1, 0), cfg.Dir)
		}
		if snap.Round > shown && held.IsZero() {
			held = time.Now()
		}
		// The first line waits for every volunteer's first report, for
		// a while (later reports replace earlier ones: no later wait).
		if snap.Round > shown && (shown > 0 || allReported(snap) || time.Since(held) >= holdAtMost) {
			shown, held = snap.Round, time.Time{}
			val := "-"
			if snap.ValLoss != nil {
				val = fmt.Sprintf("%.4f", *snap.ValLoss)
			}
			fmt.Fprintf(out, "round %d: val loss %s, %d volunteers online, %.0f tokens/s, %.1f MB sent (fp32 data-parallel: %.1f MB)\n",
				snap.Round, val, snap.MembersOnline-1, snap.TokensPerSec, float64(snap.BytesSent)/1e6, float64(snap.FP32DPBytes)/1e6)
			if cfg.TargetLoss > 0 && snap.ValLoss != nil && *snap.ValLoss <= cfg.TargetLoss {
				fmt.Fprintf(out, "validation loss %.4f reached the target %.4f: stopping the volunteers\n", *snap.ValLoss, cfg.TargetLoss)
				res.ReachedTargetLoss = true
				break watch
			}
		}
	}
	stopChaos()
	<-chaosDone
	var hist []status.RoundStats
	var histErr error
	if cfg.Chaos {
		hist, histErr = status.FetchHistory(context.Background(), res.StatusURL, 0, 100000)
	}
	// The summary is the run once the volunteers have left: an overlapped
	// volunteer lands and reports the round in flight as it stops.
	res.Stopped = kids.stopThen(out, func() {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if snap, err := status.Fetch(fctx, res.StatusURL); err == nil {
			last = snap
		}
	})
	res.Wall = time.Since(began)
	res.Rounds, res.TokensTrained, res.BytesSent, res.FP32DPBytes = last.Round, last.TokensTrained, last.BytesSent, last.FP32DPBytes
	res.BitsPerParam = last.BitsPerParam
	for _, p := range last.Curve {
		if p.Val != nil {
			if math.IsNaN(res.ValStart) {
				res.ValStart = *p.Val
			}
			res.ValEnd = *p.Val
		}
	}
	if cfg.Chaos {
		res.Invariants = checkInvariants(hist, histErr, &kids, res.VolunteerLogs, cfg.hostiles(), cfg.Manifest.Optimizer.Kind == manifest.KindNoLoCo, res.Chaos)
		res.Invariants = append(res.Invariants, stopInvariant(res.Stopped))
	}
	res.FirstRound = readRestarts(res.VolunteerLogs)
	first := regexp.MustCompile(`first training step ([0-9.]+)s after starting`)
	compute := regexp.MustCompile(`computing ([0-9.]+)% of the time`)
	for _, l := range res.VolunteerLogs {
		b, _ := os.ReadFile(l)
		if m := first.FindSubmatch(b); m != nil {
			sec, _ := strconv.ParseFloat(string(m[1]), 64)
			res.FirstStep = append(res.FirstStep, time.Duration(sec*float64(time.Second)))
		}
		if m := compute.FindSubmatch(b); m != nil {
			pct, _ := strconv.ParseFloat(string(m[1]), 64)
			res.ComputeFraction = append(res.ComputeFraction, pct/100)
		}
	}
	for _, v := range res.Invariants {
		if !v.OK {
			return res, fmt.Errorf("%w: %s (%s)", ErrInvariant, v.Name, v.Detail)
		}
	}
	return res, nil
}

// startBootstrap writes the run's manifest under cfg.Dir and starts the
// bootstrap among kids, its open admission caps raised to admit members
// volunteers on loopback. It sets *statusURL to the status page's address
// once it is up (saying it on out), and returns the address to join and
// the network flags (listen address, WAN emulator) every child takes.
func (cfg *Config) startBootstrap(ctx context.Context, kids *children, out io.Writer, members int, statusURL *string) (addr string, netFlags []string, err error) {
	// Every process of the demo is on loopback, behind one address prefix:
	// an open run's caps must admit them all (the bootstrap counts).
	if a := &cfg.Manifest.Admission; a.Mode == manifest.AdmissionOpen {
		a.MaxMembers = max(a.MaxMembers, members+1)
		a.MaxPerPrefix = max(a.MaxPerPrefix, members+1)
	}
	if err := cfg.Manifest.ValidateTemplate(); err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg.LogLevel == "" {
		cfg.LogLevel = "warn"
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return "", nil, fmt.Errorf("demo: %w", err)
	}
	runFile := filepath.Join(cfg.Dir, "run.toml")
	if err := os.WriteFile(runFile, cfg.Manifest.Canonical(), 0o644); err != nil {
		return "", nil, fmt.Errorf("demo: %w", err)
	}
	// The bootstrap: its first stdout line is the address to join, and its
	// log says where the status page is.
	netFlags = []string{"--listen", "/ip4/127.0.0.1/udp/0/quic-v1", "--timing", "lan"}
	if cfg.RateMbit > 0 {
		netFlags = append(netFlags, "--emulate-rate", strconv.FormatFloat(cfg.RateMbit, 'g', -1, 64))
	}
	if cfg.Latency > 0 {
		netFlags = append(netFlags, "--emulate-latency", cfg.Latency.String())
	}
	if busy, alt := portInUse(cfg.HTTPAddr); busy {
		fmt.Fprintf(out, "%s is in use; the status page takes a free port instead\n", cfg.HTTPAddr)
		cfg.HTTPAddr = alt
	}
	bsArgs := []string{"--log-level", cfg.LogLevel, "bootstrap", "--manifest", runFile,
		"--data-dir", filepath.Join(cfg.Dir, "bootstrap"), "--http", cfg.HTTPAddr}
	for _, c := range cfg.Corpus {
		bsArgs = append(bsArgs, "--corpus", c)
	}
	if cfg.Dataset != "" {
		bsArgs = append(bsArgs, "--dataset", cfg.Dataset)
	}
	log := filepath.Join(cfg.Dir, "bootstrap.log")
	bs, err := kids.start(cfg.Binary, log, true, append(bsArgs, netFlags...)...)
	if err != nil {
		return "", nil, err
	}
	if addr, err = firstLine(ctx, bs.stdout, 2*time.Minute); err != nil {
		return "", nil, fmt.Errorf("demo: the bootstrap did not start (see %s): %w", log, err)
	}
	if *statusURL, err = waitForLine(ctx, log, regexp.MustCompile(`status page: (\S+)`), 30*time.Second); err != nil {
		return "", nil, fmt.Errorf("demo: the bootstrap printed no status page address (see %s): %w", log, err)
	}
	fmt.Fprintf(out, "status page: %s\n", *statusURL)
	if cfg.Started != nil {
		cfg.Started(*statusURL)
	}
	return addr, netFlags, nil
}

// joinArgs is the command line of the volunteer called name (its data
// directory under cfg.Dir), with extra flags.
func (cfg *Config) joinArgs(addr, name string, netFlags []string, extra ...string) []string {
	args := []string{"--log-level", cfg.LogLevel, "node", "join", "--run-id", cfg.Manifest.RunID, "--bootstrap", addr,
		"--data-dir", filepath.Join(cfg.Dir, name), "--threads", strconv.Itoa(max(cfg.Threads, 1))}
	if cfg.Device != "" {
		args = append(args, "--device", cfg.Device)
	}
	return append(append(args, extra...), netFlags...)
}

// roundLines are the summary's lines about the rounds trained.
func (r *Result) roundLines(b *strings.Builder) {
	fmt.Fprintf(b, "  validation loss  %.4f -> %.4f over %d rounds\n", r.ValStart, r.ValEnd, r.Rounds)
	fmt.Fprintf(b, "  tokens trained   %d\n", r.TokensTrained)
	saved := 0.0
	if r.BytesSent > 0 {
		saved = float64(r.FP32DPBytes) / float64(r.BytesSent)
	}
	bits := ""
	if r.BitsPerParam != nil {
		bits = fmt.Sprintf("; %.2f bits/param a round", *r.BitsPerParam)
	}
	fmt.Fprintf(b, "  bytes sent       %.1f MB (fp32 data-parallel would send %.1f MB: %.0fx more%s)\n",
		float64(r.BytesSent)/1e6, float64(r.FP32DPBytes)/1e6, saved, bits)
	fmt.Fprintf(b, "  first step       %s after each volunteer started\n", durations(r.FirstStep))
	var cf []string
	for _, f := range r.ComputeFraction {
		cf = append(cf, fmt.Sprintf("%.0f%%", 100*f))
	}
	fmt.Fprintf(b, "  computing        %s of each volunteer's time\n", strings.Join(cf, ", "))
	fmt.Fprintf(b, "  first round      %s\n", r.FirstRound)
}

// durations lists ds to a tenth of a second; "none" for none.
func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	var fs []string
	for _, d := range ds {
		fs = append(fs, d.Round(100*time.Millisecond).String())
	}
	return strings.Join(fs, ", ")
}

// Summary is the demo's closing report.
func (r *Result) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "summary after %v:\n", r.Wall.Round(time.Second))
	if r.Rounds == 0 {
		fmt.Fprintf(&b, "  no round finished: the volunteers were still fetching or training the first one (a larger model or --inner-steps needs a longer --duration)\n")
		fmt.Fprintf(&b, "  first step       %s after each volunteer started\n", durations(r.FirstStep))
	} else {
		r.roundLines(&b)
	}
	if w, ok := slowestStop(r.Stopped); ok {
		how := fmt.Sprintf("every volunteer left within %v of Ctrl-C (slowest: %s)", w.After.Round(100*time.Millisecond), w.Name)
		if w.Killed {
			how = fmt.Sprintf("%s did not leave within %v of Ctrl-C and was killed", w.Name, stopWait)
		}
		fmt.Fprintf(&b, "  stop             %s\n", how)
	}
	if c := r.Chaos; c != nil {
		fmt.Fprintf(&b, "chaos: %d kill -9 (%d restarted), %d pauses", c.Kills, c.Restarts, c.Pauses)
		if c.Offenders > 0 {
			fmt.Fprintf(&b, "; the honest volunteers logged the hostile one %d times", c.Offenders)
		}
		fmt.Fprintln(&b)
		fmt.Fprintln(&b, "invariants:")
		for _, v := range r.Invariants {
			mark := "ok  "
			switch {
			case !v.OK:
				mark = "FAIL"
			case v.NotApplicable:
				mark = "n/a "
			}
			fmt.Fprintf(&b, "  %s %s (%s)\n", mark, v.Name, v.Detail)
		}
	}
	return b.String()
}

// children are the demo's processes.
type children struct {
	mu      sync.Mutex
	procs   []*child
	all     []*child // every child ever started, for the leak check
	stopped bool
	exited  chan error
}

type child struct {
	cmd    *exec.Cmd
	stdout io.Reader
	done   chan struct{}
	name   string
	log    string
	bin    string
	args   []string
	// killed: the chaos monkey killed it; its exit is not a crash.
	killed atomic.Bool
	// forced: stop killed it after its wait for a graceful exit.
	forced atomic.Bool
}

// start runs bin with args, its output to logPath (stdout piped instead
// when wantStdout), in its own process group, killed if this process dies.
func (k *children) start(bin, logPath string, wantStdout bool, args ...string) (*child, error) {
	return k.launch(bin, logPath, wantStdout, os.O_TRUNC, args...)
}

// restart starts a stopped child again with the same command line, its
// output appended to the same log.
func (k *children) restart(c *child) (*child, error) {
	return k.launch(c.bin, c.log, false, os.O_APPEND, c.args...)
}

func (k *children) launch(bin, logPath string, wantStdout bool, mode int, args ...string) (*child, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.exited == nil {
		k.exited = make(chan error, 1)
	}
	if k.stopped {
		return nil, fmt.Errorf("demo: the demo is stopping")
	}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|mode, 0o644)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = f
	c := &child{cmd: cmd, done: make(chan struct{}), name: filepath.Base(logPath), log: logPath, bin: bin, args: args}
	var pw *io.PipeWriter
	if wantStdout {
		var r *io.PipeReader
		r, pw = io.Pipe()
		cmd.Stdout = io.MultiWriter(f, pw)
		c.stdout = r
	} else {
		cmd.Stdout = f
	}
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		if pw != nil {
			pw.Close()
		}
		return nil, fmt.Errorf("demo: starting %s: %w", bin, err)
	}
	k.procs = append(k.procs, c)
	k.all = append(k.all, c)
	go func() {
		err := cmd.Wait()
		f.Close()
		if pw != nil {
			pw.Close()
		}
		close(c.done)
		k.mu.Lock()
		stopping := k.stopped
		k.mu.Unlock()
		if !stopping && !c.killed.Load() {
			msg := "exited"
			if err != nil {
				msg = err.Error()
			}
			select { // the first unexpected exit ends the demo; later ones add nothing
			case k.exited <- fmt.Errorf("demo: %s %s before the demo ended; see %s", c.name, msg, c.log):
			default:
			}
		}
	}()
	return c, nil
}

// stopWait is how long stop waits for the children to leave gracefully
// before it kills them.
const stopWait = 15 * time.Second

// stop interrupts every child (they save and leave gracefully), waits up
// to stopWait, then kills what is left. Volunteers go first, the bootstrap
// last.
func (k *children) stop(out io.Writer) []Stopped { return k.stopWithin(out, stopWait, nil) }

// stopThen is stop that calls between once the volunteers have exited
// and before the bootstrap (the first child) is stopped.
func (k *children) stopThen(out io.Writer, between func()) []Stopped {
	return k.stopWithin(out, stopWait, between)
}

// stopWithin is stopThen with another wait (tests).
func (k *children) stopWithin(out io.Writer, wait time.Duration, between func()) []Stopped {
	k.mu.Lock()
	procs := k.procs
	k.procs, k.stopped = nil, true
	k.mu.Unlock()
	if len(procs) == 0 {
		return nil
	}
	stopped := make([]Stopped, len(procs))
	var wg sync.WaitGroup
	for i := len(procs) - 1; i >= 0; i-- {
		if i == 0 && len(procs) > 1 {
			waitAll(procs[1:], wait) // the volunteers' last reports reach the bootstrap
			if between != nil {
				between()
			}
		}
		c := procs[i]
		sent := time.Now()
		c.cmd.Process.Signal(syscall.SIGINT)
		wg.Go(func() {
			select {
			case <-c.done:
				// A child killed below exits too: it did not leave by itself.
				stopped[i] = Stopped{Name: c.name, After: time.Since(sent), Killed: c.forced.Load()}
			case <-time.After(wait + 5*time.Second):
				stopped[i] = Stopped{Name: c.name, After: time.Since(sent), Killed: true}
			}
		})
	}
	if !waitAll(procs, wait) {
		fmt.Fprintf(out, "some children did not stop in %v; killing them\n", wait)
		for _, c := range procs {
			select {
			case <-c.done:
			default:
				c.forced.Store(true)
				c.cmd.Process.Kill()
			}
		}
		waitAll(procs, 5*time.Second)
	}
	wg.Wait()
	return stopped
}

// maxStop is how soon after Ctrl-C a volunteer must have left (issue
// [1/4]): it saves its checkpoint and says goodbye, nothing more.
const maxStop = 5 * time.Second

// stopInvariant: every volunteer left within maxStop of Ctrl-C.
func stopInvariant(st []Stopped) Invariant {
	var slow []string
	for _, s := range st {
		if !strings.HasPrefix(s.Name, "bootstrap") && (s.Killed || s.After > maxStop) {
			slow = append(slow, fmt.Sprintf("%s after %v", s.Name, s.After.Round(100*time.Millisecond)))
		}
	}
	w, _ := slowestStop(st)
	return Invariant{Name: fmt.Sprintf("every volunteer left within %v of Ctrl-C", maxStop), OK: len(slow) == 0,
		Detail: fmt.Sprintf("slowest %v%s", w.After.Round(100*time.Millisecond), listed(slow))}
}

// Stopped is how long a child took to exit after SIGINT (Ctrl-C), and
// whether it had to be killed.
type Stopped struct {
	Name   string
	After  time.Duration
	Killed bool
}

// slowestStop is the volunteer slowest to stop (the bootstrap, stopped
// last and on purpose after the volunteers, is left out).
func slowestStop(st []Stopped) (Stopped, bool) {
	var worst Stopped
	found := false
	for _, s := range st {
		if strings.HasPrefix(s.Name, "bootstrap") {
			continue
		}
		if !found || s.Killed || (!worst.Killed && s.After > worst.After) {
			worst, found = s, true
		}
	}
	return worst, found
}

func waitAll(procs []*child, d time.Duration) bool {
	deadline := time.After(d)
	for _, c := range procs {
		select {
		case <-c.done:
		case <-deadline:
			return false
		}
	}
	return true
}

// firstLine reads one line from r.
func firstLine(ctx context.Context, r io.Reader, d time.Duration) (string, error) {
	ch := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(r).ReadString('\n')
		if err != nil {
			errc <- err
			return
		}
		ch <- strings.TrimSpace(line)
		go io.Copy(io.Discard, r) // keep draining so the child never blocks
	}()
	select {
	case l := <-ch:
		return l, nil
	case err := <-errc:
		return "", err
	case <-ctx.Done():
		return "", ctx.Err()
	case <-time.After(d):
		return "", errors.New("timed out")
	}
}

// waitForLine polls a log file until re matches, and returns its first group.
func waitForLine(ctx context.Context, path string, re *regexp.Regexp, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for {
		b, _ := os.ReadFile(path)
		if m := re.FindSubmatch(b); m != nil {
			return string(m[1]), nil
		}
		if time.Now().After(deadline) {
			return "", errors.New("timed out")
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// portInUse reports whether addr (host:port, a fixed port) cannot be
// listened on, and the same host with any free port to use instead.
func portInUse(addr string) (bool, string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "0" {
		return false, addr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return true, net.JoinHostPort(host, "0")
	}
	ln.Close()
	return false, addr
}

// hostiles is how many hostile volunteers the demo starts.
func (c Config) hostiles() int {
	if c.Hostile == "" {
		return 0
	}
	return max(c.HostileCount, 1)
}

// holdAtMost is how long the first round's progress line waits for every
// online volunteer's first report (allReported) before it is printed
// anyway: a volunteer still fetching the corpus holds it back no longer.
const holdAtMost = 10 * time.Second

// allReported reports whether every online volunteer has sent a report:
// until then the snapshot's tokens/s and bytes count only some of them,
// and the first round's line would understate the run.
func allReported(snap status.Snapshot) bool {
	for _, m := range snap.Members {
		if m.Online && m.Role == "volunteer" && m.TokensPerSec == 0 {
			return false
		}
	}
	return true
}
