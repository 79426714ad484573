package optimizer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"time"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/transport"
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
//     inputs they hold, and aggregate (RobustConfig: by default the
//     coordinate-wise median, robust to any minority of contributors) over
//     the inputs both hold with the same hash. A contributor that signed
//     two different frames for one part equivocated: it is an offender.
//  4. Gather. The first owner sends its aggregate to every member with the
//     list of inputs it used; the second sends the aggregate's SHA-256. A
//     member accepts a part when the two agree. When they disagree it
//     audits: it asks both owners for the signed inputs, recomputes each
//     owner's aggregate from the inputs it declared, and takes the result
//     of the owner whose claim holds (both holding: the one over more
//     inputs, else the first owner's); an owner whose claim does not hold
//     is an offender. Every honest member does the same computation on the
//     same signed inputs, so they end with the same bits.
//
// Faults: a member that fails before the group is left out; one that fails
// while sending is left out of the parts it did not deliver (each part's
// owners agree on its inputs); an owner that fails is replaced by its
// co-owner (members fetch the part from it, and check the aggregate
// against the inputs it declared, as in an audit, before taking it: one
// owner's word alone would let a hostile owner whose co-owner is gone or
// stalled hand some members a forged aggregate that others reject); a part
// whose two owners both fail fails the round (the caller re-syncs or retries with a new
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
// membership), never on a member's own bans or suspensions, which act only
// when groups form (a member only stops waiting for the inputs of those it
// suspends, as if they came late). TestButterflyRandomSchedules checks
// this over thousands of random schedules with a member dying unseen and a
// hostile one.
//
// Members echo the signed group to each other: a leader that signs two
// different groups for one attempt is caught and banned by every member.
//
// Silent members (butterfly_silence.go). A member that says READY and then
// sends nothing proves nothing (a dead link looks the same), yet would
// stall every round by the phase deadlines. Each member counts the group
// members whose inputs did not reach it, and for 1, 2, 4, ... up to 16
// rounds (until their inputs come again) leaves them out of the groups it
// leads and does not follow them as leaders; like bans, this acts where
// groups form, on a round's first attempt.
//
// What this does not defend: a part whose two owners both collude is
// unprotected; an owner may leave out honest inputs it
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
	// AggCodec, if set, encodes the aggregates instead of Codec.Codec
	// (the rest of Codec unchanged): a finer grid for the average than for
	// the contributions, which can be coarse because each member's error
	// feedback keeps its own rounding while nobody keeps the average's.
	// Decoders read a frame's codec from its header, so members need
	// nothing else to read it.
	AggCodec compression.Codec
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
	Signer        transport.Signer
	// Hostile makes this member misbehave, for chaos tests only (skein
	// demo --chaos --hostile): HostileScale sends its contribution times
	// 1000, HostileSignFlip its negation (both well-formed: robust
	// aggregation bounds them), HostilePoison values past every bound,
	// HostileForge tampers with every aggregate it sends, HostileCollude
	// puts 4 times its contribution's norm into the first 3 coordinates of
	// every part, all positive (colluders doing the same push the same
	// coordinates: the attack the trim's breakdown point is about),
	// HostileMute says READY (and leads or echoes groups) but contributes
	// nothing: no part, no cross-check, no aggregate, no answer, as a
	// member whose uplink dies once it is in the group would; it still asks
	// for the result (fetch, audit), a free rider. "" is honest.
	Hostile string
}

// The hostile behaviours of ButterflyConfig.Hostile.
const (
	HostileScale    = "scale"
	HostileSignFlip = "signflip"
	HostilePoison   = "poison"
	HostileForge    = "forge"
	HostileCollude  = "collude"
	HostileMute     = "mute"
)

// HostileModes lists them.
var HostileModes = []string{HostileScale, HostileSignFlip, HostilePoison, HostileForge, HostileCollude, HostileMute}

var hostileScale = map[string]float32{HostileScale: 1000, HostileSignFlip: -1}

