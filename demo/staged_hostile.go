package demo

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Hostile volunteers in the staged demo (`skein demo --hostile
// staged-grad` or `checkfree-norm`): they join beside the Stages x
// Replicas honest ones and the bootstrap places them like any other. The
// stage killed halfway is then one without a hostile member (its honest
// members would otherwise take the stage's state from the attacker) and,
// for checkfree-norm, one that CheckFree rebuilds from a hostile member's
// stage, whose lies only count there. At the end the demo checks the
// invariants a staged run of strangers must keep (stagedInvariants).

// The staged chaos modes the demo knows by name (node.HostileStagedGrad
// and node.HostileCheckFreeNorm; the demo does not import node).
const (
	hostileStagedGrad    = "staged-grad"
	hostileCheckFreeNorm = "checkfree-norm"
)

// Lines of a staged volunteer's log the hostile demo reads, beside those
// of staged.go.
var (
	joinedLine   = regexp.MustCompile(`joined run "[^"]*" as (\S+);`)
	rollbackLine = regexp.MustCompile(`non-finite gradient: dropping the iteration`)
	// servedLie is a checkfree-norm volunteer serving its lie (node's
	// stagedVolunteer.serve).
	servedLie = regexp.MustCompile(`hostile: serving stage weights for CheckFree`)
)

// hostileVolunteer is what the demo knows of a hostile volunteer from its
// log.
type hostileVolunteer struct {
	name, log string
	id        string // its peer ID ("" until it joined)
	stage     int    // the stage of its last plan; -1: none yet
}

// readHostile reads a hostile volunteer's log.
func readHostile(name, log string) hostileVolunteer {
	h := hostileVolunteer{name: name, log: log, stage: -1}
	b, _ := os.ReadFile(log)
	if m := joinedLine.FindSubmatch(b); m != nil {
		h.id = string(m[1])
	}
	h.stage = lastStage(b)
	return h
}

// lastStage is the stage of the last plan a staged volunteer's log
// reports, -1 if none.
func lastStage(log []byte) int {
	m := stageLine.FindAllSubmatch(log, -1)
	if len(m) == 0 {
		return -1
	}
	s, _ := strconv.Atoi(string(m[len(m)-1][1]))
	return s
}

// checkFreeSources are the stages a rebuild of stage lost of stages
// reads (pipeline.Recover's rule, TestCheckFreeSources): its two
// neighbours for stages 2..S-2; with CheckFree+ (plus) stage 1 copies 2,
// and the last stage copies the one before it (with 3 stages, 1), except
// with 4 stages, where it has no partner. Stage 0 is never rebuilt from
// its neighbours.
func checkFreeSources(lost, stages int, plus bool) []int {
	switch {
	case lost <= 0 || lost >= stages:
		return nil
	case lost >= 2 && lost <= stages-2:
		return []int{lost - 1, lost + 1}
	case !plus || stages < 3:
		return nil
	case lost == 1:
		return []int{2}
	case stages == 4:
		return nil
	}
	return []int{lost - 1}
}

// failStage is the stage to kill halfway when hostile volunteers hold the
// stages in held: want (the configured one) if it holds none of them and,
// for checkfree-norm, is rebuilt from one of their stages; else the first
// stage that is; else want, with why it did not suit.
func failStage(want, stages int, plus bool, mode string, held []int) (int, string) {
	suits := func(s int) bool {
		if s <= 0 || slices.Contains(held, s) {
			return false
		}
		if mode != hostileCheckFreeNorm {
			return true
		}
		return slices.ContainsFunc(checkFreeSources(s, stages, plus), func(f int) bool { return slices.Contains(held, f) })
	}
	if suits(want) {
		return want, ""
	}
	for s := 1; s < stages; s++ {
		if suits(s) {
			return s, ""
		}
	}
	if mode == hostileCheckFreeNorm {
		return want, fmt.Sprintf("no stage free of hostile members is rebuilt from theirs (%v): the CheckFree attack cannot land", held)
	}
	return want, fmt.Sprintf("every stage but 0 holds a hostile member (%v)", held)
}

// leaked lists the children ever started that have not exited, or whose
// process still exists.
func (k *children) leaked() (started int, leaked []string) {
	k.mu.Lock()
	all := k.all
	k.mu.Unlock()
	for _, c := range all {
		select {
		case <-c.done:
		default:
			leaked = append(leaked, fmt.Sprintf("%s (pid %d)", c.name, c.cmd.Process.Pid))
			continue
		}
		if err := syscall.Kill(c.cmd.Process.Pid, 0); err == nil {
			leaked = append(leaked, fmt.Sprintf("%s (pid %d still exists)", c.name, c.cmd.Process.Pid))
		}
	}
	return len(all), leaked
}

