package optimizer

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/skein-ml/skein/transport"
)

// roundStat is one round of runRounds.
type roundStat struct {
	ticks int64              // until every honest member had its result
	group []transport.PeerID // the group of an honest member that finished it
	tries int                // the most attempts an honest member made
}

// runRounds runs rounds first..last of the simulation's members one after
// another, as volunteers do: every member starts each round at once (a
// hostile member's unfinished round is cancelled), a member whose round
// failed starts it again (up to 3 attempts), one that was behind takes the
// run's state. Every honest member must end every round with the round's
// result or behind, and those with the result must hold the same bits.
// before, if not nil, runs before each round starts.
func runRounds(t *testing.T, s *bfSim, honest []transport.PeerID, first, last uint64, before func(r uint64)) []roundStat {
	t.Helper()
	var out []roundStat
	for r := first; r <= last; r++ {
		if before != nil {
			before(r)
		}
		tries := map[transport.PeerID]int{}
		for _, id := range s.live() {
			s.m[id].Cancel(ErrRoundFailed)
			s.collect(id)
			s.start(id, r, 7)
			tries[id] = 1
		}
		began := s.now
		done := func() bool {
			all := true
			for _, id := range honest {
				res := s.res[id]
				switch {
				case res == nil:
					all = false
				case errors.Is(res.Err, ErrRoundFailed) && tries[id] < 3:
					tries[id]++
					s.start(id, r, 7)
					all = false
				}
			}
			return all
		}
		for s.now-began < 3000 && !done() {
			s.now++
			s.step()
		}
		st := roundStat{ticks: s.now - began}
		var firstOut []float32
		var firstID transport.PeerID
		for _, id := range honest {
			res := s.res[id]
			st.tries = max(st.tries, tries[id])
			switch {
			case res == nil:
				t.Fatalf("round %d: %s has no result after %d ticks", r, id, st.ticks)
			case errors.Is(res.Err, ErrBehind):
				continue
			case res.Err != nil:
				t.Fatalf("round %d: %s: %v after %d tries", r, id, res.Err, tries[id])
			}
			if firstOut == nil {
				firstOut, firstID, st.group = s.out[id], id, res.Group
			} else if !bitsEqual(firstOut, s.out[id]) {
				t.Fatalf("round %d: %s and %s hold different results (attempts %d and %d)", r, firstID, id, s.res[firstID].Attempt, res.Attempt)
			}
		}
		if firstOut == nil {
			t.Fatalf("round %d: no honest member finished it", r)
		}
		out = append(out, st)
	}
	return out
}

func ticksOf(st []roundStat) []int64 {
	out := make([]int64, len(st))
	for i, s := range st {
		out[i] = s.ticks
	}
	return out
}

var fiveIDs = []transport.PeerID{"a", "b", "c", "d", "e"}

// noneSuspends fails when an honest member suspends another honest one.
func noneSuspends(t *testing.T, s *bfSim, honest []transport.PeerID, r uint64) {
	t.Helper()
	for _, id := range honest {
		for _, p := range honest {
			if s.m[id].suspended(p, r) || s.m[id].silent[p] != nil && s.m[id].silent[p].strikes > 0 {
				t.Fatalf("after round %d: %s holds %s silent: %+v", r-1, id, p, *s.m[id].silent[p])
			}
		}
	}
}

// TestButterflyMuteSuspended: four honest members and a mute one (READY,
// then nothing) over 12 rounds, against five honest members (5 ticks a
// round). Without suspension every round waited for the mute member until
// the deadlines: 35 ticks, then 115 a round once the gather deadline had
// learnt from the stalled gathers. Now the first round stalls (35), the
// mute member is left out of the next groups (5 ticks, as without it), and
// only its probation rounds (3, 6 and 11: after 1, 2 and 4 rounds out)
// wait for it again.
func TestButterflyMuteSuspended(t *testing.T) {
	base := ticksOf(runRounds(t, newBFSim(t, 1000, fiveIDs, nil), fiveIDs, 1, 12, nil))
	s := newBFSim(t, 1000, fiveIDs, nil)
	s.m["e"].cfg.Hostile = HostileMute
	honest := fiveIDs[:4]
	sts := runRounds(t, s, honest, 1, 12, func(r uint64) { noneSuspends(t, s, honest, r) })
	mute := ticksOf(sts)
	t.Logf("ticks per round, 5 honest:            %v", base)
	t.Logf("ticks per round, 4 honest and 1 mute: %v", mute)
	honestTicks := slices.Max(base)
	if mute[0] < 3*honestTicks {
		t.Fatalf("the first round took %d ticks: the mute member did not stall it", mute[0])
	}
	var slow, fast []int
	for i, st := range sts {
		if st.ticks > honestTicks+2 {
			slow = append(slow, i+1)
			continue
		}
		fast = append(fast, i+1)
		if slices.Contains(st.group, "e") {
			t.Fatalf("round %d: fast with the mute member in the group %v", i+1, st.group)
		}
	}
	// Round 1, then the probations of rounds 3, 6 and 11.
	if sts[1].ticks > honestTicks+2 || len(slow) > 4 {
		t.Fatalf("slow rounds %v (ticks %v, honest %d)", slow, mute, honestTicks)
	}
	t.Logf("slow rounds %v, fast rounds %v", slow, fast)
}

// TestButterflySlowHonestBack: an honest member whose parts come late (a
// slow link) is suspended, and back in the groups once its parts come in
// time: after one late round it misses one group (and ends that round
// left out, with the same bits); after five late rounds in a row (two of
// which count, rounds 1 and 3: it spent 2, 4 and 5 suspended) it is back
// in the group of round 6 (the test allows 2L+1), and its strikes are
// forgiven by round 15.
func TestButterflySlowHonestBack(t *testing.T) {
	for _, lateRounds := range []uint64{1, 5} {
		t.Run(fmt.Sprint(lateRounds), func(t *testing.T) {
			s := newBFSim(t, 1000, fiveIDs, nil)
			sts := runRounds(t, s, fiveIDs, 1, 14, func(r uint64) {
				s.lagParts["d"] = 0
				if r <= lateRounds {
					s.lagParts["d"] = 60 // past every deadline of the round
				}
			})
			var out []int
			for i, st := range sts {
				if !slices.Contains(st.group, "d") {
					out = append(out, i+1)
				}
			}
			t.Logf("d out of the groups of rounds %v; ticks %v", out, ticksOf(sts))
			back := 2*lateRounds + 1
			for i := back; i <= 14; i++ {
				if !slices.Contains(sts[i-1].group, "d") {
					t.Fatalf("round %d: d still out of the group %v", i, sts[i-1].group)
				}
			}
			if lateRounds == 1 && !slices.Equal(out, []int{2}) {
				t.Fatalf("d out of rounds %v, want [2]", out)
			}
			noneSuspends(t, s, fiveIDs, 15)
		})
	}
}

// TestButterflyMuteSomeFramesNobody: a member whose parts reach only some
// members (a and c never get them) is held silent by those only: b and d
// keep it in the groups they lead, a and c leave it out of theirs and do
// not wait for it while they suspend it (the breakdown of
// butterfly_silence.go). It must not make honest members suspend each
// other, and every round ends with the same bits on every honest member.
func TestButterflyMuteSomeFramesNobody(t *testing.T) {
	s := newBFSim(t, 1000, fiveIDs, nil)
	s.hostile["e"] = "mutesome"
	honest := fiveIDs[:4]
	sts := runRounds(t, s, honest, 1, 12, func(r uint64) { noneSuspends(t, s, honest, r) })
	noneSuspends(t, s, honest, 13)
	t.Logf("ticks per round: %v", ticksOf(sts))
	var holders []transport.PeerID
	for _, id := range honest {
		if s.m[id].silent["e"] != nil {
			holders = append(holders, id)
		}
	}
	if !slices.Equal(holders, []transport.PeerID{"a", "c"}) {
		t.Fatalf("held silent by %v, want the members its parts miss (a, c)", holders)
	}
}