// DefaultButterflyConfig returns WAN-minded defaults for ticks of tick
// (for example 50 ms).
func DefaultButterflyConfig(n int, signer transport.Signer, tickSeconds float64) ButterflyConfig {
	c := compression.DefaultConfig()
	c.Codec = compression.MinMax8
	c.ZstdLevel = 0
	t := func(sec float64) int64 { return max(1, int64(sec/tickSeconds+0.5)) }
	return ButterflyConfig{Len: n, Codec: c, Robust: DefaultRobust(), Replicas: 2, MaxAbs: 1e4,
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
	To      transport.PeerID
	Payload []byte
}

// Offense names a member caught misbehaving, and how.
type Offense struct {
	Peer   transport.PeerID
	Reason string
}

// RoundResult is the end of one call of Start: Err nil means out holds the
// round's result, the same bits on every member that got one.
type RoundResult struct {
	Round    uint64
	Attempt  uint32
	Group    []transport.PeerID
	LeftOut  bool // this member was not in the group; it fetched the result
	Verified int  // parts whose aggregate was confirmed by two owners or an audit
	Audits   int
	// Suspended are the members this one keeps out of the next round's
	// groups for having gone silent in its groups (butterfly_silence.go).
	Suspended []transport.PeerID
	Err       error
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
	self transport.PeerID
	now  int64
	view []transport.PeerID // sorted, self included
	ban  map[transport.PeerID]string
	// silent is this member's record of members that went silent in its
	// groups (butterfly_silence.go).
	silent map[transport.PeerID]*bfSilence

	enc *compression.Encoder
	// aggEnc encodes the aggregates: enc, or one for AggCodec
	aggEnc *compression.Encoder
	dec    *compression.Decoder

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
	from transport.PeerID
	h    header
	body []byte
}

// bfFinished keeps what an owner must still answer after its round ended:
// late fetches and audits.
type bfFinished struct {
	gh    uint64
	group []transport.PeerID
	owned map[uint32]*bfOwned
}

type bfRound struct {
	round     uint64
	attempt   uint32
	stateHash uint64
	x, out    []float32
	sent      []float32 // x as sent, decoded (StartSent), or nil

	readies    map[transport.PeerID]bfReady
	ranked     []transport.PeerID
	leaderIdx  int
	leadSince  int64
	readyAt    int64 // when this member last sent its READY
	finishedBy map[transport.PeerID]bool

	// the group, once accepted
	group    []transport.PeerID
	gh       uint64
	groupAt  int64
	groupB   []byte           // the signed group message, forwarded to late members
	leader   transport.PeerID // who signed it
	me       int              // index in group, -1 when left out
	owned    map[uint32]*bfOwned
	parts    []bfPart
	gatherAt int64 // when this member finished aggregating its parts
	result   *RoundResult
	fetched  bool

	// suspects are the members of the group this member suspended when it
	// took the group: it does not wait for them (butterfly_silence.go).
	suspects map[transport.PeerID]bool
	// frozen: this member suspended someone when the round started, so the
	// round's phase durations are not the run's (butterfly_silence.go).
	frozen bool
}

type bfReady struct {
	hash    uint64
	attempt uint32
	at      int64 // when it arrived
}

// bfOwned is a part this member aggregates.
type bfOwned struct {
	p       uint32
	primary bool
	co      transport.PeerID // the co-owner; "" with one replica
	inputs  map[uint32]*bfInput
	// refused holds the members whose signed input to this part failed
	// the bounds: nothing better will come from them this round, so the
	// owner does not wait for them until the deadline.
	refused   map[uint32]bool
	coHave    []signedInput
	gotCoHave bool
	sentHave  bool
	done      bool
	frame     []byte // the aggregate, encoded
	decls     []decl
	fetchers  []transport.PeerID // asked for the aggregate before it was done
}

type bfInput struct {
	signedInput
	frame []byte
	vals  []float32
}

// bfPart is this member's view of one part's result.
type bfPart struct {
	a, b             transport.PeerID // owners
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
func NewButterfly(cfg ButterflyConfig, self transport.PeerID) (*Butterfly, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	enc, err := compression.NewEncoder(cfg.Codec)
	if err != nil {
		return nil, err
	}
	aggEnc := enc
	if cfg.AggCodec != 0 && cfg.AggCodec != cfg.Codec.Codec {
		ac := cfg.Codec
		ac.Codec = cfg.AggCodec
		if aggEnc, err = compression.NewEncoder(ac); err != nil {
			enc.Close()
			return nil, err
		}
	}
	dec, err := compression.NewDecoder(cfg.Codec)
	if err != nil {
		enc.Close()
		if aggEnc != enc {
			aggEnc.Close()
		}
		return nil, err
	}
	return &Butterfly{cfg: cfg, self: self, view: []transport.PeerID{self}, ban: map[transport.PeerID]string{}, silent: map[transport.PeerID]*bfSilence{}, enc: enc, aggEnc: aggEnc, dec: dec,
		attempts: map[uint64]uint32{}, finished: map[uint64]*bfFinished{}}, nil
}

// Close releases the codecs.
func (b *Butterfly) Close() {
	b.enc.Close()
	if b.aggEnc != b.enc {
		b.aggEnc.Close()
	}
	b.dec.Close()
}

// Self is this member's ID.
func (b *Butterfly) Self() transport.PeerID { return b.self }

// Now is the machine's clock, in ticks.
func (b *Butterfly) Now() int64 { return b.now }

// SetMembers sets the members this one sees (self is always included).
func (b *Butterfly) SetMembers(ms []transport.PeerID) {
	b.view = sortedGroup(append(slices.Clone(ms), b.self))
	b.advance()
}

// Ban excludes a member from every later group and ignores its messages.
func (b *Butterfly) Ban(id transport.PeerID, reason string) {
	if id != b.self {
		b.ban[id] = reason
	}
}

// Banned reports whether id is banned.
func (b *Butterfly) Banned(id transport.PeerID) bool { _, ok := b.ban[id]; return ok }

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
	return b.StartSent(round, stateHash, x, out, nil)
}

// StartSent is Start that also writes into sent (nil: nothing) x as this
// member's parts cross the wire, encoded and decoded (zeros where it sent
// none, as when it is left out): what error feedback needs to keep the
// codec's rounding. sent is written by the machine until the round ends.
func (b *Butterfly) StartSent(round uint64, stateHash uint64, x, out, sent []float32) error {
	if len(x) != b.cfg.Len || len(out) != b.cfg.Len || (sent != nil && len(sent) != b.cfg.Len) {
		return fmt.Errorf("%w: vectors of %d, %d and %d elements, want %d", ErrConfig, len(x), len(out), len(sent), b.cfg.Len)
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
	clear(sent)
	c := &bfRound{round: round, attempt: att, stateHash: stateHash, x: x, out: out, sent: sent,
		readies: map[transport.PeerID]bfReady{b.self: {stateHash, att, b.now}}, finishedBy: map[transport.PeerID]bool{}, me: -1}
	c.ranked = b.rank(round)
	for _, p := range b.view {
		c.frozen = c.frozen || b.suspended(p, round)
	}
	c.leadSince, c.readyAt = b.now, b.now
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
func (b *Butterfly) rank(round uint64) []transport.PeerID {
	key := func(p transport.PeerID) uint64 {
		h := fnv.New64a()
		var r [8]byte
		binary.LittleEndian.PutUint64(r[:], round)
		h.Write(r[:])
		h.Write([]byte(p))
		return h.Sum64()
	}
	out := slices.Clone(b.view)
	slices.SortFunc(out, func(x, y transport.PeerID) int {
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

func (b *Butterfly) send(to transport.PeerID, h header, body []byte) {
	if b.cfg.Hostile == HostileMute && h.kind != kindReady && h.kind != kindGroup && h.kind != kindFetch && h.kind != kindAudit {
		return // in every group it is put in, then silent; it still takes the result
	}
	p := appendMessage(make([]byte, 0, headerLen+len(body)), h, body)
	b.ready.Messages = append(b.ready.Messages, Envelope{To: to, Payload: p})
	b.ready.BytesSent += int64(len(p))
}

func (b *Butterfly) offend(p transport.PeerID, format string, args ...any) {
	if p == b.self {
		return
	}
	reason := fmt.Sprintf(format, args...)
	b.ready.Offenses = append(b.ready.Offenses, Offense{Peer: p, Reason: reason})
	b.Ban(p, reason)
}

// Step takes one message received from a peer. Malformed messages are
// dropped (their sender is reported when it provably misbehaved).
func (b *Butterfly) Step(from transport.PeerID, payload []byte) {
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

func (b *Butterfly) step(from transport.PeerID, h header, body []byte, fresh bool) {
	c := b.cur
	active := c != nil && c.result == nil
	switch h.kind {
	case kindFetch, kindAudit:
		if !slices.Contains(b.view, from) && !(c != nil && slices.Contains(c.group, from)) {
			return
		}
		if active && h.round == c.round && h.step >= c.attempt && (c.group == nil || h.step > c.attempt) {
			// Asked before this member took the group: a member left out
			// of it while ready (suspended, butterfly_silence.go) fetches
			// as soon as the group reaches it, which can be before it
			// reaches the owners. Answered once this member takes the
			// group (replay), instead of leaving the asker to its
			// deadlines.
			if fresh {
				b.stashMsg(from, h, body)
			}
			return
		}
		b.answer(from, h)
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
			r := bfReady{binary.LittleEndian.Uint64(body), h.step, b.arrived}
			if old, ok := c.readies[from]; ok && old.hash == r.hash && old.attempt == r.attempt {
				r.at = old.at // said again (readyResend): it has been ready since then
			}
			c.readies[from] = r
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
		// A group for a round this member finished, from someone who was not
		// in it: tell it (an echo from a member of that group is not news).
		if f := b.finished[h.round]; f != nil && (!active || c.round != h.round) && !slices.Contains(f.group, from) {
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
func (b *Butterfly) stashMsg(from transport.PeerID, h header, body []byte) {
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
		b.observeSilence(c)
		b.recentGroups = append(b.recentGroups, len(c.group))
		if len(b.recentGroups) > recentWindow {
			b.recentGroups = b.recentGroups[1:]
		}
		b.noGroupStreak = 0
	case c.group == nil && errors.Is(err, ErrRoundFailed):
		b.noGroupStreak++
	}
	for p := range b.silent {
		if b.suspended(p, c.round+1) {
			r.Suspended = append(r.Suspended, p)
		}
	}
	slices.Sort(r.Suspended)
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

// bfGroupHash names one attempt of a round and its group.
func bfGroupHash(round uint64, attempt uint32, group []transport.PeerID) uint64 {
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
func (b *Butterfly) gone(p transport.PeerID) bool {
	return p != b.self && !slices.Contains(b.view, p)
}

func short(p transport.PeerID) string {
	if len(p) > 12 {
		return string(p[len(p)-6:])
	}
	return string(p)
}

// tickEstimator smooths observed phase durations, in ticks.
type tickEstimator struct{ e estimator }

func (t *tickEstimator) observe(ticks int64) { t.e.observe(durationOfTicks(ticks)) }

// observeIf observes ticks when ok. A round that started while this
// member suspended someone (butterfly_silence.go) is not observed: it
// waited for fewer members than the run has, and learning from such fast
// rounds tuned the deadlines down, so that in the next round with the
// silent member in it (a probation) members gave up on a slow owner's
// aggregate at different times and ended with different bits (19 of 300
// seeds of TestButterflySuspensionDisagree; 1 with this, none once the
// gather took the aggregate over more inputs: settleAudit). Observing only
// the rounds slower than the mean did worse (12): deadlines that differ
// more from member to member.
func (t *tickEstimator) observeIf(ticks int64, ok bool) {
	if ok {
		t.observe(ticks)
	}
}

func (t *tickEstimator) deadline(initial, lo, hi int64) int64 {
	return ticksOfDuration(t.e.deadline(durationOfTicks(initial), durationOfTicks(lo), durationOfTicks(hi)))
}

func durationOfTicks(t int64) time.Duration { return time.Duration(t) * time.Second }

func ticksOfDuration(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }
