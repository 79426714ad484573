package optimizer

import (
	"slices"

	"github.com/skein-ml/skein/transport"
)

// Silent members: suspension with backoff (butterfly.go).
//
// A member that says READY, is put in the group and then sends nothing (or
// only some of what it owes) is not provably hostile: a link that died or a
// process paused just after READY looks the same, so the bans for provable
// offences do not apply. Yet every honest member waits for it until the
// phase deadlines, round after round: in the simulation
// (TestButterflyMuteSuspended) a round of five honest members takes 5
// ticks; with one mute member it took 35, then 115 ticks every round (the
// gather deadline learnt from the stalled gathers), and over real drivers
// (TestButterflyDriverMute) 8 s against 10 ms. So each member keeps its own
// record of the members that went silent in its groups, and leaves them
// out of groups for a while.
//
// Observation. At the end of a round that succeeded for it, a member of the
// group counts another member j silent when j was in the group, had said
// READY to it from the group's state, and j's input to a part this member
// owns had not come when it aggregated that part (every member owns parts,
// so it hears from every other one). Only inputs count: a member sends its
// parts the moment it takes the group, so a missing one is its sender's
// doing (or its link's), where an owner's list or aggregate may be late
// because that owner waited in turn for a missing input (counting those
// made the honest co-owners of a mute member look silent). It is this
// member's own observation, never another member's word: no member can
// make it count an honest member silent but by delaying that member's
// parts to it.
//
// Record. A silent round adds a strike and suspends j for the next
// silentBase<<(strikes-1) rounds, at most silentMax; a round in which all
// of j's inputs came ends its suspension at once, and every silentForgive
// such rounds in a row take one strike away. A mute member thus costs one
// stalled round, then one every 2, 3, 5, 9, ... rounds, then one every
// silentMax+1 (its probation: back in the groups and waited for in full);
// a member slow once misses the next group only; one that alternates
// (silent, then contributing on probation) still climbs the backoff.
// Silence is only counted in rounds where this member waited for j in full
// (j not suspended by it when the round started).
//
// Effect. Where groups form, as bans do (on the first attempt of a round
// only, so that members that disagree lose at most that attempt):
//   - A leader leaves the members it suspends out of the groups it forms
//     (they are sent the group and fetch the result, as any member left
//     out does), unless the others could not make a majority without them.
//   - A member does not follow a leader it suspends (candidate skips it)
//     and ignores the groups it signs, unless the candidate it follows
//     instead took that group and relays it (acceptGroup's echo): then it
//     takes it too, rather than sit out a round its candidate is in.
//     Otherwise a mute member would lead, with itself in the group, every
//     round it ranks first.
//
// Within a round, only this member's own waits: as an owner it does not
// wait for the inputs of members it suspends, nor for a suspended
// co-owner's list, once it holds inputs from a majority of the group. That
// makes its messages no later than a slow link would; the aggregate takes
// whatever arrived, and the cross-check and audit decide as for any
// schedule. It never waits less for an aggregate or an audit (deciding on
// one owner's aggregate before the other's came is what splits members).
// Nor does it learn phase durations from a round that started while it
// suspended someone (observeIf), nor gather durations from a round in
// which a member sent it no input at all (someoneMute): both would tune
// its deadlines to rounds without the silent member, and the next round
// with it would find them too short.
//
// When members disagree. The group is fixed and signed before any
// contribution moves, so whatever each member suspends, every member of a
// round reports the same group; suspension changes who is in the group,
// never the round's rules. Members that saw the same silence (a mute
// member is silent to all) suspend it in the same round. Members that
// disagree (one that restarted, or one to which the member is silent while
// it is not to others) follow different leaders only when the first-ranked
// is suspended by some: then at most one of the two groups finishes (the
// majority rule), and the next attempt ignores suspensions.
//
// Breakdown. A silent member still costs its probation rounds. One that
// withholds its inputs from some owners only is held silent by those only,
// which leave it out of the groups they lead and do not wait for it, while
// the others keep waiting; one that sends its inputs but no aggregate, list
// or answer as an owner is not counted at all (the co-owner's aggregate is
// then taken after the gather deadlines, as when an owner dies). Records
// are per member: a member that restarts, or a silent member that leaves
// the membership and comes back, starts with none. A hostile leader can
// put a member in its group that did not take it (one that accepted
// another leader's group of the same attempt): that member then looks
// silent to the group that finished, and misses one group.

