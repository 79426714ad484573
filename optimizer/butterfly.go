package optimizer

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"github.com/skein-ml/skein/compression"
)

// The butterfly collective: an I/O-free state machine in the manner of
// etcd-io/raft. It owns no goroutine, clock or socket: the driver feeds it
// received messages (Step), the passage of time (Tick) and the membership
// (SetMembers), and after each call takes what it produced (Ready): messages
// to send and, at the end of a round, the result. Every interleaving of
// deliveries, drops, delays and crashes is therefore a deterministic unit
// test (butterfly_test.go runs scripted scenarios from testdata/butterfly).
//
// One round r of a member with state hash H (the hash of the state the
// round starts from) and contribution x:
//
//  1. Group. The member sends READY(r, H) to every member it sees. The
//     round's leader is the first of the members ranked by a hash of
//     (r, ID); it waits until every member it sees is ready, or until
//     ReadyWait ticks have passed and at least half are, and sends the
//     group: the ready members with the most common H, sorted, signed by
//     the leader. A leader that does not answer within LeaderWait ticks is
//     replaced by the next in rank. The group is fixed before any
//     contribution moves, so every member reports the same group; a member
//     that was not ready in time is left out of the round (not excluded
//     from the run): it fetches the result and applies it like everyone.
//  2. Scatter. The vector is cut into M parts (M the group's size); part p
//     is owned by members p and p+1 (mod M). Every member sends part p of
//     its contribution, signed, to both owners.
//  3. Cross-check of inputs. The two owners exchange the list of signed
//     inputs they hold, and aggregate (RobustConfig: trimmed mean) over
//     the inputs both hold with the same hash. A contributor that signed
//     two different frames for one part equivocated: it is an offender.
//  4. Gather. The first owner sends its aggregate to every member with the
//     list of inputs it used; the second sends the aggregate's SHA-256. A
//     member accepts a part when the two agree. When they disagree it
//     audits: it asks both owners for the signed inputs, recomputes each
//     owner's aggregate from the inputs it declared, and takes the result
//     of the owner whose claim holds; an owner whose claim does not hold
//     is an offender. Every honest member does the same computation on the
//     same signed inputs, so they end with the same bits.
//
// Faults: a member that fails before the group is left out; one that fails
// while sending is left out of the parts it did not deliver (each part's
// owners agree on its inputs); an owner that fails is replaced by its
// co-owner (members fetch the part from it); a part whose two owners both
// fail fails the round (the caller re-syncs or retries with a new
// attempt). A member whose READY arrives after the round finished is told
// so (FINISHED) and catches up from the run's state.
//
// Agreement. A leader never forms a group of half the members it sees or
// fewer, and an owner never aggregates a part from half the group or fewer:
// two leaders of one attempt (a slow one and the one that took over) form
// two majorities of the same membership, which share a member; it joins
// only one, so the other group lacks a majority of contributions and fails
// (its members retry) instead of ending with other bits. Within a round,
// every decision rests on what all members see (messages, signatures, the
// membership), never on a member's own bans, which act only when groups
// form. TestButterflyRandomSchedules checks this over thousands of random
// schedules with a member dying unseen and a hostile one.
//
// What this does not defend: a leader that sends different groups to
// different members splits the round (each side's result is internally
// consistent; the state-hash re-sync repairs it); a part whose two owners
// both collude is unprotected; an owner may leave out honest inputs it
// received (it cannot add or alter any: they are signed); members whose
// views of the membership disagree (a join or a death not yet gossiped)
// can still, rarely, form two majorities of different views, which the
// state-hash re-sync repairs.

// ButterflyConfig configures the collective. Durations are in ticks of the
// driver's clock.
type ButterflyConfig struct {
	// Len is the vector's length; every message is checked against the
	// sizes it implies before anything is allocated.
	Len int
	// Codec encodes the parts and the aggregates (default: per-block
	// min-max uint8).
	Codec compression.Config
	// Robust is the aggregation rule of every part.
	Robust RobustConfig
	// Replicas is the owners per part: 2 cross-checks every aggregate (the
	// default), 1 trusts the single owner (half the bytes, no cross-check).
	Replicas int
	// MaxAbs bounds every element of a decoded contribution or aggregate;
	// a larger or non-finite value makes its producer an offender.
	MaxAbs float32
	// ReadyWait is how long a leader waits for the members it sees to be
	// ready before forming the group with those that are (at least half);
	// LeaderWait how long a member waits for the group before turning to
	// the next leader.
	ReadyWait, LeaderWait int64
	// PhaseWait bounds each later phase (scatter, cross-check, gather)
	// until a duration has been observed; then phases wait for twice the
	// smoothed observed time plus four deviations, clamped to [MinPhase,
	// MaxPhase].
	PhaseWait, MinPhase, MaxPhase int64
	// MaxStashBytes bounds the messages kept for a round or group not yet
	// reached (a quarter of it per sender).
	MaxStashBytes int64
	Signer        Signer
	// Hostile makes this member misbehave, for chaos tests only (skein
	// demo --chaos --hostile): HostileScale sends its contribution times
	// 1000, HostileSignFlip its negation (both well-formed: robust
	// aggregation bounds them), HostilePoison values past every bound,
	// HostileForge tampers with every aggregate it sends. "" is honest.
	Hostile string
}

// The hostile behaviours of ButterflyConfig.Hostile.
const (
	HostileScale    = "scale"
	HostileSignFlip = "signflip"
	HostilePoison   = "poison"
	HostileForge    = "forge"
)

// HostileModes lists them.
var HostileModes = []string{HostileScale, HostileSignFlip, HostilePoison, HostileForge}

var hostileScale = map[string]float32{HostileScale: 1000, HostileSignFlip: -1}

// DefaultButterflyConfig returns WAN-minded defaults for ticks of tick
// (for example 50 ms).
func DefaultButterflyConfig(n int, signer Signer, tickSeconds float64) ButterflyConfig {
	c := compression.DefaultConfig()
	c.Codec = compression.MinMax8
	c.ZstdLevel = 0
	t := func(sec float64) int64 { return max(1, int64(sec/tickSeconds+0.5)) }
	return ButterflyConfig{Len: n, Codec: c, Robust: RobustConfig{Trim: 1}, Replicas: 2, MaxAbs: 1e4,
		ReadyWait: t(5), LeaderWait: t(15), PhaseWait: t(120), MinPhase: t(2), MaxPhase: t(600),
		MaxStashBytes: DefaultMaxStashBytes, Signer: signer}
}

