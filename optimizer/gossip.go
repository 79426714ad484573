package optimizer

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/transport"
)

// Gossip is the exchange of one member's NoLoCo steps as an I/O-free state
// machine, like Butterfly: it owns no goroutine, clock or socket. The
// driver feeds it the membership (SetMembers), the steps partners announce
// (Announce), received messages (Step) and the passage of time (Tick), and
// after each call takes what it produced (Ready); every interleaving is a
// deterministic unit test (gossip_test.go runs the scripted scenarios of
// testdata/noloco).
//
// Step s of a member with slow weights phi and outer gradient d: Start
// sends (phi, d) to the other members of its group at s (NoLoCoGroups over
// the members it sees) and takes theirs as they come, each decoded within
// MaxAbs and clipped (noloco_clip.go). The step ends when every partner is
// heard or given up on (its message was refused, or it announced a later
// step MinDeadline ago), or when the adaptive deadline passes; the result is
// the mean of this member's and the heard partners' phi and d, to which the
// caller applies NoLoCoUpdate. Between steps the machine keeps the partners'
// messages for the next steps within byte budgets (keep).
type Gossip struct {
	cfg   NoLoCoConfig
	self  transport.PeerID
	view  []transport.PeerID // sorted, self included
	now   int64
	step  uint64   // the step running, or the next one
	waits [3]int64 // InitialDeadline, MinDeadline, MaxDeadline in ticks

	encPhi, encD *compression.Encoder
	dec          *compression.Decoder
	phibar, dbar []float32 // the step's sums, then means
	tmp          []float32

	// arrived holds, by step, the messages of that step's partners for
	// step to step+2, one per sender; ahead each partner's newest for a
	// later step: from a member this one is about to catch up with (a
	// joiner, or a member that fell behind, before it adopts a state).
	// Both within the byte budget (keep).
	arrived map[uint64][]envelope
	ahead   map[transport.PeerID]envelope
	maxBody int   // maxGossipBody of the model
	budget  int64 // MaxStashBytes, at least 8 messages of maxBody
	// norms and dists are the last normWindow own outer-gradient norms and
	// accepted partner distances (noloco_clip.go).
	norms, dists []float64
	est          tickEstimator

	cur *gossipStep
	// lie is a hostile member's (NoLoCoConfig.Hostile; nil when honest).
	lie *gossipLie
	// What the machine produced since the driver last drained it.
	out      []Envelope
	rejected []rejection
	result   *GossipResult // once per Start
}

type gossipStep struct {
	phi, d  []float32 // this member's (not the machine's: d takes partners' too)
	ref     float64   // the median own norm
	res     *GossipResult
	settled map[transport.PeerID]bool // heard or given up on, self included
	movedOn map[transport.PeerID]int64
	began   int64
	wait    int64
}

// GossipResult is the end of a step: Err nil means PhiBar and DBar (the
// machine's, valid until the next Start) hold the means to apply.
type GossipResult struct {
	GossipStats
	PhiBar, DBar []float32
	Err          error
}

// NewGossip returns the machine of member self for a model of n
// parameters, at step 0.
func NewGossip(cfg NoLoCoConfig, self transport.PeerID, n int) (*Gossip, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	encPhi, err := compression.NewEncoder(cfg.PhiCodec)
	if err != nil {
		return nil, err
	}
	encD, err := compression.NewEncoder(cfg.DeltaCodec)
	if err != nil {
		return nil, err
	}
	// The decoder refuses a frame declaring more elements than the model
	// before allocating anything for it.
	dc := cfg.DeltaCodec
	dc.MaxElements = int64(n)
	dec, err := compression.NewDecoder(dc)
	if err != nil {
		return nil, err
	}
	tick := cfg.tick()
	ticks := func(d time.Duration) int64 { return int64((d + tick - 1) / tick) }
	g := &Gossip{cfg: cfg, self: self, view: []transport.PeerID{self},
		waits:  [3]int64{ticks(cfg.InitialDeadline), ticks(cfg.MinDeadline), ticks(cfg.MaxDeadline)},
		encPhi: encPhi, encD: encD, dec: dec, phibar: make([]float32, n), dbar: make([]float32, n), tmp: make([]float32, n),
		arrived: map[uint64][]envelope{}, ahead: map[transport.PeerID]envelope{},
		maxBody: maxGossipBody(n), budget: max(cfg.MaxStashBytes, 8*int64(maxGossipBody(n)))}
	if cfg.Hostile != "" {
		g.lie = &gossipLie{mode: cfg.Hostile}
	}
	return g, nil
}