// TestButterflySuspensionDisagree: random link delays (0-3 ticks), a mute
// member or one silent to some, and from round 3 on one honest member
// forgets its record every round (a restart): members disagree on who is
// suspended, leaders differ in whom they leave out, and a suspended
// leader's group meets the next leader's. Every round must still end,
// within three attempts, with the same bits on every honest member that
// finished it.
//
// Over 300 seeds one (217) split a round: a member that forgot its record
// learnt the deadlines of the rounds without the mute member, and took the
// second owner's aggregate alone in the next round with it, while the
// others, which waited for both, took the first owner's (the gather's own
// weakness: TestButterflyLateFirstOwner; the gather now takes the
// aggregate over more inputs). Before suspended rounds stopped feeding the
// deadlines (observeIf) 19 of the 300 split. One (272) still fails a round
// three times: a leader with a slow link sent its list of inputs before
// the others' parts came (its scatter deadline, learnt in rounds it did
// not lead, was shorter than its group and their parts took to go round);
// it finished the round, its co-owners failed it, and the two of them are
// too few for a group (they would re-sync from the state it reached).
func TestButterflySuspensionDisagree(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 10
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { suspensionDisagree(t, seed) })
	}
}

func suspensionDisagree(t *testing.T, seed int) {
	rng := newRand(uint64(seed) + 4242)
	m := 4 + rng.IntN(3)
	var ids []transport.PeerID
	for i := range m {
		ids = append(ids, transport.PeerID(fmt.Sprintf("p%d", i)))
	}
	s := newBFSim(t, 257, ids, nil)
	for _, id := range ids {
		s.delay[id] = int64(rng.IntN(4))
	}
	bad := ids[rng.IntN(m)]
	if rng.IntN(2) == 0 {
		s.m[bad].cfg.Hostile = HostileMute
	} else {
		s.hostile[bad] = "mutesome"
	}
	var honest []transport.PeerID
	for _, id := range ids {
		if id != bad {
			honest = append(honest, id)
		}
	}
	sts := runRounds(t, s, honest, 1, 10, func(r uint64) {
		if r > 2 {
			id := honest[rng.IntN(len(honest))]
			s.m[id].silent = map[transport.PeerID]*bfSilence{}
		}
	})
	if seed < 3 {
		t.Logf("seed %d (M=%d, %s %s%s): ticks %v", seed, m, bad, s.m[bad].cfg.Hostile, s.hostile[bad], ticksOf(sts))
	}
}

// TestButterflyLeftOutFetchesEarly: a member left out of the group while
// ready (here suspended by every other member) takes the group as soon as
// it reaches it and asks the owners for the result, which can be before
// the group reaches an owner (here the leader's message to o is lost, and
// o learns the group from a slower member's echo). The owner answers once
// it takes the group. Before, it dropped the request, and the left-out
// member waited for its fetch deadline (three gather deadlines: it ended
// 18 ticks after the group here) before auditing; over real drivers, the
// mute member of TestButterflyDriverHostile/mute, left out of the second
// round, sat in it until its caller gave up (the test took 38 s instead of
// 8, one run in three).
func TestButterflyLeftOutFetchesEarly(t *testing.T) {
	s := newBFSim(t, 1000, fiveIDs, nil)
	var leader transport.PeerID
	for _, p := range s.m["a"].rank(1) {
		if p != "e" {
			leader = p
			break
		}
	}
	var o transport.PeerID
	for _, p := range fiveIDs {
		if p != leader && p != "e" {
			s.delay[p] = 3 // echoes come late
			if o == "" {
				o = p
			}
		}
		if p != "e" {
			s.m[p].silent["e"] = &bfSilence{strikes: 1, until: 1}
		}
	}
	s.drops = append(s.drops, dropRule{from: leader, to: o, kind: "group"})
	for _, id := range fiveIDs {
		s.start(id, 1, 7)
	}
	// When the last member of the group and the left-out one end.
	var groupDone, leftOutDone int64
	for s.now < 1000 && leftOutDone == 0 {
		s.run(1)
		if groupDone == 0 && s.res["a"] != nil && s.res["b"] != nil && s.res["c"] != nil && s.res["d"] != nil {
			groupDone = s.now
		}
		if s.res["e"] != nil {
			leftOutDone = s.now
		}
	}
	for _, id := range fiveIDs {
		if r := s.res[id]; r == nil || r.Err != nil || r.LeftOut != (id == "e") || !bitsEqual(s.out[id], s.out["a"]) {
			t.Fatalf("%s: %+v", id, r)
		}
	}
	t.Logf("the group ended at tick %d, the left-out member at %d", groupDone, leftOutDone)
	if leftOutDone > groupDone+s.cfg.PhaseWait {
		t.Fatalf("the left-out member ended %d ticks after the group (leader %s, o %s)", leftOutDone-groupDone, leader, o)
	}
}