// Validate names the first invalid field.
func (c ButterflyConfig) Validate() error {
	switch {
	case c.Len <= 0:
		return fmt.Errorf("%w: vector length %d", ErrConfig, c.Len)
	case c.Replicas != 1 && c.Replicas != 2:
		return fmt.Errorf("%w: replicas %d must be 1 or 2", ErrConfig, c.Replicas)
	case !(c.MaxAbs > 0):
		return fmt.Errorf("%w: max abs %v must be positive", ErrConfig, c.MaxAbs)
	case c.ReadyWait <= 0 || c.LeaderWait <= c.ReadyWait:
		return fmt.Errorf("%w: ready wait %d must be positive and below leader wait %d", ErrConfig, c.ReadyWait, c.LeaderWait)
	case c.PhaseWait <= 0 || c.MinPhase <= 0 || c.MaxPhase < c.MinPhase:
		return fmt.Errorf("%w: phase waits %d, min %d, max %d", ErrConfig, c.PhaseWait, c.MinPhase, c.MaxPhase)
	case c.MaxStashBytes <= 0:
		return fmt.Errorf("%w: max stash bytes %d must be positive", ErrConfig, c.MaxStashBytes)
	case c.Signer == nil:
		return fmt.Errorf("%w: no signer", ErrConfig)
	case c.Hostile != "" && !slices.Contains(HostileModes, c.Hostile):
		return fmt.Errorf("%w: hostile %q (want one of %v)", ErrConfig, c.Hostile, HostileModes)
	}
	if err := c.Robust.Validate(); err != nil {
		return err
	}
	return c.Codec.Validate()
}

// Envelope is one message for the driver to send.
type Envelope struct {
	To      PeerID
	Payload []byte
}

// Offense names a member caught misbehaving, and how.
type Offense struct {
	Peer   PeerID
	Reason string
}

// RoundResult is the end of one call of Start: Err nil means out holds the
// round's result, the same bits on every member that got one.
type RoundResult struct {
	Round    uint64
	Attempt  uint32
	Group    []PeerID
	LeftOut  bool // this member was not in the group; it fetched the result
	Verified int  // parts whose aggregate was confirmed by two owners or an audit
	Audits   int
	Err      error
}

// Ready is what the machine produced since the last call.
type Ready struct {
	Messages  []Envelope
	Offenses  []Offense
	Result    *RoundResult // non-nil once per Start
	BytesSent int64
}

// Errors a round can end with.
var (
	// ErrBehind: the others finished this round already; take the run's
	// state.
	ErrBehind = errors.New("optimizer: the others finished this round")
	// ErrRoundFailed: the round could not complete (both owners of a part
	// failed, or no group formed); retry or re-sync.
	ErrRoundFailed = errors.New("optimizer: round failed")
)

// Butterfly is the state machine of one member.
type Butterfly struct {
	cfg  ButterflyConfig
	self PeerID
	now  int64
	view []PeerID // sorted, self included
	ban  map[PeerID]string

	enc *compression.Encoder
	dec *compression.Decoder

	cur      *bfRound
	attempts map[uint64]uint32 // last attempt started per round (recent rounds)
	finished map[uint64]*bfFinished
	stash    []bfStashed
	stashed  int64

	scatterEst, gatherEst tickEstimator
	readyEst              tickEstimator // spread of the members' READYs
	recentGroups          []int         // sizes of the last successful rounds' groups
	noGroupStreak         int           // rounds in a row that ended without a group
	ready                 Ready
	scratch               []float32
	arrived               int64 // when the message being stepped arrived
}

type bfStashed struct {
	at   int64 // when it arrived
	from PeerID
	h    header
	body []byte
}

// bfFinished keeps what an owner must still answer after its round ended:
// late fetches and audits.
type bfFinished struct {
	gh    uint64
	group []PeerID
	owned map[uint32]*bfOwned
}

type bfRound struct {
	round     uint64
	attempt   uint32
	stateHash uint64
	x, out    []float32
	started   int64

	readies    map[PeerID]bfReady
	ranked     []PeerID
	leaderIdx  int
	leadSince  int64
	finishedBy map[PeerID]bool

	// the group, once accepted
	group    []PeerID
	gh       uint64
	groupAt  int64
	groupB   []byte // the signed group message, forwarded to late members
	me       int    // index in group, -1 when left out
	owned    map[uint32]*bfOwned
	parts    []bfPart
	gatherAt int64 // when this member finished aggregating its parts
	result   *RoundResult
	fetched  bool
}

type bfReady struct {
	hash    uint64
	attempt uint32
	at      int64 // when it arrived
}

// bfOwned is a part this member aggregates.
type bfOwned struct {
	p         uint32
	primary   bool
	co        PeerID // the co-owner; "" with one replica
	inputs    map[uint32]*bfInput
	coHave    []signedInput
	gotCoHave bool
	sentHave  bool
	done      bool
	frame     []byte // the aggregate, encoded
	decls     []decl
	fetchers  []PeerID // asked for the aggregate before it was done
}

type bfInput struct {
	signedInput
	frame []byte
	vals  []float32
}

// bfPart is this member's view of one part's result.
type bfPart struct {
	a, b             PeerID // owners
	frameA, frameB   []byte
	declA, declB     []decl
	digestB          []byte
	gotDigest        bool
	digestAt         int64
	accepted         []byte
	verified         bool
	audit            bool
	auditA, auditB   []auditInput
	gotAudA, gotAudB bool
	auditAt          int64
	fetchAt          int64
}

// NewButterfly returns the machine of member self.
func NewButterfly(cfg ButterflyConfig, self PeerID) (*Butterfly, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	enc, err := compression.NewEncoder(cfg.Codec)
	if err != nil {
		return nil, err
	}
	dec, err := compression.NewDecoder(cfg.Codec)
	if err != nil {
		enc.Close()
		return nil, err
	}
	return &Butterfly{cfg: cfg, self: self, view: []PeerID{self}, ban: map[PeerID]string{}, enc: enc, dec: dec,
		attempts: map[uint64]uint32{}, finished: map[uint64]*bfFinished{}}, nil
}

// Close releases the codecs.
func (b *Butterfly) Close() {
	b.enc.Close()
	b.dec.Close()
}

// Self is this member's ID.
func (b *Butterfly) Self() PeerID { return b.self }

// Now is the machine's clock, in ticks.
func (b *Butterfly) Now() int64 { return b.now }

// SetMembers sets the members this one sees (self is always included).
func (b *Butterfly) SetMembers(ms []PeerID) {
	b.view = sortedGroup(append(slices.Clone(ms), b.self))
	b.advance()
}

// Ban excludes a member from every later group and ignores its messages.
func (b *Butterfly) Ban(id PeerID, reason string) {
	if id != b.self {
		b.ban[id] = reason
	}
}

// Banned reports whether id is banned.
func (b *Butterfly) Banned(id PeerID) bool { _, ok := b.ban[id]; return ok }

// Busy reports whether a round is in progress.
func (b *Butterfly) Busy() bool { return b.cur != nil && b.cur.result == nil }

// Ready returns and clears what the machine produced.
func (b *Butterfly) Ready() Ready {
	r := b.ready
	b.ready = Ready{}
	return r
}

// Tick advances the clock by one tick.
func (b *Butterfly) Tick() {
	b.now++
	b.arrived = b.now
	b.advance()
}

// Start begins round (a new attempt of it when called again for the same
// round) from the state with hash stateHash, contributing x; the result is
// written into out (len(x) each, not touched by the caller until the
// round's result is out).
func (b *Butterfly) Start(round uint64, stateHash uint64, x, out []float32) error {
	if len(x) != b.cfg.Len || len(out) != b.cfg.Len {
		return fmt.Errorf("%w: vectors of %d and %d elements, want %d", ErrConfig, len(x), len(out), b.cfg.Len)
	}
	if b.Busy() {
		return fmt.Errorf("optimizer: round %d started while round %d is in progress", round, b.cur.round)
	}
	att := b.attempts[round] + 1
	b.attempts[round] = att
	for r := range b.attempts {
		if r+4 < round {
			delete(b.attempts, r)
		}
	}
	c := &bfRound{round: round, attempt: att, stateHash: stateHash, x: x, out: out, started: b.now,
		readies: map[PeerID]bfReady{b.self: {stateHash, att, b.now}}, finishedBy: map[PeerID]bool{}, me: -1}
	c.ranked = b.rank(round)
	c.leadSince = b.now
	b.cur = c
	var body [8]byte
	binary.LittleEndian.PutUint64(body[:], stateHash)
	for _, p := range b.view {
		if p != b.self && !b.Banned(p) {
			b.send(p, header{kind: kindReady, round: round, step: att}, body[:])
		}
	}
	b.replay()
	// The others may have been waiting for a while: follow the leader they
	// follow by now (they turn to the next one every LeaderWait), instead
	// of leading a group they have given up on.
	oldest := b.now
	for p, r := range c.readies {
		if p != b.self {
			oldest = min(oldest, r.at)
		}
	}
	_, lw := b.waits()
	if k := (b.now - oldest) / lw; k > 0 {
		c.leaderIdx, c.leadSince = int(k), oldest+k*lw
	}
	b.advance()
	return nil
}

// rank orders the members for leadership of round: by a hash of (round, ID).
func (b *Butterfly) rank(round uint64) []PeerID {
	key := func(p PeerID) uint64 {
		h := fnv.New64a()
		var r [8]byte
		binary.LittleEndian.PutUint64(r[:], round)
		h.Write(r[:])
		h.Write([]byte(p))
		return h.Sum64()
	}
	out := slices.Clone(b.view)
	slices.SortFunc(out, func(x, y PeerID) int {
		kx, ky := key(x), key(y)
		switch {
		case kx < ky:
			return -1
		case kx > ky:
			return 1
		}
		return bytes.Compare([]byte(x), []byte(y))
	})
	return out
}

func (b *Butterfly) send(to PeerID, h header, body []byte) {
	p := appendMessage(make([]byte, 0, headerLen+len(body)), h, body)
	b.ready.Messages = append(b.ready.Messages, Envelope{To: to, Payload: p})
	b.ready.BytesSent += int64(len(p))
}

func (b *Butterfly) offend(p PeerID, format string, args ...any) {
	if p == b.self {
		return
	}
	reason := fmt.Sprintf(format, args...)
	b.ready.Offenses = append(b.ready.Offenses, Offense{Peer: p, Reason: reason})
	b.Ban(p, reason)
}

// Step takes one message received from a peer. Malformed messages are
// dropped (their sender is reported when it provably misbehaved).
func (b *Butterfly) Step(from PeerID, payload []byte) {
	// A banned member's messages still count within the round in progress
	// (every decision there must rest on what all members see, not on who
	// each has banned); bans act when groups form.
	if from == b.self {
		return
	}
	h, body, err := parseMessage(payload)
	if err != nil || h.kind < kindReady {
		return
	}
	b.step(from, h, body, true)
	b.advance()
}

// maxFrame bounds one encoded part or aggregate: the whole vector in fp32
// plus framing, whatever the group size.
func (b *Butterfly) maxFrame() int { return 4*b.cfg.Len + 4096 }

func (b *Butterfly) step(from PeerID, h header, body []byte, fresh bool) {
	c := b.cur
	active := c != nil && c.result == nil
	switch h.kind {
	case kindFetch, kindAudit:
		if slices.Contains(b.view, from) || (c != nil && slices.Contains(c.group, from)) {
			b.answer(from, h)
		}
		return
	case kindReady:
		if len(body) != 8 {
			return
		}
		if b.finished[h.round] != nil && (!active || c.round != h.round) {
			b.send(from, header{kind: kindFinished, round: h.round, step: h.step}, nil)
			return
		}
		if active && c.round == h.round {
			c.readies[from] = bfReady{binary.LittleEndian.Uint64(body), h.step, b.arrived}
			if c.groupB != nil && c.me >= 0 && !slices.Contains(c.group, from) {
				// A member ready after the group formed: tell it, so that
				// it fetches the result instead of waiting for a leader.
				b.send(from, header{kind: kindGroup, round: c.round, step: c.attempt}, c.groupB)
			}
			return
		}
	case kindFinished:
		if active && c.round == h.round {
			c.finishedBy[from] = true
		}
		return
	case kindGroup:
		if b.finished[h.round] != nil && (!active || c.round != h.round) {
			b.send(from, header{kind: kindFinished, round: h.round, step: h.step}, nil)
			return
		}
	}
	if !active || h.round > c.round {
		last := b.lastRound()
		if fresh && h.round+1 >= last && h.round <= last+2 && b.finished[h.round] == nil {
			b.stashMsg(from, h, body)
		}
		return
	}
	if h.round < c.round {
		return
	}
	switch {
	case h.kind == kindGroup:
		b.onGroup(from, h, body)
		return
	case c.group != nil && h.group == c.gh:
	case h.step > c.attempt || c.group == nil:
		if fresh {
			b.stashMsg(from, h, body)
		}
		return
	default:
		return
	}
	switch h.kind {
	case kindPart:
		b.onPart(from, h, body)
	case kindHave:
		b.onHave(from, h, body)
	case kindResult:
		b.onResult(from, h, body)
	case kindDigest:
		b.onDigest(from, h, body)
	case kindInputs:
		b.onInputs(from, h, body)
	}
}

func (b *Butterfly) lastRound() uint64 {
	if b.cur != nil {
		return b.cur.round
	}
	var r uint64
	for k := range b.finished {
		r = max(r, k)
	}
	return r
}

// stashMsg keeps a message for a round or group not reached yet, within
// the byte budget (a quarter per sender), from members only.
func (b *Butterfly) stashMsg(from PeerID, h header, body []byte) {
	if !slices.Contains(b.view, from) || len(body) > b.maxFrame()+sigLen+64 {
		return
	}
	var mine int64
	for _, s := range b.stash {
		if s.from == from {
			mine += int64(len(s.body))
		}
	}
	n := int64(len(body) + headerLen)
	if b.stashed+n > b.cfg.MaxStashBytes || mine+n > b.cfg.MaxStashBytes/4 {
		return
	}
	b.stash = append(b.stash, bfStashed{b.now, from, h, slices.Clone(body)})
	b.stashed += n
}

// replay feeds the current round the stashed messages it can now use
// (acceptGroup replays again once the group is known).
func (b *Butterfly) replay() {
	c := b.cur
	if c == nil || c.result != nil {
		return
	}
	keep := b.stash[:0]
	var use []bfStashed
	b.stashed = 0
	for _, s := range b.stash {
		switch {
		case s.h.round < c.round:
		case s.h.round == c.round && (s.h.kind == kindGroup || s.h.kind == kindReady || (c.group != nil && s.h.group == c.gh)):
			use = append(use, s)
		default:
			keep = append(keep, s)
			b.stashed += int64(len(s.body) + headerLen)
		}
	}
	b.stash = keep
	for _, s := range use {
		if b.Banned(s.from) {
			continue
		}
		b.arrived = s.at
		b.step(s.from, s.h, s.body, false)
	}
	b.arrived = b.now
}

// advance acts on the state: leadership, deadlines, the end of phases.
func (b *Butterfly) advance() {
	c := b.cur
	if c == nil || c.result != nil {
		return
	}
	others := 0
	for p := range c.finishedBy {
		if slices.Contains(b.view, p) {
			others++
		}
	}
	if others > 0 && others >= min(2, len(b.view)-1) {
		b.finish(c, ErrBehind)
		return
	}
	if c.group == nil {
		b.advanceGroup(c)
		return
	}
	if c.me < 0 {
		b.advanceLeftOut(c)
		return
	}
	for _, o := range b.sortedOwned(c) {
		b.advanceOwned(c, o)
	}
	b.advanceGather(c)
}

func (b *Butterfly) finish(c *bfRound, err error) {
	r := &RoundResult{Round: c.round, Attempt: c.attempt, Group: c.group, LeftOut: c.me < 0, Err: err}
	for _, p := range c.parts {
		if p.verified {
			r.Verified++
		}
		if p.audit {
			r.Audits++
		}
	}
	c.result = r
	b.ready.Result = r
	switch {
	case err == nil && c.me >= 0:
		b.recentGroups = append(b.recentGroups, len(c.group))
		if len(b.recentGroups) > recentWindow {
			b.recentGroups = b.recentGroups[1:]
		}
		b.noGroupStreak = 0
	case c.group == nil && errors.Is(err, ErrRoundFailed):
		b.noGroupStreak++
	}
	if len(c.readies) > 1 {
		lo, hi := b.now, int64(0)
		for _, x := range c.readies {
			lo, hi = min(lo, x.at), max(hi, x.at)
		}
		b.readyEst.observe(hi - lo)
	}
	if err == nil {
		b.finished[c.round] = &bfFinished{gh: c.gh, group: c.group, owned: c.owned}
		for k := range b.finished {
			if k+2 < c.round {
				delete(b.finished, k)
			}
		}
	}
}

// Cancel ends the round in progress, if any, with err.
func (b *Butterfly) Cancel(err error) {
	if b.Busy() {
		b.finish(b.cur, err)
	}
}

// ---- 1. Group -------------------------------------------------------------