// tick is the gossip's clock: an eighth of MinDeadline, within [1 ms, 250 ms].
func (c NoLoCoConfig) tick() time.Duration {
	return min(max(c.MinDeadline/8, time.Millisecond), 250*time.Millisecond)
}

// Close releases the codecs.
func (g *Gossip) Close() {
	g.encPhi.Close()
	g.encD.Close()
	g.dec.Close()
}

// SetMembers sets the members this one sees (self is always included).
func (g *Gossip) SetMembers(ms []transport.PeerID) {
	g.view = sortedGroup(append(slices.Clone(ms), g.self))
}

// Ready returns and clears what the machine produced: messages to send,
// offenders and, once per Start, the step's result.
func (g *Gossip) Ready() ([]Envelope, []rejection, *GossipResult) {
	defer func() { g.out, g.rejected, g.result = nil, nil, nil }()
	return g.out, g.rejected, g.result
}

// groupAt is this member's group at step, by the members it sees.
func (g *Gossip) groupAt(step uint64) []transport.PeerID {
	for _, grp := range NoLoCoGroups(g.view, step, g.cfg.GroupSize) {
		if slices.Contains(grp, g.self) {
			return grp
		}
	}
	return nil
}

// Advance makes step the next to run: messages of other steps than step
// to step+2 are dropped and those kept ahead move into that window. It is
// how a member that adopts a state (SetState) skips steps; call it between
// steps.
func (g *Gossip) Advance(step uint64) {
	g.step = step
	for s := range g.arrived {
		if s < step || s > step+2 {
			delete(g.arrived, s)
		}
	}
	for from, e := range g.ahead {
		switch r := e.h.round; {
		case r < step:
			delete(g.ahead, from)
		case r <= step+2:
			delete(g.ahead, from)
			if !slices.ContainsFunc(g.arrived[r], func(e envelope) bool { return e.from == from }) {
				g.arrived[r] = append(g.arrived[r], e)
			}
		}
	}
}

// Start runs step: it sends phi and the outer gradient d (the model's size
// each) to the step's partners. The machine reads phi and overwrites d
// with partners' until the step's result is out.
func (g *Gossip) Start(step uint64, phi, d []float32) error {
	if len(phi) != len(g.tmp) || len(d) != len(g.tmp) {
		return fmt.Errorf("%w: vectors of %d and %d elements, want %d", ErrConfig, len(phi), len(d), len(g.tmp))
	}
	if g.cur != nil {
		return fmt.Errorf("optimizer: step %d started while step %d is in progress", step, g.step)
	}
	if err := checkFinite(d, g.cfg.MaxAbs); err != nil {
		return fmt.Errorf("own outer gradient: %w", err)
	}
	g.Advance(step)
	sendPhi, sendD := phi, d
	if g.lie != nil {
		sendPhi, sendD = g.lie.lie(phi, d)
	}
	body, err := g.encode(sendPhi, sendD, step)
	if err != nil {
		return err
	}
	c := &gossipStep{phi: phi, d: d, ref: g.observeNorm(l2(d)), res: &GossipResult{GossipStats: GossipStats{Step: step, Group: g.groupAt(step)}},
		settled: map[transport.PeerID]bool{g.self: true}, movedOn: map[transport.PeerID]int64{}, began: g.now,
		wait: g.est.deadline(g.waits[0], g.waits[1], g.waits[2])}
	msg := appendMessage(nil, header{kind: kindGossip, round: step}, body)
	var out []Envelope
	if g.lie != nil && g.lie.mode == HostileNoLoCoBomb {
		if out, err = g.flood(step); err != nil {
			return err
		}
	} else {
		for _, p := range c.res.Group {
			if p != g.self {
				out = append(out, Envelope{To: p, Payload: msg})
			}
		}
	}
	for _, e := range out {
		g.out = append(g.out, e)
		c.res.BytesSent += int64(len(e.Payload))
	}
	copy(g.phibar, phi)
	copy(g.dbar, d)
	g.cur = c
	g.take()
	return nil
}

// Announce tells the machine that p says it will run step next. A partner
// past the step running has finished it and will send nothing more for it:
// the machine waits for it at most MinDeadline longer (its message may
// still be in flight), not a whole deadline, which for a newcomer is the
// long InitialDeadline. (Members' views of the group differ for a moment
// when one joins.)
func (g *Gossip) Announce(p transport.PeerID, step uint64) {
	if c := g.cur; c != nil && step > g.step && !c.settled[p] && slices.Contains(c.res.Group, p) {
		if _, ok := c.movedOn[p]; !ok {
			c.movedOn[p] = g.now
		}
	}
}

// Awaited lists the partners the step running still waits for.
func (g *Gossip) Awaited() []transport.PeerID {
	if g.cur == nil {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(g.cur.res.Group), func(p transport.PeerID) bool { return g.cur.settled[p] })
}

// Tick advances the clock by one tick.
func (g *Gossip) Tick() {
	g.now++
	c := g.cur
	if c == nil {
		return
	}
	for p, at := range c.movedOn {
		if g.now-at > g.waits[1] { // > : at least MinDeadline, wherever between ticks p was seen
			c.settled[p] = true
		}
	}
	if g.now-c.began > c.wait { // as above: at least the deadline
		g.finish()
		return
	}
	g.check()
}

// Cancel ends the step running, if any, with err; nothing is applied and
// the step stays the next to run.
func (g *Gossip) Cancel(err error) {
	if g.cur != nil {
		g.cur.res.Err = err
		g.result, g.cur = g.cur.res, nil
	}
}

// Step takes a received message. Only partners' messages are kept: a
// message is kept only from a member of this member's group at the
// message's step.
func (g *Gossip) Step(from transport.PeerID, payload []byte) {
	if g.offer(from, payload) && g.cur != nil {
		g.take()
	}
}

// offer checks a received message and keeps it if it is a partner's, and
// says whether it did.
func (g *Gossip) offer(from transport.PeerID, payload []byte) bool {
	h, body, err := parseMessage(payload)
	switch {
	case from == g.self:
		return false
	case err != nil:
	case h.kind != kindGossip:
		err = fmt.Errorf("%w: %s message in a NoLoCo swarm", ErrBadMessage, h.kind)
	case len(body) > g.maxBody:
		err = fmt.Errorf("%w: gossip body of %d bytes, at most %d for this model", ErrBadMessage, len(body), g.maxBody)
	}
	if err != nil {
		g.rejected = append(g.rejected, rejection{from, err})
		return false
	}
	return slices.Contains(g.groupAt(h.round), from) && g.keep(envelope{from: from, h: h, body: body})
}

// keep stores a partner's message: one per sender for the current step and
// the next two (partners that finished their inner phase earlier), and one
// per sender, its newest, for any later step. It is dropped when the bytes
// kept would pass the budget, a quarter of it for one sender or half of it
// for steps beyond the next two, so memory stays bounded whatever any
// number of members send (the partners of one step are at most 2g-1).
// It says whether it kept e.
func (g *Gossip) keep(e envelope) bool {
	r := e.h.round
	old, hasOld := g.ahead[e.from]
	switch {
	case r < g.step:
		return false
	case r <= g.step+2:
		if slices.ContainsFunc(g.arrived[r], func(k envelope) bool { return k.from == e.from }) {
			return false
		}
	case hasOld && old.h.round >= r:
		return false
	}
	var total, mine, later int64
	count := func(k envelope) {
		n := int64(len(k.body))
		total += n
		if k.from == e.from {
			mine += n
		}
		if k.h.round > g.step+2 {
			later += n
		}
	}
	for _, es := range g.arrived {
		for _, k := range es {
			count(k)
		}
	}
	for from, k := range g.ahead {
		if from != e.from || r <= g.step+2 { // a later one replaces e.from's
			count(k)
		}
	}
	n := int64(len(e.body))
	if total+n > g.budget || mine+n > g.budget/4 || (r > g.step+2 && later+n > g.budget/2) {
		return false
	}
	if r <= g.step+2 {
		g.arrived[r] = append(g.arrived[r], e)
	} else {
		g.ahead[e.from] = e
	}
	return true
}

// take adds the running step's kept messages to the sums, each decoded and
// clipped, and ends the step once every partner is settled.
func (g *Gossip) take() {
	c := g.cur
	msgs := g.arrived[g.step]
	delete(g.arrived, g.step)
	for _, e := range msgs {
		if c.settled[e.from] || !slices.Contains(c.res.Group, e.from) {
			continue
		}
		c.settled[e.from] = true // heard, or not waited for again
		c.res.BytesRecv += int64(len(e.body) + headerLen)
		// own was added to dbar: its buffer takes the partner's.
		if err := decodeGossip(g.dec, e.body, g.tmp, c.d, g.cfg.MaxAbs); err != nil {
			g.rejected = append(g.rejected, rejection{e.from, err})
			continue
		}
		if clipped, outlier := g.clipPartner(c.phi, g.tmp, c.d, c.ref); clipped {
			c.res.Clipped = append(c.res.Clipped, e.from)
			if outlier {
				c.res.Outliers = append(c.res.Outliers, e.from)
			}
		}
		for i := range g.phibar {
			g.phibar[i] += g.tmp[i]
			g.dbar[i] += c.d[i]
		}
		c.res.Heard = append(c.res.Heard, e.from)
		g.est.observe(g.now - c.began)
	}
	g.check()
}

// check ends the step once every partner is settled.
func (g *Gossip) check() {
	if len(g.cur.settled) == len(g.cur.res.Group) {
		g.finish()
	}
}

// finish ends the step running with the means of what was heard.
func (g *Gossip) finish() {
	res := g.cur.res
	inv := 1 / float32(len(res.Heard)+1)
	for i := range g.phibar {
		g.phibar[i] *= inv
		g.dbar[i] *= inv
	}
	res.PhiBar, res.DBar = g.phibar, g.dbar
	g.result, g.cur = res, nil
	g.Advance(g.step + 1)
}

// maxGossipBody bounds a gossip body for n parameters: both frames in fp32
// plus framing (chunk headers, zstd's block headers).
func maxGossipBody(n int) int { return 8*n + n/64 + 1<<16 }

// encode makes the gossip body: 4-byte length of the phi frame, the phi
// frame, then the outer-gradient frame.
func (g *Gossip) encode(phi, d []float32, step uint64) ([]byte, error) {
	body := make([]byte, 4, 4+len(phi)*3)
	body, err := g.encPhi.Append(body, phi, step)
	if err != nil {
		return nil, err
	}
	binary.LittleEndian.PutUint32(body, uint32(len(body)-4))
	return g.encD.Append(body, d, step)
}

// decodeGossip decodes a gossip body into phi and d, each the model's
// size. dec refuses frames declaring more elements than that (NewGossip
// builds it with MaxElements the model's size), so a frame allocates
// nothing whatever it declares. Every value must be within maxAbs.
func decodeGossip(dec *compression.Decoder, body []byte, phi, d []float32, maxAbs float32) error {
	if len(body) < 4 {
		return fmt.Errorf("%w: gossip body of %d bytes", ErrBadMessage, len(body))
	}
	n := binary.LittleEndian.Uint32(body)
	if uint64(n) > uint64(len(body)-4) {
		return fmt.Errorf("%w: phi frame of %d bytes, %d present", ErrBadMessage, n, len(body)-4)
	}
	for _, f := range []struct {
		name  string
		frame []byte
		dst   []float32
	}{{"phi", body[4 : 4+n], phi}, {"outer gradient", body[4+n:], d}} {
		got, err := dec.DecodeBytes(f.frame, f.dst)
		if err != nil {
			return fmt.Errorf("%w: %s: %w", ErrRejected, f.name, err)
		}
		if len(got) != len(f.dst) {
			return fmt.Errorf("%w: %s of %d elements, want %d", ErrRejected, f.name, len(got), len(f.dst))
		}
		if err := checkFinite(f.dst, maxAbs); err != nil { // beyond maxAbs would overflow the mean
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return nil
}
