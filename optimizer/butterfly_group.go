package optimizer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/skein-ml/skein/transport"
)

// Phase 1 of a butterfly round (butterfly.go): agreeing on the group.

// ---- 1. Group -------------------------------------------------------------

// candidate is the leader this member follows: the first member of the
// round's ranking, from position leaderIdx on, that is not gone. The
// ranking is fixed at Start, so members that agree on who is gone follow
// the same leader.
func (b *Butterfly) candidate(c *bfRound) (transport.PeerID, int) {
	n := len(c.ranked)
	for k := range n {
		pos := (c.leaderIdx + k) % n
		// Banned members are skipped too: following one would cost a leader
		// wait every round it leads. Members that have not banned it follow
		// it; the majority rule keeps the two sides from both finishing.
		// So are suspended ones, on the first attempt: a silent member
		// would put itself in the groups it leads (butterfly_silence.go).
		if p := c.ranked[pos]; !b.gone(p) && !b.Banned(p) && !b.excludes(p, c.round, c.attempt) {
			return p, pos
		}
	}
	return b.self, slices.Index(c.ranked, b.self)
}

// The memory of the run's size (advanceGroup).
const (
	recentWindow        = 4 // successful rounds whose group sizes are remembered
	noGroupBeforeShrink = 2 // rounds in a row without a group before the view alone decides
)

// recentSize is the largest group of the last successful rounds.
func (b *Butterfly) recentSize() int {
	n := 0
	for _, g := range b.recentGroups {
		n = max(n, g)
	}
	return n
}

// waits returns how long a leader waits for stragglers and how long a
// member waits for its leader. Both adapt to how far apart the members'
// READYs arrived in recent rounds (members on slower machines, or busier
// ones, finish their inner phase later), from ReadyWait up to four times
// it, so that a member a few seconds slower is waited for instead of
// losing its inner phase; the leader wait keeps its margin above it.
func (b *Butterfly) waits() (ready, leader int64) {
	ready = b.readyEst.deadline(b.cfg.ReadyWait, b.cfg.ReadyWait, 4*b.cfg.ReadyWait)
	return ready, b.cfg.LeaderWait + ready - b.cfg.ReadyWait
}

// readyResend is how often a member waiting for a group says READY again
// to its leader: a quarter of the ready wait.
func (b *Butterfly) readyResend() int64 { return max(1, b.cfg.ReadyWait/4) }

func (b *Butterfly) advanceGroup(c *bfRound) {
	rw, lw := b.waits()
	if b.now-c.leadSince >= lw {
		c.leaderIdx++
		c.leadSince = b.now
		if c.leaderIdx >= len(c.ranked) {
			b.finish(c, fmt.Errorf("%w: no group formed for round %d", ErrRoundFailed, c.round))
			return
		}
	}
	if l, _ := b.candidate(c); l != b.self {
		// READY is sent to every member at Start, once. A leader whose
		// membership did not list this member yet, and that was not in
		// the round yet, could not keep it (only members' messages are
		// stashed): say it again to the leader every readyResend ticks
		// until a group forms, so that a lost READY costs seconds instead
		// of leaving this member out and waiting for leaders.
		if b.now-c.readyAt >= b.readyResend() {
			c.readyAt = b.now
			var body [8]byte
			binary.LittleEndian.PutUint64(body[:], c.stateHash)
			b.send(l, header{kind: kindReady, round: c.round, step: c.attempt}, body[:])
		}
		return
	}
	// This member leads: wait for the members it sees, but for those it
	// suspends (butterfly_silence.go), unless the others alone could never
	// make a majority.
	out := func(p transport.PeerID) bool { return b.Banned(p) || b.excludes(p, c.round, c.attempt) }
	ready, seen := b.countReady(c, out)
	if 2*seen <= b.groupNeed(seen) {
		out = b.Banned
		ready, seen = b.countReady(c, out)
	}
	// The wait counts from the first READY: a leader that is itself late
	// finds the others waiting and forms the group at once.
	first := b.now
	for _, r := range c.readies {
		first = min(first, r.at)
	}
	waited := b.now - max(first, c.leadSince-lw)
	// Never a group of half the members or fewer: two leaders (one slow,
	// one that took over) could each form one, and the run would split.
	// Two majorities of the same membership share a member, who joins only
	// one of them; the other then lacks a majority of contributions
	// (aggregate) and fails instead of ending with other bits.
	// Nor of half the run's recent size or fewer: a member cut off for a
	// few seconds (paused, or its peers briefly declared dead) sees only
	// itself, and a group of one would fork the run. Only after rounds
	// have failed to form a group several times in a row (most of the run
	// really gone) does the current view alone decide.
	if 2*ready <= b.groupNeed(seen) {
		return
	}
	if ready < seen && waited < rw {
		return
	}
	// The state most ready members start from; ties to this member's.
	count := map[uint64]int{}
	for p, r := range c.readies {
		if !out(p) {
			count[r.hash]++
		}
	}
	best := c.stateHash
	for h, n := range count {
		if n > count[best] || (n == count[best] && h < best && best != c.stateHash) {
			best = h
		}
	}
	var members []transport.PeerID
	att := c.attempt
	for p, r := range c.readies {
		if r.hash == best && !out(p) {
			members = append(members, p)
			att = max(att, r.attempt)
		}
	}
	members = sortedGroup(members)
	body := appendGroupBody(nil, best, members, b.self)
	sig, err := b.cfg.Signer.Sign(groupSigMsg(c.round, att, body))
	if err != nil || len(sig) != sigLen {
		b.finish(c, fmt.Errorf("%w: signing the group: %v", ErrRoundFailed, err))
		return
	}
	body = append(body, sig...)
	for p := range c.readies {
		if p != b.self {
			b.send(p, header{kind: kindGroup, round: c.round, step: att}, body)
		}
	}
	b.acceptGroup(c, att, best, members, body)
}