// candidate is the leader this member follows: the first member of the
// round's ranking, from position leaderIdx on, that is not gone. The
// ranking is fixed at Start, so members that agree on who is gone follow
// the same leader.
func (b *Butterfly) candidate(c *bfRound) (PeerID, int) {
	n := len(c.ranked)
	for k := range n {
		pos := (c.leaderIdx + k) % n
		// Banned members are skipped too: following one would cost a leader
		// wait every round it leads. Members that have not banned it follow
		// it; the majority rule keeps the two sides from both finishing.
		if p := c.ranked[pos]; !b.gone(p) && !b.Banned(p) {
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
		return
	}
	// This member leads: wait for the members it sees.
	ready, seen := 0, 0
	for _, p := range b.view {
		if b.Banned(p) {
			continue
		}
		seen++
		if _, ok := c.readies[p]; ok {
			ready++
		}
	}
	for p := range c.readies {
		if !slices.Contains(b.view, p) && !b.Banned(p) {
			seen++ // ready, so alive, though the membership does not list it yet
			ready++
		}
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
	need := seen
	if b.noGroupStreak < noGroupBeforeShrink {
		need = max(need, b.recentSize())
	}
	if 2*ready <= need {
		return
	}
	if ready < seen && waited < rw {
		return
	}
	// The state most ready members start from; ties to this member's.
	count := map[uint64]int{}
	for p, r := range c.readies {
		if !b.Banned(p) {
			count[r.hash]++
		}
	}
	best := c.stateHash
	for h, n := range count {
		if n > count[best] || (n == count[best] && h < best && best != c.stateHash) {
			best = h
		}
	}
	var members []PeerID
	att := c.attempt
	for p, r := range c.readies {
		if r.hash == best && !b.Banned(p) {
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

func (b *Butterfly) onGroup(from PeerID, h header, body []byte) {
	c := b.cur
	if c.group != nil && h.step <= c.attempt {
		return
	}
	if h.step < c.attempt || uint64(len(body)) > uint64(maxGroup)*(maxIDLen+2)+64 {
		return
	}
	g, err := parseGroup(body)
	if err != nil {
		return
	}
	if !b.cfg.Signer.Verify(g.leader, groupSigMsg(c.round, h.step, g.signed), g.sig) {
		b.offend(from, "forwarded a group with a bad signature")
		return
	}
	// The leader must be one this member would follow: the current
	// candidate or one ranked before it.
	_, pos := b.candidate(c)
	if rank := slices.Index(c.ranked, g.leader); rank < 0 || b.Banned(g.leader) || (rank > pos+1 && pos+1 < len(c.ranked)) {
		return
	}
	if c.group != nil && slices.Contains(g.members, b.self) == false && c.me >= 0 {
		return // a newer attempt that left us out: keep ours
	}
	b.acceptGroup(c, h.step, g.stateHash, g.members, body)
}

func (b *Butterfly) acceptGroup(c *bfRound, att uint32, stateHash uint64, members []PeerID, signed []byte) {
	c.attempt = att
	b.attempts[c.round] = max(b.attempts[c.round], att)
	c.group, c.groupB, c.groupAt = members, signed, b.now
	c.gh = bfGroupHash(c.round, att, members)
	c.me = slices.Index(members, b.self)
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
func (b *Butterfly) owners(g []PeerID, p uint32) (PeerID, PeerID) {
	M := uint32(len(g))
	if b.cfg.Replicas < 2 || M < 2 {
		return g[p], ""
	}
	return g[p], g[(p+1)%M]
}

// ---- 2. Scatter -----------------------------------------------------------

func (b *Butterfly) partSeed(c *bfRound, p uint32, who int) uint64 {
	return c.gh ^ uint64(p)<<32 ^ uint64(who+1)*0x9E3779B97F4A7C15
}

func (b *Butterfly) scatter(c *bfRound) {
	M := len(c.group)
	for p := range M {
		lo, hi := chunkBounds(b.cfg.Len, M, p)
		x := c.x[lo:hi]
		if k, ok := hostileScale[b.cfg.Hostile]; ok {
			x = make([]float32, hi-lo)
			for i, v := range c.x[lo:hi] {
				x[i] = v * k
			}
		}
		if b.cfg.Hostile == HostilePoison {
			x = make([]float32, hi-lo)
			for i := range x {
				x[i] = 1e30
			}
		}
		frame, err := b.enc.Append(nil, x, b.partSeed(c, uint32(p), c.me))
		if err != nil {
			b.finish(c, fmt.Errorf("%w: encoding part %d: %v", ErrRoundFailed, p, err))
			return
		}
		hash := sha256.Sum256(frame)
		sig, err := b.cfg.Signer.Sign(partSigMsg(c.round, c.attempt, c.gh, uint32(p), hash))
		if err != nil || len(sig) != sigLen {
			b.finish(c, fmt.Errorf("%w: signing part %d: %v", ErrRoundFailed, p, err))
			return
		}
		msg := append(slices.Clone(sig), frame...)
		h := header{kind: kindPart, round: c.round, group: c.gh, step: c.attempt, chunk: uint32(p)}
		for _, o := range []PeerID{c.parts[p].a, c.parts[p].b} {
			switch o {
			case "":
			case b.self:
				b.takePart(c, uint32(c.me), h, msg)
			default:
				b.send(o, h, msg)
			}
		}
	}
}

func (b *Butterfly) onPart(from PeerID, h header, body []byte) {
	c := b.cur
	idx := slices.Index(c.group, from)
	if h.group != c.gh || idx < 0 {
		return
	}
	b.takePart(c, uint32(idx), h, body)
}

// takePart checks and keeps member idx's part h.chunk (signature, size,
// values); a signed bad part makes its producer an offender.
func (b *Butterfly) takePart(c *bfRound, idx uint32, h header, body []byte) {
	o := c.owned[h.chunk]
	from := c.group[idx]
	if o == nil || o.done || len(body) < sigLen || o.inputs[idx] != nil {
		return
	}
	frame := body[sigLen:]
	in := &bfInput{frame: slices.Clone(frame)}
	in.idx = idx
	in.hash = sha256.Sum256(frame)
	copy(in.sig[:], body[:sigLen])
	if !b.cfg.Signer.Verify(from, partSigMsg(c.round, c.attempt, c.gh, h.chunk, in.hash), in.sig[:]) {
		return // not provably from it: drop
	}
	lo, hi := chunkBounds(b.cfg.Len, len(c.group), int(h.chunk))
	vals := make([]float32, hi-lo)
	if err := b.decodeChecked(frame, vals); err != nil {
		b.offend(from, "part %d of round %d: %v", h.chunk, c.round, err)
		return
	}
	in.vals = vals
	o.inputs[idx] = in
}

func (b *Butterfly) decodeChecked(frame []byte, dst []float32) error {
	hd, err := b.dec.ReadHeader(bytes.NewReader(frame))
	if err != nil {
		return err
	}
	if hd.Count != int64(len(dst)) {
		return fmt.Errorf("%w: frame of %d elements, want %d", ErrRejected, hd.Count, len(dst))
	}
	if _, err := b.dec.DecodeBytes(frame, dst); err != nil {
		return err
	}
	return checkFinite(dst, b.cfg.MaxAbs)
}

// ---- 3. Cross-check and aggregate ------------------------------------------

func (b *Butterfly) sortedOwned(c *bfRound) []*bfOwned {
	out := make([]*bfOwned, 0, len(c.owned))
	for _, o := range c.owned {
		out = append(out, o)
	}
	slices.SortFunc(out, func(x, y *bfOwned) int { return int(x.p) - int(y.p) })
	return out
}

func (b *Butterfly) haveList(o *bfOwned) []signedInput {
	out := make([]signedInput, 0, len(o.inputs))
	for _, in := range o.inputs {
		out = append(out, in.signedInput)
	}
	slices.SortFunc(out, func(x, y signedInput) int { return int(x.idx) - int(y.idx) })
	return out
}

func (b *Butterfly) advanceOwned(c *bfRound, o *bfOwned) {
	if o.done {
		return
	}
	scatterDue := c.groupAt + b.scatterEst.deadline(b.cfg.PhaseWait, b.cfg.MinPhase, b.cfg.MaxPhase)
	all := true
	for i, p := range c.group {
		if o.inputs[uint32(i)] == nil && !b.gone(p) {
			all = false
		}
	}
	if !all && b.now < scatterDue {
		return
	}
	if all && !o.sentHave {
		b.scatterEst.observe(b.now - c.groupAt)
	}
	if o.co != "" && !o.sentHave {
		o.sentHave = true
		b.send(o.co, header{kind: kindHave, round: c.round, group: c.gh, step: c.attempt, chunk: o.p},
			appendInputs(nil, b.haveList(o)))
	}
	if o.co != "" && !o.gotCoHave && !b.gone(o.co) && b.now < scatterDue+b.cfg.MinPhase {
		return
	}
	b.aggregate(c, o)
}

func (b *Butterfly) onHave(from PeerID, h header, body []byte) {
	c := b.cur
	o := c.owned[h.chunk]
	if h.group != c.gh || o == nil || o.co != from || o.gotCoHave {
		return
	}
	list, err := parseInputs(body, len(c.group))
	if err != nil {
		return
	}
	o.coHave, o.gotCoHave = list, true
}

// aggregate forms the part's inputs (those both owners hold with the same
// hash; equivocators out) and sends the result or its digest.
func (b *Butterfly) aggregate(c *bfRound, o *bfOwned) {
	use := map[uint32]*bfInput{}
	for idx, in := range o.inputs {
		use[idx] = in
	}
	if o.gotCoHave {
		theirs := map[uint32]signedInput{}
		for _, s := range o.coHave {
			theirs[s.idx] = s
		}
		for idx, in := range o.inputs {
			t, ok := theirs[idx]
			switch {
			case !ok:
				delete(use, idx)
			case t.hash != in.hash:
				delete(use, idx)
				p := c.group[idx]
				if b.cfg.Signer.Verify(p, partSigMsg(c.round, c.attempt, c.gh, o.p, t.hash), t.sig[:]) {
					b.offend(p, "signed two different frames for part %d of round %d", o.p, c.round)
				}
			}
		}
	}
	o.decls = o.decls[:0]
	idxs := make([]uint32, 0, len(use))
	for idx := range use {
		idxs = append(idxs, idx)
	}
	slices.Sort(idxs)
	for _, idx := range idxs {
		o.decls = append(o.decls, use[idx].decl)
	}
	if 2*len(idxs) <= len(c.group) {
		// Most of the group did not contribute: it may have gone to another
		// group of this attempt (a leader taking over from a slow one).
		// Fail the round rather than end it with a result the rest of the
		// run does not share; the members retry with a new attempt.
		b.finish(c, fmt.Errorf("%w: part %d has contributions from %d of the %d members", ErrRoundFailed, o.p, len(idxs), len(c.group)))
		return
	}
	frame, err := b.aggregateFrame(c, o.p, idxs, func(i uint32) []float32 { return use[i].vals })
	if err != nil {
		b.finish(c, fmt.Errorf("%w: aggregating part %d: %v", ErrRoundFailed, o.p, err))
		return
	}
	o.frame, o.done = frame, true
	h := header{kind: kindResult, round: c.round, group: c.gh, step: c.attempt, chunk: o.p}
	var body []byte
	if o.primary {
		sent := frame
		if b.cfg.Hostile == HostileForge {
			sent = b.forged(c, o.p)
		}
		body = append(appendDecls(nil, o.decls), sent...)
	} else {
		h.kind = kindDigest
		c.parts[o.p].frameB = frame
		d := sha256.Sum256(frame)
		body = appendDecls(append([]byte(nil), d[:]...), o.decls)
	}
	for i, p := range c.group {
		if i == c.me {
			b.step(p, h, body, false) // our own copy, through the same path
			continue
		}
		b.send(p, h, body)
	}
	for _, p := range o.fetchers {
		b.send(p, header{kind: kindResult, round: c.round, group: c.gh, step: c.attempt, chunk: o.p},
			append(appendDecls(nil, o.decls), frame...))
	}
	o.fetchers = nil
}

// aggregateFrame is the encoded robust aggregate of the given inputs of
// part p (ordered by member index): the same bits on every member.
func (b *Butterfly) aggregateFrame(c *bfRound, p uint32, idxs []uint32, vals func(uint32) []float32) ([]byte, error) {
	lo, hi := chunkBounds(b.cfg.Len, len(c.group), int(p))
	agg := make([]float32, hi-lo)
	ins := make([][]float32, len(idxs))
	for i, idx := range idxs {
		ins[i] = vals(idx)
	}
	b.scratch = TrimmedMean(agg, ins, b.cfg.Robust.EffectiveTrim(len(ins)), b.scratch)
	return b.enc.Append(nil, agg, b.partSeed(c, p, -1)^0xA66)
}

// forged is what a hostile owner sends instead of part p's aggregate: a
// well-formed frame of large values, under the honest list of inputs.
func (b *Butterfly) forged(c *bfRound, p uint32) []byte {
	lo, hi := chunkBounds(b.cfg.Len, len(c.group), int(p))
	x := make([]float32, hi-lo)
	for i := range x {
		x[i] = b.cfg.MaxAbs / 2
	}
	f, err := b.enc.Append(nil, x, 1)
	if err != nil {
		return nil
	}
	return f
}

// ---- 4. Gather ------------------------------------------------------------

func (b *Butterfly) onResult(from PeerID, h header, body []byte) {
	c := b.cur
	if h.group != c.gh || int(h.chunk) >= len(c.parts) {
		return
	}
	pt := &c.parts[h.chunk]
	ds, frame, err := parseDecls(body, len(c.group))
	if err != nil || len(frame) > b.maxFrame() {
		return
	}
	switch from {
	case pt.a:
		if pt.frameA == nil {
			pt.frameA, pt.declA = slices.Clone(frame), ds
		}
	case pt.b:
		if pt.frameB == nil {
			pt.frameB = slices.Clone(frame)
			if pt.declB == nil {
				pt.declB = ds
			}
		}
	}
}

func (b *Butterfly) onDigest(from PeerID, h header, body []byte) {
	c := b.cur
	if h.group != c.gh || int(h.chunk) >= len(c.parts) {
		return
	}
	pt := &c.parts[h.chunk]
	if from != pt.b || pt.gotDigest || len(body) < digestLen {
		return
	}
	ds, rest, err := parseDecls(body[digestLen:], len(c.group))
	if err != nil || len(rest) != 0 {
		return
	}
	pt.digestB, pt.declB, pt.gotDigest, pt.digestAt = slices.Clone(body[:digestLen]), ds, true, b.now
}

func (b *Butterfly) onInputs(from PeerID, h header, body []byte) {
	c := b.cur
	if h.group != c.gh || int(h.chunk) >= len(c.parts) {
		return
	}
	pt := &c.parts[h.chunk]
	if !pt.audit {
		return
	}
	in, err := parseAudit(body, len(c.group), b.maxFrame())
	if err != nil {
		return
	}
	for i := range in {
		in[i].frame = slices.Clone(in[i].frame)
	}
	switch {
	case from == pt.a && !pt.gotAudA:
		pt.auditA, pt.gotAudA = in, true
	case from == pt.b && !pt.gotAudB:
		pt.auditB, pt.gotAudB = in, true
	}
}

func (b *Butterfly) advanceGather(c *bfRound) {
	due := b.gatherEst.deadline(b.cfg.PhaseWait, b.cfg.MinPhase, b.cfg.MaxPhase)
	start := c.groupAt
	for _, o := range c.owned {
		if !o.done {
			return // finish our own parts first
		}
	}
	if c.gatherAt == 0 {
		c.gatherAt = max(b.now, 1)
	}
	start = c.gatherAt
	pending := 0
	for p := range c.parts {
		pt := &c.parts[p]
		if pt.accepted != nil {
			continue
		}
		b.settle(c, uint32(p), pt, start, due)
		if c.result != nil {
			return
		}
		if pt.accepted == nil {
			pending++
		}
	}
	if pending > 0 {
		return
	}
	b.gatherEst.observe(b.now - start)
	b.finishWith(c, ErrRoundFailed)
}

// finishWith decodes every accepted part into the output and ends the
// round; a part that does not decode ends it with failure (both owners
// agreed on garbage).
func (b *Butterfly) finishWith(c *bfRound, failure error) {
	M := len(c.group)
	for p := range c.parts {
		lo, hi := chunkBounds(b.cfg.Len, M, p)
		if err := b.decodeChecked(c.parts[p].accepted, c.out[lo:hi]); err != nil {
			b.finish(c, fmt.Errorf("%w: the aggregate of part %d: %v", failure, p, err))
			return
		}
	}
	b.finish(c, nil)
}

// settle decides part p when it can: the owners agree; one owner is gone
// (fetch from the other); they disagree (audit).
func (b *Butterfly) settle(c *bfRound, p uint32, pt *bfPart, start, due int64) {
	h := header{round: c.round, group: c.gh, step: c.attempt, chunk: p}
	gone := b.gone
	// The owners may wait a whole scatter phase and the cross-check for a
	// contribution that never comes: a part is late only after that.
	scatterDue := c.groupAt + b.scatterEst.deadline(b.cfg.PhaseWait, b.cfg.MinPhase, b.cfg.MaxPhase) + b.cfg.MinPhase
	late := b.now >= max(start, scatterDue)+due
	// The second owner is done and the first has not answered within a
	// short wait: ask the second for the aggregate itself.
	aSilent := pt.frameA == nil && pt.gotDigest && b.now >= pt.digestAt+b.cfg.MinPhase
	switch {
	case pt.audit:
		b.settleAudit(c, p, pt, due)
	case pt.b == "" && pt.frameA != nil:
		pt.accepted = pt.frameA
	case pt.frameA != nil && pt.gotDigest:
		d := sha256.Sum256(pt.frameA)
		if bytes.Equal(d[:], pt.digestB) {
			pt.accepted, pt.verified = pt.frameA, true
			return
		}
		pt.audit, pt.auditAt = true, b.now
		h.kind = kindAudit
		for _, o := range []PeerID{pt.a, pt.b} {
			if o == b.self {
				b.auditSelf(c, p, pt)
			} else {
				b.send(o, h, nil)
			}
		}
	case pt.frameA == nil && pt.frameB != nil && (late || gone(pt.a)):
		// Only once the first owner is gone or past every deadline: a member
		// that took the second owner's aggregate while the first was merely
		// slow could end with other bits than those who audit.
		pt.accepted = pt.frameB // the first owner is gone: the second's, unconfirmed
	case pt.frameA != nil && pt.b != "" && gone(pt.b):
		pt.accepted = pt.frameA // the second owner is gone: the first's, unconfirmed
	case pt.fetchAt == 0 && (late || aSilent || (pt.frameA == nil && gone(pt.a))):
		pt.fetchAt = b.now
		h.kind = kindFetch
		if pt.frameA == nil {
			for _, o := range []PeerID{pt.a, pt.b} {
				if o != "" && o != b.self && !b.Banned(o) {
					b.send(o, h, nil)
				}
			}
		}
	case pt.fetchAt != 0 && b.now >= pt.fetchAt+due:
		if pt.frameA != nil {
			pt.accepted = pt.frameA // the second owner is gone: the first's, unconfirmed
			return
		}
		if pt.frameB != nil {
			pt.accepted = pt.frameB
			return
		}
		b.finish(c, fmt.Errorf("%w: no aggregate of part %d from %s nor %s", ErrRoundFailed, p, short(pt.a), short(pt.b)))
	}
}

// auditInputs are the signed inputs the owner declared, with their frames.
func (o *bfOwned) auditInputs() []auditInput {
	in := make([]auditInput, 0, len(o.decls))
	for _, d := range o.decls {
		x := o.inputs[d.idx]
		in = append(in, auditInput{signedInput: x.signedInput, frame: x.frame})
	}
	return in
}

// auditSelf answers this member's own audit of a part it owns.
func (b *Butterfly) auditSelf(c *bfRound, p uint32, pt *bfPart) {
	o := c.owned[p]
	if o == nil || !o.done {
		return
	}
	in := o.auditInputs()
	if pt.a == b.self {
		pt.auditA, pt.gotAudA = in, true
	} else {
		pt.auditB, pt.gotAudB = in, true
	}
}

// settleAudit recomputes each owner's aggregate from the signed inputs it
// declared and takes the one whose claim holds.
func (b *Butterfly) settleAudit(c *bfRound, p uint32, pt *bfPart, due int64) {
	// Wait for both owners' inputs: deciding on one answer alone would let
	// members that heard from different owners in time end with different
	// bits. Only an owner that is gone, or silent far past the deadline, is
	// decided without.
	if !(pt.gotAudA || b.gone(pt.a)) || !(pt.gotAudB || b.gone(pt.b)) {
		if b.now < pt.auditAt+4*due {
			return
		}
	}
	dA := sha256.Sum256(pt.frameA)
	var okA, okB bool
	var frameA, frameB []byte
	if pt.gotAudA {
		okA, frameA = b.check(c, p, pt.declA, pt.auditA, dA[:])
	}
	if pt.gotAudB {
		okB, frameB = b.check(c, p, pt.declB, pt.auditB, pt.digestB)
	}
	switch {
	case okA:
		// Both consistent (the owners aggregated different sets of genuine
		// inputs: one did not hear the other's list in time): the first
		// owner's, as every member decides.
		pt.accepted = frameA
		if !okB && pt.gotAudB {
			b.offend(pt.b, "its digest of part %d of round %d does not match its inputs", p, c.round)
		}
	case okB:
		pt.accepted = frameB
		if pt.gotAudA {
			b.offend(pt.a, "its aggregate of part %d of round %d does not match its inputs", p, c.round)
		}
	default:
		b.finish(c, fmt.Errorf("%w: neither owner of part %d (%s, %s) has a consistent aggregate", ErrRoundFailed, p, short(pt.a), short(pt.b)))
		return
	}
	pt.verified = true
}

// check recomputes an owner's aggregate of part p from the audit inputs and
// reports whether it matches its claimed digest and declared inputs.
func (b *Butterfly) check(c *bfRound, p uint32, declared []decl, in []auditInput, digest []byte) (bool, []byte) {
	if len(in) != len(declared) {
		return false, nil
	}
	lo, hi := chunkBounds(b.cfg.Len, len(c.group), int(p))
	vals := map[uint32][]float32{}
	idxs := make([]uint32, len(in))
	for i, s := range in {
		if s.decl != declared[i] || sha256.Sum256(s.frame) != s.hash {
			return false, nil
		}
		prod := c.group[s.idx]
		if !b.cfg.Signer.Verify(prod, partSigMsg(c.round, c.attempt, c.gh, p, s.hash), s.sig[:]) {
			return false, nil
		}
		v := make([]float32, hi-lo)
		if err := b.decodeChecked(s.frame, v); err != nil {
			return false, nil
		}
		vals[s.idx], idxs[i] = v, s.idx
	}
	frame, err := b.aggregateFrame(c, p, idxs, func(i uint32) []float32 { return vals[i] })
	if err != nil {
		return false, nil
	}
	d := sha256.Sum256(frame)
	return bytes.Equal(d[:], digest), frame
}

// ---- Left out, and answers ------------------------------------------------

func (b *Butterfly) advanceLeftOut(c *bfRound) {
	due := b.gatherEst.deadline(b.cfg.PhaseWait, b.cfg.MinPhase, b.cfg.MaxPhase)
	if !c.fetched {
		c.fetched = true
		for p := range c.parts {
			h := header{kind: kindFetch, round: c.round, group: c.gh, step: c.attempt, chunk: uint32(p)}
			c.parts[p].fetchAt = max(b.now, 1)
			b.send(c.parts[p].a, h, nil)
			if c.parts[p].b != "" {
				b.send(c.parts[p].b, h, nil)
			}
		}
	}
	// The second owner's whole result stands for its digest; from there a
	// left-out member settles each part as the group's members do (and
	// audits when the owners disagree).
	pending := 0
	for p := range c.parts {
		pt := &c.parts[p]
		if pt.accepted != nil {
			continue
		}
		if pt.frameB != nil && !pt.gotDigest {
			d := sha256.Sum256(pt.frameB)
			pt.digestB, pt.gotDigest, pt.digestAt = d[:], true, b.now
		}
		// Patient: a left-out member hears the owners later than the group
		// does, and taking one owner's word early risks other bits.
		b.settle(c, uint32(p), pt, c.groupAt, 3*due)
		if c.result != nil {
			return
		}
		if pt.accepted == nil {
			pending++
		}
	}
	if pending > 0 {
		return
	}
	b.finishWith(c, ErrExcluded)
}

// answer serves a fetch (the aggregate) or an audit (the signed inputs) of a
// part this member owns, in the current or a recently finished round.
func (b *Butterfly) answer(from PeerID, h header) {
	var owned map[uint32]*bfOwned
	var gh uint64
	switch c := b.cur; {
	case c != nil && c.round == h.round && c.gh == h.group:
		owned, gh = c.owned, c.gh
	case b.finished[h.round] != nil && b.finished[h.round].gh == h.group:
		owned, gh = b.finished[h.round].owned, h.group
	default:
		return
	}
	o := owned[h.chunk]
	if o == nil {
		return
	}
	if !o.done {
		if h.kind == kindFetch && !slices.Contains(o.fetchers, from) && len(o.fetchers) < maxGroup {
			o.fetchers = append(o.fetchers, from)
		}
		return
	}
	r := header{round: h.round, group: gh, step: h.step, chunk: h.chunk}
	switch h.kind {
	case kindFetch:
		r.kind = kindResult
		b.send(from, r, append(appendDecls(nil, o.decls), o.frame...))
	case kindAudit:
		r.kind = kindInputs
		b.send(from, r, appendAudit(nil, o.auditInputs()))
	}
}

// bfGroupHash names one attempt of a round and its group.
func bfGroupHash(round uint64, attempt uint32, group []PeerID) uint64 {
	h := fnv.New64a()
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:], round)
	binary.LittleEndian.PutUint32(b[8:], attempt)
	h.Write(b[:])
	for _, p := range group {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum64()
}

// gone reports whether another member is no longer a member (by the
// membership, which all members come to share; never by this member's own
// bans, which the others may not share).
func (b *Butterfly) gone(p PeerID) bool {
	return p != b.self && !slices.Contains(b.view, p)
}

func short(p PeerID) string {
	if len(p) > 12 {
		return string(p[len(p)-6:])
	}
	return string(p)
}

// tickEstimator smooths observed phase durations, in ticks.
type tickEstimator struct{ e estimator }

func (t *tickEstimator) observe(ticks int64) { t.e.observe(durationOfTicks(ticks)) }

func (t *tickEstimator) deadline(initial, lo, hi int64) int64 {
	return ticksOfDuration(t.e.deadline(durationOfTicks(initial), durationOfTicks(lo), durationOfTicks(hi)))
}

func durationOfTicks(t int64) time.Duration { return time.Duration(t) * time.Second }

func ticksOfDuration(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }
