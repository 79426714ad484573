package demo

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/skein-ml/skein/bootstrap/status"
)

// The staged demo (`skein demo --stages S`): the same bootstrap and
// `skein node join` processes as the data-parallel demo, with a manifest
// whose [pipeline] section splits the model into stages. The bootstrap
// places the volunteers (bootstrap/stageplan.go); halfway, every volunteer
// of one stage is killed -9 and as many new ones start; the bootstrap
// re-plans, and the volunteers it puts in the lost stage rebuild it with
// CheckFree from its neighbours (node/staged.go). The demo reads the run
// back from the status API and from the volunteers' logs (stage 0's loss:
// a staged run has no validation loss yet). With Config.Hostile (a staged
// mode) hostile volunteers join too, and the demo ends by checking the
// run's invariants (staged_hostile.go).

// StagedConfig configures RunStaged. Config.Manifest must be staged
// (pipeline.stages > 1); Config.Volunteers is not used, nor the chaos
// monkey's settings; Config.Hostile, when set, names a staged hostile
// mode (staged-grad or checkfree-norm), played by HostileCount volunteers
// beside the honest ones.
type StagedConfig struct {
	Config
	// Replicas is the volunteers started per stage: Stages x Replicas in
	// all (the bootstrap decides where each goes).
	Replicas int
	// FailStage is the stage whose volunteers are all killed halfway
	// (through Iterations, else Duration); -1: none. With hostile
	// volunteers the demo may kill another stage (failStage).
	FailStage int
	// Iterations ends the run once the volunteers are past this many
	// iterations and the lost stage has trained a round again (0: at
	// Duration or ctx).
	Iterations int
}

// StagedResult summarizes a staged demo.
type StagedResult struct {
	StatusURL          string
	Iterations         uint64  // the latest the volunteers announced
	LossStart, LossEnd float64 // stage 0's training loss in the first and last rounds (NaN if none)
	TokensTrained      uint64
	BytesSent          uint64
	Wall               time.Duration
	Pipeline           *status.Pipeline // the stages and their members at the end
	// The lost stage (FailStage >= 0 and the run got halfway): the
	// volunteers killed, the iteration then and the loss just before, how
	// the new volunteers rebuilt it (in their words), and how long after
	// the kill one of them finished its first round (0: not within the run).
	LostStage  int
	Killed     []string
	KilledAt   uint64
	LossBefore float64
	Rebuild    string
	Recovered  time.Duration

	VolunteerLogs []string // the honest volunteers'
	HostileLogs   []string
	BootstrapLog  string

	// With hostile volunteers (Config.Hostile): what they did and the
	// invariants checked.
	Hostile    *StagedHostile
	Invariants []Invariant
}

// Lines of a staged volunteer's log (node/staged.go) the demo reads.
var (
	stageLine   = regexp.MustCompile(`stage plan \d+: stage (\d+) of`)
	rebuildLine = regexp.MustCompile(`stage \d+ was lost[^\n]*`)
	roundLine   = regexp.MustCompile(`iteration \d+ \(round \d+\): stage (\d+)`)
	lossLine    = regexp.MustCompile(`iteration (\d+) \(round \d+\): stage 0, loss ([0-9.]+)`)
)

// judgedRounds is how many rounds of stage-0 losses a staged run with
// hostile volunteers needs for its "loss still falling" invariant (the
// means of the first and last quarter); judgeWait how long past its end
// the run goes on for them.
const (
	judgedRounds = 4
	judgeWait    = 2 * time.Minute
)

// recoverWait is how long past the kill RunStaged waits, once the run is
// past Iterations, for the lost stage to train a round again.
const recoverWait = 3 * time.Minute

// RunStaged starts the bootstrap and Stages x Replicas volunteers, kills
// the fail stage's volunteers halfway and starts new ones, shows the run's
// progress until Iterations, Duration or ctx, stops every child and
// returns the summary.
func RunStaged(ctx context.Context, cfg StagedConfig) (*StagedResult, error) {
	S := cfg.Manifest.Pipeline.Stages
	switch {
	case S < 2:
		return nil, fmt.Errorf("%w: pipeline.stages = %d; a staged demo needs 2 or more", ErrConfig, S)
	case cfg.Replicas < 1:
		return nil, fmt.Errorf("%w: %d replicas per stage; want 1 or more", ErrConfig, cfg.Replicas)
	case cfg.FailStage >= S || cfg.FailStage < -1:
		return nil, fmt.Errorf("%w: fail stage %d of a %d-stage run", ErrConfig, cfg.FailStage, S)
	case cfg.Binary == "" || cfg.Dir == "":
		return nil, fmt.Errorf("%w: binary %q and directory %q are required", ErrConfig, cfg.Binary, cfg.Dir)
	case cfg.Iterations < 0:
		return nil, fmt.Errorf("%w: %d iterations", ErrConfig, cfg.Iterations)
	case cfg.HostileCount < 0 || cfg.hostiles() >= S*cfg.Replicas:
		return nil, fmt.Errorf("%w: %d hostile volunteers with %d honest ones; the hostile ones must be fewer", ErrConfig, cfg.hostiles(), S*cfg.Replicas)
	}
	if err := cfg.Manifest.CheckStaged(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	began := time.Now()
	res := &StagedResult{LossStart: math.NaN(), LossEnd: math.NaN(), LossBefore: math.NaN(), LostStage: cfg.FailStage,
		BootstrapLog: filepath.Join(cfg.Dir, "bootstrap.log")}
	var kids children
	defer kids.stop(out)
	addr, netFlags, err := cfg.startBootstrap(ctx, &kids, out, (S+1)*cfg.Replicas+cfg.hostiles(), &res.StatusURL)
	if err != nil {
		return nil, err
	}
	H := uint64(cfg.Manifest.Optimizer.InnerSteps)
	fmt.Fprintf(out, "starting %d volunteers for %d stages x %d replicas (logs in %s); links emulated at %g Mbit/s, %v one way\n",
		S*cfg.Replicas, S, cfg.Replicas, cfg.Dir, cfg.RateMbit, cfg.Latency)
	type volunteer struct {
		c   *child
		log string
	}
	var vols []volunteer
	join := func() error {
		name := fmt.Sprintf("volunteer-%d", len(vols)+1)
		log := filepath.Join(cfg.Dir, name+".log")
		c, err := kids.start(cfg.Binary, log, false, cfg.joinArgs(addr, name, netFlags)...)
		if err == nil {
			vols, res.VolunteerLogs = append(vols, volunteer{c, log}), append(res.VolunteerLogs, log)
		}
		return err
	}
	for range S * cfg.Replicas {
		if err := join(); err != nil {
			return nil, err
		}
	}
	var hostile []hostileVolunteer
	for i := range cfg.hostiles() {
		name := "volunteer-hostile"
		if i > 0 {
			name = fmt.Sprintf("volunteer-hostile-%d", i+1)
		}
		log := filepath.Join(cfg.Dir, name+".log")
		fmt.Fprintf(out, "starting a hostile volunteer (%s; log %s)\n", cfg.Hostile, log)
		if _, err := kids.start(cfg.Binary, log, false, cfg.joinArgs(addr, name, netFlags, "--hostile", cfg.Hostile)...); err != nil {
			return nil, err
		}
		hostile, res.HostileLogs = append(hostile, hostileVolunteer{name: name, log: log}), append(res.HostileLogs, log)
	}
	if cfg.Hostile != "" {
		res.Hostile = &StagedHostile{Mode: cfg.Hostile}
	}
	// fresh are the volunteers started after the kill, killedAt its time;
	// trained is how many rounds of the lost stage each volunteer's log
	// showed then (a round more is the lost stage training again, whoever
	// the bootstrap put in it).
	var fresh []volunteer
	var killedAt time.Time
	trained := map[string]int{}
	lostRounds := func(b []byte) int {
		n := 0
		for _, m := range roundLine.FindAllSubmatch(b, -1) {
			if string(m[1]) == strconv.Itoa(res.LostStage) {
				n++
			}
		}
		return n
	}
	kill := func(snap status.Snapshot) error {
		if res.Hostile != nil {
			// Not a stage with a hostile member; for checkfree-norm, one
			// rebuilt from a hostile member's stage.
			var held []int
			for _, h := range hostile {
				if s := readHostile(h.name, h.log).stage; s >= 0 {
					held = append(held, s)
				}
			}
			res.LostStage, res.Hostile.Note = failStage(cfg.FailStage, S, cfg.Manifest.Pipeline.CheckFreePlus, cfg.Hostile, held)
			if res.LostStage != cfg.FailStage {
				fmt.Fprintf(out, "hostile volunteers in stages %v: stage %d is the one lost instead of %d\n", held, res.LostStage, cfg.FailStage)
			}
			if res.Hostile.Note != "" {
				fmt.Fprintf(out, "hostile volunteers in stages %v: %s\n", held, res.Hostile.Note)
			}
		}
		for _, v := range vols {
			b, _ := os.ReadFile(v.log)
			trained[v.log] = lostRounds(b)
			if lastStage(b) != res.LostStage {
				continue
			}
			v.c.killed.Store(true)
			if v.c.cmd.Process.Signal(syscall.SIGKILL) == nil {
				res.Killed = append(res.Killed, strings.TrimSuffix(v.c.name, ".log"))
			}
		}
		_, res.LossBefore = losses(res.VolunteerLogs)
		killedAt, res.KilledAt = time.Now(), snap.Pipeline.Iteration
		if len(res.Killed) == 0 {
			fmt.Fprintf(out, "iteration %d: no volunteer holds stage %d; nothing killed\n", res.KilledAt, res.LostStage)
			return nil
		}
		fmt.Fprintf(out, "iteration %d: stage %d lost: kill -9 %s; starting %d new volunteers\n",
			res.KilledAt, res.LostStage, strings.Join(res.Killed, ", "), len(res.Killed))
		for range res.Killed {
			if err := join(); err != nil {
				return err
			}
			fresh = append(fresh, vols[len(vols)-1])
		}
		return nil
	}

	var deadline, halfway <-chan time.Time
	if cfg.Duration > 0 {
		t, h := time.NewTimer(cfg.Duration), time.NewTimer(cfg.Duration/2)
		defer t.Stop()
		defer h.Stop()
		deadline, halfway = t.C, h.C
	}
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	var last status.Snapshot
	var shown uint64
	plan, half := "", false
	var reachedAt time.Time // when the run first met its end but for judgedRounds
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
			// With hostile volunteers an exit is judged at the end (a
			// volunteer's): the run goes on without it.
			if res.Hostile == nil || strings.Contains(err.Error(), filepath.Base(res.BootstrapLog)) {
				return res, err
			}
			if strings.Contains(err.Error(), "volunteer-hostile") {
				res.Hostile.HostileExits = append(res.Hostile.HostileExits, err.Error())
			} else {
				res.Hostile.Crashes = append(res.Hostile.Crashes, err.Error())
			}
			fmt.Fprintf(out, "%v\n", err)
		case <-halfway:
			half = true
		case <-tick.C:
		}
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		snap, err := status.Fetch(fctx, res.StatusURL)
		cancel()
		if err != nil {
			continue
		}
		last = snap
		if p := describe(snap.Pipeline); p != plan && p != "" {
			plan = p
			fmt.Fprintf(out, "stages: %s\n", p)
		}
		if snap.Pipeline == nil {
			continue
		}
		// Progress at every H iterations: the volunteers' iteration (they
		// gossip it), stage 0's loss from their logs.
		if it := snap.Pipeline.Iteration; it/H > shown {
			shown = it / H
			loss := "-"
			if _, l := losses(res.VolunteerLogs); !math.IsNaN(l) {
				loss = fmt.Sprintf("%.4f", l)
			}
			fmt.Fprintf(out, "iteration %d: train loss %s, %d volunteers online, %.1f MB sent\n",
				it, loss, max(snap.MembersOnline-1, 0), float64(snap.BytesSent)/1e6)
		}
		half = half || cfg.Iterations > 0 && snap.Pipeline.Iteration >= uint64(cfg.Iterations/2)
		if half && cfg.FailStage >= 0 && killedAt.IsZero() {
			if err := kill(snap); err != nil {
				return res, err
			}
		}
		for _, v := range vols {
			if killedAt.IsZero() {
				break
			}
			if v.c.killed.Load() {
				continue
			}
			b, _ := os.ReadFile(v.log)
			if m := rebuildLine.Find(b); m != nil && res.Rebuild == "" {
				res.Rebuild = string(m)
				fmt.Fprintf(out, "%s: %s, %.1fs after the kill\n", strings.TrimSuffix(v.c.name, ".log"), m, time.Since(killedAt).Seconds())
			}
			// A round of the lost stage, by whichever volunteer the
			// bootstrap put in it: the new ones may be placed elsewhere.
			if res.Recovered == 0 && lostRounds(b) > trained[v.log] {
				res.Recovered = time.Since(killedAt)
				fmt.Fprintf(out, "%s finished its first round in the rebuilt stage %.1fs after the kill\n", strings.TrimSuffix(v.c.name, ".log"), res.Recovered.Seconds())
			}
		}
		// The end, once the lost stage trains again: the demo is about
		// that; or recoverWait after the kill if it does not. A run whose
		// invariants are judged also waits (judgeWait at most) for stage
		// 0 to have reported judgedRounds losses: a re-plan starts the
		// stages at a later iteration, so the rounds it skips report
		// nothing, and a loaded machine can leave too few to judge by
		// Iterations.
		if cfg.Iterations > 0 && snap.Pipeline.Iteration >= uint64(cfg.Iterations) &&
			(len(fresh) == 0 || res.Recovered > 0 || time.Since(killedAt) > recoverWait) {
			first := reachedAt.IsZero()
			if first {
				reachedAt = time.Now()
			}
			n := judgedRounds // only a judged run counts them
			if res.Hostile != nil {
				n = lossRounds(res.VolunteerLogs)
			}
			if n < judgedRounds {
				if time.Since(reachedAt) < judgeWait {
					if first {
						fmt.Fprintf(out, "iteration %d reached with %d of stage 0's rounds reported: waiting for %d to judge the run\n",
							snap.Pipeline.Iteration, n, judgedRounds)
					}
					continue
				}
				fmt.Fprintf(out, "stage 0 reported %d rounds in the %v past iteration %d\n", n, judgeWait, cfg.Iterations)
			}
			if len(fresh) > 0 && res.Recovered == 0 {
				fmt.Fprintf(out, "the lost stage did not train a round within %v of the kill\n", recoverWait)
			}
			fmt.Fprintf(out, "iteration %d reached: stopping the volunteers\n", snap.Pipeline.Iteration)
			break watch
		}
	}
	if snap, err := status.Fetch(context.Background(), res.StatusURL); err == nil {
		last = snap
	}
	kids.stop(out)
	res.Wall = time.Since(began)
	res.TokensTrained, res.BytesSent, res.Pipeline = last.TokensTrained, last.BytesSent, last.Pipeline
	if last.Pipeline != nil {
		res.Iterations = last.Pipeline.Iteration
	}
	res.LossStart, res.LossEnd = losses(res.VolunteerLogs)
	if res.Hostile != nil {
		var read []hostileVolunteer
		for _, h := range hostile {
			h = readHostile(h.name, h.log)
			res.Hostile.Names, res.Hostile.Stages = append(res.Hostile.Names, h.name), append(res.Hostile.Stages, h.stage)
			read = append(read, h)
		}
		res.Invariants = stagedInvariants(res, read, res.VolunteerLogs, &kids)
	}
	for _, v := range res.Invariants {
		if !v.OK {
			return res, fmt.Errorf("%w: %s (%s)", ErrInvariant, v.Name, v.Detail)
		}
	}
	return res, nil
}

// describe is a pipeline card in one line: each stage's members, and how
// it was last rebuilt.
func describe(p *status.Pipeline) string {
	if p == nil {
		return ""
	}
	var parts []string
	for _, s := range p.Stages {
		part := fmt.Sprintf("%d: %s", s.Stage, strings.Join(s.Replicas, " "))
		if s.Rebuilt != "" {
			part += " (rebuilt by " + s.Rebuilt + ")"
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, " | ")
}

// losses reads stage 0's training loss in the first and the latest rounds
// any of logs reports (NaN if none).
// lossRounds is how many iterations the logs hold a stage-0 loss for.
func lossRounds(logs []string) int {
	seen := map[string]bool{}
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		for _, m := range lossLine.FindAllSubmatch(b, -1) {
			seen[string(m[1])] = true
		}
	}
	return len(seen)
}

func losses(logs []string) (first, last float64) {
	first, last = math.NaN(), math.NaN()
	lo, hi := uint64(math.MaxUint64), uint64(0)
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		for _, m := range lossLine.FindAllSubmatch(b, -1) {
			it, _ := strconv.ParseUint(string(m[1]), 10, 64)
			loss, err := strconv.ParseFloat(string(m[2]), 64)
			if err != nil {
				continue
			}
			if it < lo {
				lo, first = it, loss
			}
			if it >= hi {
				hi, last = it, loss
			}
		}
	}
	return first, last
}

// Summary is the staged demo's closing report.
func (r *StagedResult) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "summary after %v:\n", r.Wall.Round(time.Second))
	fmt.Fprintf(&b, "  train loss       %.4f -> %.4f over %d iterations (stage 0's)\n", r.LossStart, r.LossEnd, r.Iterations)
	fmt.Fprintf(&b, "  tokens trained   %d\n", r.TokensTrained)
	fmt.Fprintf(&b, "  bytes sent       %.1f MB (activations, gradients and each stage's DiLoCo)\n", float64(r.BytesSent)/1e6)
	fmt.Fprintf(&b, "  stages           %s\n", describe(r.Pipeline))
	if len(r.Killed) > 0 {
		back := "not within the run"
		if r.Recovered > 0 {
			back = fmt.Sprintf("%.1fs later", r.Recovered.Seconds())
		}
		fmt.Fprintf(&b, "  lost stage       stage %d: %s killed -9 at iteration %d (train loss %.4f); %s; its first round done %s\n",
			r.LostStage, strings.Join(r.Killed, ", "), r.KilledAt, r.LossBefore, cmp.Or(r.Rebuild, "not rebuilt"), back)
	}
	if h := r.Hostile; h != nil {
		var where []string
		for i, n := range h.Names {
			where = append(where, fmt.Sprintf("%s in stage %d", n, h.Stages[i]))
		}
		fmt.Fprintf(&b, "hostile: %s (%s)", h.Mode, strings.Join(where, ", "))
		switch {
		case h.Mode == hostileCheckFreeNorm:
			fmt.Fprintf(&b, "; served its lies %d times", h.Lies)
		case !h.Sent:
			fmt.Fprint(&b, "; the attack was not sent")
		}
		fmt.Fprintf(&b, "; the honest volunteers logged the hostile one %d times", h.Offenders)
		if len(h.HostileExits) > 0 {
			fmt.Fprintf(&b, "; it exited: %s", strings.Join(h.HostileExits, "; "))
		}
		fmt.Fprintln(&b)
		fmt.Fprintln(&b, "invariants:")
		for _, v := range r.Invariants {
			mark := "ok  "
			if !v.OK {
				mark = "FAIL"
			}
			fmt.Fprintf(&b, "  %s %s (%s)\n", mark, v.Name, v.Detail)
		}
	}
	return b.String()
}