// groupNeed is the size a leader's group must be a strict majority of when
// it sees seen members (advanceGroup).
func (b *Butterfly) groupNeed(seen int) int {
	if b.noGroupStreak < noGroupBeforeShrink {
		return max(seen, b.recentSize())
	}
	return seen
}

// countReady counts the members this leader waits for (those it sees, and
// those ready that the membership does not list yet), and how many of them
// are ready, leaving out those out says.
func (b *Butterfly) countReady(c *bfRound, out func(transport.PeerID) bool) (ready, seen int) {
	for _, p := range b.view {
		if out(p) {
			continue
		}
		seen++
		if _, ok := c.readies[p]; ok {
			ready++
		}
	}
	for p := range c.readies {
		if !slices.Contains(b.view, p) && !out(p) {
			seen++ // ready, so alive, though the membership does not list it yet
			ready++
		}
	}
	return ready, seen
}

func (b *Butterfly) onGroup(from transport.PeerID, h header, body []byte) {
	c := b.cur
	if h.step < c.attempt || uint64(len(body)) > uint64(maxGroup)*(maxIDLen+2)+64 {
		return
	}
	if c.group != nil && h.step == c.attempt && bytes.Equal(body, c.groupB) {
		return // an echo of ours
	}
	g, err := parseGroup(body)
	if err != nil {
		return
	}
	if !b.cfg.Signer.Verify(g.leader, groupSigMsg(c.round, h.step, g.signed), g.sig) {
		b.offend(from, "forwarded a group with a bad signature")
		return
	}
	if c.group != nil && h.step <= c.attempt {
		// Two different groups signed by one leader for one attempt: the
		// leader split the round. Its two signatures prove it to anyone.
		if h.step == c.attempt && g.leader == c.leader && !bytes.Equal(body, c.groupB) && !b.Banned(g.leader) {
			b.offend(g.leader, "signed two different groups for round %d attempt %d", c.round, h.step)
			// Pass the proof on: members the other group left out never
			// see it otherwise.
			for _, p := range c.group {
				if p != b.self && p != g.leader {
					b.send(p, header{kind: kindGroup, round: c.round, step: h.step}, body)
				}
			}
		}
		return
	}
	// The leader must be one this member would follow: the current
	// candidate or one ranked before it.
	cand, pos := b.candidate(c)
	if rank := slices.Index(c.ranked, g.leader); rank < 0 || b.Banned(g.leader) || (rank > pos+1 && pos+1 < len(c.ranked)) {
		return
	}
	// A leader this member suspends: only when the candidate it follows
	// instead took that group (this is its echo), so as not to sit out a
	// round the candidate is in (butterfly_silence.go).
	if b.excludes(g.leader, c.round, h.step) && from != cand {
		return
	}
	if c.group != nil && slices.Contains(g.members, b.self) == false && c.me >= 0 {
		return // a newer attempt that left us out: keep ours
	}
	b.acceptGroup(c, h.step, g.stateHash, g.members, body)
}

func (b *Butterfly) acceptGroup(c *bfRound, att uint32, stateHash uint64, members []transport.PeerID, signed []byte) {
	c.attempt = att
	b.attempts[c.round] = max(b.attempts[c.round], att)
	c.group, c.groupB, c.groupAt = members, signed, b.now
	if g, err := parseGroup(signed); err == nil {
		c.leader = g.leader
	}
	// Echo the signed group to the others: a leader that sent different
	// groups to different members is caught at once (onGroup), and a
	// member the leader's message missed learns it from the echo.
	if slices.Contains(members, b.self) {
		for _, p := range members {
			if p != b.self && p != c.leader {
				b.send(p, header{kind: kindGroup, round: c.round, step: att}, signed)
			}
		}
	}
	c.gh = bfGroupHash(c.round, att, members)
	c.me = slices.Index(members, b.self)
	c.suspects = map[transport.PeerID]bool{}
	for _, p := range members {
		if b.suspended(p, c.round) {
			c.suspects[p] = true
		}
	}
	if c.me >= 0 && stateHash != c.stateHash {
		c.me = -1
	}
	M := len(members)
	c.parts = make([]bfPart, M)
	for p := range c.parts {
		c.parts[p].a, c.parts[p].b = b.owners(members, uint32(p))
	}
	if stateHash != c.stateHash {
		b.finish(c, fmt.Errorf("%w: the round's group starts from another state", ErrExcluded))
		return
	}
	if c.me < 0 {
		return // left out: advanceLeftOut fetches the result
	}
	c.owned = map[uint32]*bfOwned{}
	for p := range c.parts {
		a, bb := c.parts[p].a, c.parts[p].b
		if a == b.self || bb == b.self {
			o := &bfOwned{p: uint32(p), primary: a == b.self, inputs: map[uint32]*bfInput{}}
			if a == b.self && bb != "" {
				o.co = bb
			} else if bb == b.self {
				o.co = a
			}
			c.owned[uint32(p)] = o
		}
	}
	b.scatter(c)
	b.replay()
}

// owners of part p: members p and p+1 (mod M); the second is "" with one
// replica or one member.
func (b *Butterfly) owners(g []transport.PeerID, p uint32) (transport.PeerID, transport.PeerID) {
	M := uint32(len(g))
	if b.cfg.Replicas < 2 || M < 2 {
		return g[p], ""
	}
	return g[p], g[(p+1)%M]
}