// Suspension parameters, in rounds.
const (
	silentBase    = 1  // rounds suspended after the first silent round
	silentMax     = 16 // the longest suspension
	silentForgive = 4  // contributing rounds in a row that take a strike away
	// silentMaxStrikes bounds the strikes: silentBase<<(silentMaxStrikes-1)
	// is past silentMax already.
	silentMaxStrikes = 8
)

// bfSilence is this member's record of another member's silences.
type bfSilence struct {
	strikes int    // silent rounds, less one per silentForgive good rounds
	good    int    // contributing rounds since the last strike or forgiveness
	until   uint64 // suspended up to and including this round
}

// suspended reports whether this member suspends p for round.
func (b *Butterfly) suspended(p transport.PeerID, round uint64) bool {
	s := b.silent[p]
	return p != b.self && s != nil && round <= s.until
}

// excludes reports whether p is kept out of the groups of attempt of round:
// suspensions act on the first attempt only, so that members that disagree
// on them lose at most one attempt (butterfly_silence.go).
func (b *Butterfly) excludes(p transport.PeerID, round uint64, attempt uint32) bool {
	return attempt <= 1 && b.suspended(p, round)
}

// owed sorts the other members of round c's group by their inputs to the
// parts this member owns: missing holds those with an input that had not
// come when this member aggregated the part, heard those with one that had
// (a refused input came too). Only inputs: see Observation above.
func (b *Butterfly) owed(c *bfRound) (missing, heard map[transport.PeerID]bool) {
	missing, heard = map[transport.PeerID]bool{}, map[transport.PeerID]bool{}
	for _, o := range c.owned {
		for i, p := range c.group {
			switch {
			case p == b.self:
			case o.inputs[uint32(i)] != nil || o.refused[uint32(i)]:
				heard[p] = true
			default:
				missing[p] = true
			}
		}
	}
	return missing, heard
}

// someoneMute reports whether a member of round c's group sent this member
// none of its inputs: the gather then waited on deadlines (for that
// member's aggregates), not on the network, and its duration would teach
// the gather estimator to wait longer every round (35, then 115 ticks a
// round in TestButterflyMuteSuspended before this).
func (b *Butterfly) someoneMute(c *bfRound) bool {
	missing, heard := b.owed(c)
	for p := range missing {
		if !heard[p] && !b.gone(p) {
			return true
		}
	}
	return false
}

// observeSilence updates the record at the end of round c, which succeeded
// and in which this member was in the group.
func (b *Butterfly) observeSilence(c *bfRound) {
	silent, _ := b.owed(c)
	for _, p := range c.group {
		r, ok := c.readies[p]
		if p == b.self || b.gone(p) || !ok || r.hash != c.stateHash {
			continue // not known to be in this round, or gone: no evidence
		}
		s := b.silent[p]
		switch {
		case !silent[p]:
			if s == nil {
				continue
			}
			s.until = 0
			if s.good++; s.good >= silentForgive {
				s.strikes, s.good = s.strikes-1, 0
			}
			if s.strikes <= 0 {
				delete(b.silent, p)
			}
		case c.suspects[p]:
			// Not waited for in full: its silence may be this member's
			// impatience.
		default:
			if s == nil {
				s = &bfSilence{}
				b.silent[p] = s
			}
			s.strikes = min(s.strikes+1, silentMaxStrikes)
			s.good = 0
			s.until = c.round + uint64(min(silentBase<<(s.strikes-1), silentMax))
		}
	}
	for p, s := range b.silent {
		if s.until < c.round && !slices.Contains(b.view, p) {
			delete(b.silent, p)
		}
	}
}