// StagedHostile is what the staged demo's hostile volunteers did, as
// their logs and the honest ones' tell.
type StagedHostile struct {
	Mode   string
	Names  []string // the hostile volunteers
	Stages []int    // the stage each was last placed in (-1: never placed)
	// Sent says the attack went out: a staged-grad volunteer was placed
	// and ran a round (its relay poisons every microbatch it is on), a
	// checkfree-norm one served its lies Lies times.
	Sent bool
	Lies int
	// Offenders are the lines of honest logs that name a hostile
	// volunteer as an offender; Rollbacks the honest iterations dropped
	// for a non-finite gradient.
	Offenders, Rollbacks int
	Crashes              []string // unexpected exits of honest volunteers
	HostileExits         []string // unexpected exits of hostile ones
	Note                 string   // why the fail stage could not suit the attack
}

// stagedInvariants judges a staged demo with hostile volunteers once its
// children have stopped: honestLogs are every honest volunteer's (the
// killed and the new ones' included).
func stagedInvariants(res *StagedResult, hostile []hostileVolunteer, honestLogs []string, kids *children) []Invariant {
	h := res.Hostile
	var inv []Invariant
	add := func(name string, ok bool, format string, args ...any) {
		inv = append(inv, Invariant{Name: name, OK: ok, Detail: fmt.Sprintf(format, args...)})
	}
	add("no honest volunteer crashed", len(h.Crashes) == 0, "%d unexpected exits%s", len(h.Crashes), listed(h.Crashes))

	// What the hostile volunteers sent, and what the honest ones said of it.
	var ids []string
	for _, v := range hostile {
		b, _ := os.ReadFile(v.log)
		switch h.Mode {
		case hostileStagedGrad:
			h.Sent = h.Sent || v.stage >= 0 && roundLine.Match(b)
		case hostileCheckFreeNorm:
			h.Lies += len(servedLie.FindAll(b, -1))
			h.Sent = h.Lies > 0
		}
		if v.id != "" {
			ids = append(ids, v.id)
		}
	}
	var losses []float64 // stage 0's, by iteration across the honest logs
	byIter := map[uint64][]float64{}
	for _, l := range honestLogs {
		b, _ := os.ReadFile(l)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "offender=") && slices.ContainsFunc(ids, func(id string) bool { return strings.Contains(line, "offender="+id) }) {
				h.Offenders++
			}
		}
		h.Rollbacks += len(rollbackLine.FindAll(b, -1))
		for _, m := range lossLine.FindAllSubmatch(b, -1) {
			it, _ := strconv.ParseUint(string(m[1]), 10, 64)
			if x, err := strconv.ParseFloat(string(m[2]), 64); err == nil {
				byIter[it] = append(byIter[it], x)
			}
		}
	}
	iters := make([]uint64, 0, len(byIter))
	for it := range byIter {
		iters = append(iters, it)
	}
	slices.Sort(iters)
	for _, it := range iters {
		losses = append(losses, mean(byIter[it]))
	}
	add("honest gradients stayed finite", h.Rollbacks == 0, "%d honest iterations rolled back for a non-finite gradient", h.Rollbacks)
	if q := len(losses) / 4; q >= 1 {
		first, last := mean(losses[:q]), mean(losses[len(losses)-q:])
		ok := last < first && !math.IsNaN(first) && !math.IsInf(last, 0)
		add("honest stage-0 loss finite and still falling", ok, "%.4f -> %.4f (means of the first and last %d of %d reported rounds)", first, last, q, len(losses))
	} else {
		add("honest stage-0 loss finite and still falling", false, "only %d rounds reported", len(losses))
	}
	if len(res.Killed) == 0 {
		add("the lost stage trained again", true, "no stage was killed")
	} else {
		back := "not within the run"
		if res.Recovered > 0 {
			back = fmt.Sprintf("%.1fs after the kill", res.Recovered.Seconds())
		}
		add("the lost stage trained again", res.Recovered > 0, "stage %d: %s; its first round done %s", res.LostStage,
			cmp.Or(res.Rebuild, "not rebuilt"), back)
	}
	if h.Sent {
		add("the offender named in honest logs", h.Offenders > 0, "%d lines name a hostile volunteer", h.Offenders)
	} else {
		add("the offender named in honest logs", true, "the attack was not sent: %s", notSent(h))
	}
	started, leaked := kids.leaked()
	add("no leaked process", len(leaked) == 0, "%d processes started, all gone%s", started, listed(leaked))
	return inv
}

// notSent says why a hostile mode's attack did not go out.
func notSent(h *StagedHostile) string {
	if h.Mode != hostileCheckFreeNorm {
		return "no hostile volunteer was placed and ran a round"
	}
	if h.Note != "" {
		return h.Note
	}
	return "no member rebuilt a stage from a hostile volunteer's"
}
