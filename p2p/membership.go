package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Timing holds memberlist's failure-detection and gossip timers.
type Timing struct {
	ProbeInterval           time.Duration // one probe per interval, round robin over members
	ProbeTimeout            time.Duration // ack deadline of a probe
	SuspicionMult           int           // suspicion timeout = mult * log10(n) * ProbeInterval
	SuspicionMaxTimeoutMult int           // upper bound of the suspicion timeout, times the minimum
	GossipInterval          time.Duration
	GossipNodes             int
	RetransmitMult          int
	PushPullInterval        time.Duration // full state sync with one random member
	StreamTimeout           time.Duration // memberlist's TCPTimeout: push/pull streams
	DeadNodeReclaimTime     time.Duration // a restarted peer may come back this soon
	GossipToTheDeadTime     time.Duration
}

// WANTiming is the production profile: memberlist's DefaultWANConfig (5 s
// probes, 3 s probe timeout, suspicion x6, push/pull every 60 s). A silent
// node is declared failed after about 40 s; a leave propagates in < 1 s.
func WANTiming() Timing {
	c := memberlist.DefaultWANConfig()
	t := fromConfig(c)
	t.DeadNodeReclaimTime = 10 * time.Second
	return t
}

// LANTiming is memberlist's DefaultLANConfig (1 s probes): failure in ~6-8 s.
func LANTiming() Timing {
	t := fromConfig(memberlist.DefaultLANConfig())
	t.DeadNodeReclaimTime = 5 * time.Second
	return t
}

// FastTiming is for in-process tests on loopback: failure in a few seconds.
func FastTiming() Timing {
	return Timing{
		ProbeInterval: 300 * time.Millisecond, ProbeTimeout: 250 * time.Millisecond,
		SuspicionMult: 3, SuspicionMaxTimeoutMult: 2,
		GossipInterval: 50 * time.Millisecond, GossipNodes: 4, RetransmitMult: 4,
		PushPullInterval: 3 * time.Second, StreamTimeout: 3 * time.Second,
		DeadNodeReclaimTime: time.Second, GossipToTheDeadTime: 5 * time.Second,
	}
}

// TimingNames lists the names TimingByName knows.
func TimingNames() []string { return []string{"wan", "lan", "fast"} }

// TimingByName returns the profile named "wan" (internet), "lan" or "fast"
// (tests).
func TimingByName(name string) (Timing, error) {
	switch name {
	case "wan":
		return WANTiming(), nil
	case "lan":
		return LANTiming(), nil
	case "fast":
		return FastTiming(), nil
	}
	return Timing{}, fmt.Errorf("p2p: timing %q: want one of %s", name, strings.Join(TimingNames(), ", "))
}

func fromConfig(c *memberlist.Config) Timing {
	return Timing{
		ProbeInterval: c.ProbeInterval, ProbeTimeout: c.ProbeTimeout,
		SuspicionMult: c.SuspicionMult, SuspicionMaxTimeoutMult: c.SuspicionMaxTimeoutMult,
		GossipInterval: c.GossipInterval, GossipNodes: c.GossipNodes, RetransmitMult: c.RetransmitMult,
		PushPullInterval: c.PushPullInterval, StreamTimeout: c.TCPTimeout,
		DeadNodeReclaimTime: c.DeadNodeReclaimTime, GossipToTheDeadTime: c.GossipToTheDeadTime,
	}
}

// Validate names the offending value.
func (t Timing) Validate() error {
	switch {
	case t.ProbeInterval <= 0 || t.ProbeTimeout <= 0 || t.ProbeTimeout > t.ProbeInterval:
		return fmt.Errorf("p2p: Timing.ProbeTimeout %v / ProbeInterval %v: want 0 < timeout <= interval", t.ProbeTimeout, t.ProbeInterval)
	case t.SuspicionMult < 1 || t.SuspicionMaxTimeoutMult < 1:
		return fmt.Errorf("p2p: Timing.SuspicionMult %d / SuspicionMaxTimeoutMult %d must be >= 1", t.SuspicionMult, t.SuspicionMaxTimeoutMult)
	case t.GossipInterval <= 0 || t.GossipNodes < 1 || t.RetransmitMult < 1:
		return fmt.Errorf("p2p: Timing gossip interval %v nodes %d retransmit %d must be positive", t.GossipInterval, t.GossipNodes, t.RetransmitMult)
	case t.PushPullInterval <= 0 || t.StreamTimeout <= 0:
		return fmt.Errorf("p2p: Timing.PushPullInterval %v / StreamTimeout %v must be positive", t.PushPullInterval, t.StreamTimeout)
	}
	return nil
}

// SuspicionTimeout is the longest a member stays suspect in a cluster of n
// before it is declared dead (memberlist shortens it as confirmations arrive).
func (t Timing) SuspicionTimeout(n int) time.Duration {
	scale := math.Max(1, math.Log10(math.Max(1, float64(n))))
	min := time.Duration(float64(t.SuspicionMult) * scale * float64(t.ProbeInterval))
	return time.Duration(t.SuspicionMaxTimeoutMult) * min
}

// FailureWindow bounds the time from a node going silent to every member of a
// cluster of n marking it failed: a probe cycle to notice, the probe timeout,
// the longest suspicion timeout, the gossip of the verdict, and the direct
// check each member makes before believing it (dispute.go).
func (t Timing) FailureWindow(n int) time.Duration {
	return 2*t.ProbeInterval + t.ProbeTimeout + t.SuspicionTimeout(n) + 10*t.GossipInterval + disputeTimeout
}

func (t Timing) apply(c *memberlist.Config) {
	c.ProbeInterval, c.ProbeTimeout = t.ProbeInterval, t.ProbeTimeout
	c.SuspicionMult, c.SuspicionMaxTimeoutMult = t.SuspicionMult, t.SuspicionMaxTimeoutMult
	c.GossipInterval, c.GossipNodes, c.RetransmitMult = t.GossipInterval, t.GossipNodes, t.RetransmitMult
	c.PushPullInterval, c.TCPTimeout = t.PushPullInterval, t.StreamTimeout
	c.DeadNodeReclaimTime, c.GossipToTheDeadTime = t.DeadNodeReclaimTime, t.GossipToTheDeadTime
}

// EventKind says what happened to a member.
type EventKind int

// Membership events.
const (
	EventJoin   EventKind = iota + 1 // a member appeared (or this subscriber's initial view)
	EventUpdate                      // a member's metadata changed
	EventLeave                       // a member left gracefully
	EventFail                        // a member was declared dead without leaving
)

func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventUpdate:
		return "update"
	case EventLeave:
		return "leave"
	case EventFail:
		return "fail"
	}
	return fmt.Sprintf("event(%d)", int(k))
}

// Member is one node of the run as this node sees it.
type Member struct {
	ID   peer.ID
	Addr string // memberlist address: the member's QUIC ip:port
	Meta Meta

	inc uint64 // the incarnation its metadata was signed at (metasig.go)
}

// Event is a membership change.
type Event struct {
	Kind   EventKind
	Member Member
	Time   time.Time
}

// Subscription delivers events in order on C. A slow subscriber never blocks
// membership or other subscribers: its events queue up until read.
type Subscription struct {
	C <-chan Event

	ev     *events
	c      chan Event
	mu     sync.Mutex
	queue  []Event
	wake   chan struct{}
	done   chan struct{}
	closed bool
}

// Close stops delivery and closes C.
func (s *Subscription) Close() {
	s.ev.mu.Lock()
	delete(s.ev.subs, s)
	s.ev.mu.Unlock()
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.done)
	}
	s.mu.Unlock()
}

func (s *Subscription) push(e Event) {
	s.mu.Lock()
	s.queue = append(s.queue, e)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *Subscription) pump() {
	defer close(s.c)
	for {
		s.mu.Lock()
		q := s.queue
		s.queue = nil
		s.mu.Unlock()
		for _, e := range q {
			select {
			case s.c <- e:
			case <-s.done:
				return
			}
		}
		select {
		case <-s.wake:
		case <-s.done:
			return
		}
	}
}

// Bounds of leftAt, the goodbyes waiting for memberlist's NotifyLeave. Any
// peer that can open a stream may send a goodbye (members-bye), so the table
// is bounded in time and in size.
const (
	// leaveWindow: a goodbye turns a NotifyLeave that follows within this
	// window into EventLeave. The goodbye is sent just before memberlist's
	// leave, whose dead message arrives in < 1 s, so a minute is ample.
	// Older goodbyes are never consulted, so they are expired after it
	// (expireLeft): an expired goodbye and a stale one both mean EventFail.
	leaveWindow = time.Minute
	// maxLeftAt bounds the goodbyes recorded at once: 4x the members a node
	// is sized for (DefaultLimits' ConnHigh of 256), so a whole run leaving
	// within a minute fits. When full the oldest goodbye is dropped: its
	// NotifyLeave has most likely come already. A peer flooding goodbyes
	// under fresh identities can at worst turn a leave into a fail.
	maxLeftAt = 1024
)

// events is memberlist's EventDelegate, AliveDelegate and MergeDelegate: it
// keeps the member table, refuses other runs and nodes the run's admission
// policy does not admit (admit.go), and fans events out.
type events struct {
	runID string
	self  peer.ID
	log   *slog.Logger
	hooks func(kind EventKind, m Member) // node bookkeeping, called under mu
	// direct returns the IP of a direct connection from this node to a
	// member (admit.go), false when there is none; nil (tests of the table
	// alone): every member is taken as connected from the address it
	// announces.
	direct func(id peer.ID, addr string) (net.IP, bool)

	mu sync.Mutex
	// members holds every member memberlist reports alive; live those
	// that count (admit.go: promote), each with the IP its prefix is taken
	// from. The others are pending.
	members map[peer.ID]Member
	live    map[peer.ID]net.IP
	// until holds the token expiry of each member of a closed run: a
	// member is not listed from then on, and the next sweep (expireTokens)
	// reports it failed.
	until  map[peer.ID]time.Time
	subs   map[*Subscription]struct{}
	leftAt map[peer.ID]time.Time // peers that said goodbye; bounded by leaveWindow and maxLeftAt
	closed bool

	// Disputes (dispute.go): reach, when set, checks directly that a
	// member memberlist declared failed still answers; nil trusts
	// memberlist. blame, when set, names who declared a member failed, for
	// the log. disputed holds the members being checked (at most
	// maxDisputes), each with its goroutine, counted in arbiters and
	// stopped by close (stop).
	reach          func(ctx context.Context, id peer.ID) error
	blame          func(id peer.ID) []string
	disputeTimeout time.Duration
	disputeRecheck time.Duration
	disputed       map[peer.ID]*dispute
	stop           context.Context
	stopAll        context.CancelFunc
	arbiters       sync.WaitGroup

	// The admission policy (admit.go). While learning (a node that takes
	// the policy from the peers it joins through and has not yet) only the
	// node itself is admitted.
	adm      Admission
	learning bool
	exempt   map[peer.ID]bool // seeds: never refused by a cap
	// door holds the peers the admission handshake let in recently (closed
	// runs), until when; bounded by doorTTL and maxDoor.
	door map[peer.ID]time.Time
}

func newEvents(runID string, self peer.ID, log *slog.Logger) *events {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	stop, stopAll := context.WithCancel(context.Background())
	return &events{runID: runID, self: self, log: log,
		members: make(map[peer.ID]Member), live: make(map[peer.ID]net.IP), until: make(map[peer.ID]time.Time), subs: make(map[*Subscription]struct{}),
		leftAt: make(map[peer.ID]time.Time), exempt: make(map[peer.ID]bool), door: make(map[peer.ID]time.Time),
		disputeTimeout: disputeTimeout, disputeRecheck: disputeRecheck, disputed: make(map[peer.ID]*dispute),
		stop: stop, stopAll: stopAll}
}

func (e *events) subscribe() *Subscription {
	c := make(chan Event)
	s := &Subscription{C: c, c: c, ev: e, wake: make(chan struct{}, 1), done: make(chan struct{})}
	e.mu.Lock()
	now := time.Now()
	for _, m := range e.members {
		s.queue = append(s.queue, Event{Kind: EventJoin, Member: m, Time: now})
	}
	if e.closed {
		s.closed = true
		close(s.done)
	} else {
		e.subs[s] = struct{}{}
	}
	e.mu.Unlock()
	go s.pump()
	return s
}

func (e *events) close() {
	e.mu.Lock()
	e.closed = true // no dispute starts from now on
	subs := e.subs
	e.subs = map[*Subscription]struct{}{}
	e.mu.Unlock()
	e.stopAll()
	e.arbiters.Wait()
	for s := range subs {
		s.mu.Lock()
		if !s.closed {
			s.closed = true
			close(s.done)
		}
		s.mu.Unlock()
	}
}

// list returns the members that count (live, within their token), or with
// pending those that have not proved themselves live yet.
func (e *events) list(pending bool) []Member {
	e.promote()
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Member
	for id, m := range e.members {
		_, live := e.live[id]
		if pending && !live || !pending && live && e.liveLocked(id, now) {
			out = append(out, m)
		}
	}
	return out
}

func (e *events) count() int { return len(e.list(false)) }

func (e *events) get(id peer.ID) (Member, bool) {
	e.promote()
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	m, ok := e.members[id]
	return m, ok && e.countsLocked(id, now)
}

// countsLocked reports whether member id counts: it proved itself live
// (promote) and its token (if any) is still valid.
func (e *events) countsLocked(id peer.ID, now time.Time) bool {
	_, live := e.live[id]
	return live && e.liveLocked(id, now)
}

// liveLocked reports whether member id's token (if any) is still valid.
func (e *events) liveLocked(id peer.ID, now time.Time) bool {
	u, ok := e.until[id]
	return !ok || now.Before(u)
}

// markLeft records a goodbye from id received at now. When the table is full
// it first expires old goodbyes, then drops the oldest.
func (e *events) markLeft(id peer.ID, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.leftAt[id]; !ok && len(e.leftAt) >= maxLeftAt {
		e.expireLeftLocked(now)
		if len(e.leftAt) >= maxLeftAt {
			var oldest peer.ID
			var at time.Time
			found := false
			for p, t := range e.leftAt {
				if !found || t.Before(at) {
					oldest, at, found = p, t, true
				}
			}
			delete(e.leftAt, oldest)
		}
	}
	e.leftAt[id] = now
}

// expireLeft forgets goodbyes older than leaveWindow at now: NotifyLeave
// would no longer count them. The node calls it periodically, so goodbyes
// from peers memberlist never reports (non-members) do not linger.
func (e *events) expireLeft(now time.Time) {
	e.mu.Lock()
	e.expireLeftLocked(now)
	e.mu.Unlock()
}

func (e *events) expireLeftLocked(now time.Time) {
	for p, t := range e.leftAt {
		if now.Sub(t) >= leaveWindow {
			delete(e.leftAt, p)
		}
	}
}

// member decodes n and checks it: metadata signed by its own key for its
// address (metasig.go), of this run, and in a closed run a token for it and its
// role (see admit).
func (e *events) member(n *memberlist.Node) (Member, error) {
	m, _, err := e.admit(n, time.Now())
	return m, err
}

// decode is member without the admission policy.
func (e *events) decode(n *memberlist.Node) (Member, error) {
	id, err := peer.Decode(n.Name)
	if err != nil {
		return Member{}, fmt.Errorf("p2p: member name %q: %w", n.Name, err)
	}
	fields, inc, err := verifyMeta(id, n.Addr, n.Port, n.Meta)
	if err != nil {
		return Member{}, fmt.Errorf("p2p: member %s: %w", id, err)
	}
	var meta Meta
	if err := meta.UnmarshalBinary(fields); err != nil {
		return Member{}, fmt.Errorf("p2p: member %s: %w", id, err)
	}
	if meta.RunID != e.runID {
		return Member{}, fmt.Errorf("%w: member %s has run %q, this node %q", ErrWrongRun, id, meta.RunID, e.runID)
	}
	return Member{ID: id, Addr: n.Address(), Meta: meta, inc: inc}, nil
}

func (e *events) emit(kind EventKind, m Member) {
	e.emitUntil(kind, m, time.Time{})
}

// emitUntil is emit for a member whose token expires at until (zero: no
// token, an open run).
func (e *events) emitUntil(kind EventKind, m Member, until time.Time) {
	e.mu.Lock()
	e.emitLocked(kind, m, until)
	e.mu.Unlock()
}

// emitLocked updates the member table and tells the node and the
// subscribers; e.mu is held, so that a decision taken under it (a dispute
// settled, a goodbye consumed) and its event are one step. Any event about
// a member ends a dispute about it (dispute.go).
func (e *events) emitLocked(kind EventKind, m Member, until time.Time) {
	ev := Event{Kind: kind, Member: m, Time: time.Now()}
	e.endDisputeLocked(m.ID)
	switch kind {
	case EventJoin, EventUpdate:
		e.members[m.ID] = m
		e.setUntilLocked(m.ID, until)
	case EventLeave, EventFail:
		delete(e.members, m.ID)
		delete(e.live, m.ID)
		delete(e.until, m.ID)
	}
	if e.hooks != nil {
		e.hooks(kind, m)
	}
	for s := range e.subs {
		s.push(ev)
	}
}

func (e *events) setUntilLocked(id peer.ID, until time.Time) {
	if until.IsZero() {
		delete(e.until, id)
	} else {
		e.until[id] = until
	}
}

// NotifyJoin is memberlist's EventDelegate.
func (e *events) NotifyJoin(n *memberlist.Node) {
	m, until, err := e.admit(n, time.Now())
	if err != nil {
		e.log.Warn("member ignored", "node", n.Name, "err", err)
		return
	}
	e.readmit(m, until)
}

// NotifyUpdate is memberlist's EventDelegate. A member that was dropped
// when its token expired comes back with a new one as a join.
func (e *events) NotifyUpdate(n *memberlist.Node) {
	m, until, err := e.admit(n, time.Now())
	if err != nil {
		e.log.Warn("member update ignored", "node", n.Name, "err", err)
		return
	}
	e.readmit(m, until)
}

// readmit records m as memberlist reports it alive: a join when it is not
// listed, an update when it is. A disputed member that memberlist takes
// back unchanged (its refutation of a forged death, dispute.go) ends the
// dispute without an event: subscribers never saw it go.
func (e *events) readmit(m Member, until time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	old, known := e.members[m.ID]
	if known && m.inc < old.inc {
		return // older metadata (NotifyAlive refuses it; memberlist may still report it)
	}
	if e.endDisputeLocked(m.ID) && old == m {
		e.setUntilLocked(m.ID, until)
		return
	}
	kind := EventJoin
	if known {
		kind = EventUpdate
	}
	e.emitLocked(kind, m, until)
}

// NotifyLeave is memberlist's EventDelegate. memberlist v0.7.0 does not tell
// left from dead here, so a leave is recognised by the goodbye the leaving
// node sends just before (protocol members-bye). A failure is not taken on
// memberlist's word alone: the member is checked directly first
// (dispute.go). memberlist calls this under its own lock, so nothing here
// waits.
func (e *events) NotifyLeave(n *memberlist.Node) {
	id, err := peer.Decode(n.Name)
	if err != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	m, known := e.members[id]
	at, left := e.leftAt[id]
	delete(e.leftAt, id)
	if !known {
		return
	}
	if left && time.Since(at) < leaveWindow {
		e.emitLocked(EventLeave, m, time.Time{})
		return
	}
	if e.disputeLocked(m) {
		return
	}
	e.emitLocked(EventFail, m, time.Time{})
}

// NotifyAlive is memberlist's AliveDelegate: members of other runs,
// undecodable or unsigned metadata or metadata signed for another address,
// metadata older than the member's current one, and nodes the admission
// policy does not admit (no valid token in a closed run, past a cap, or
// one pending too many) are refused, so they never become members.
func (e *events) NotifyAlive(n *memberlist.Node) error {
	m, _, err := e.admit(n, time.Now())
	if err != nil {
		return err
	}
	e.mu.Lock()
	old, known := e.members[m.ID]
	e.mu.Unlock()
	if known && m.inc < old.inc {
		return fmt.Errorf("%w: member %s at %d, current %d", errStaleMeta, m.ID, m.inc, old.inc)
	}
	return e.checkCaps(m)
}

// NotifyMerge is memberlist's MergeDelegate: a push/pull (a join) that would
// bring in a member of another run, unsigned metadata or a member without a
// token of this run is refused as a whole. An expired token or a cap is
// not a reason to refuse the whole state of a member whose view differs
// from this node's: memberlist checks each node of the merge with
// NotifyAlive as well, which refuses those nodes alone.
func (e *events) NotifyMerge(nodes []*memberlist.Node) error {
	now := time.Now()
	for _, n := range nodes {
		if _, _, err := e.admit(n, now); err != nil && !errors.Is(err, ErrTokenExpired) {
			return err
		}
	}
	return nil
}

// metaDelegate is memberlist's Delegate: it only supplies node metadata.
type metaDelegate struct {
	mu   sync.Mutex
	meta []byte
}

func (d *metaDelegate) set(b []byte) { d.mu.Lock(); d.meta = b; d.mu.Unlock() }

func (d *metaDelegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.meta) > limit {
		return nil
	}
	return d.meta
}
func (d *metaDelegate) NotifyMsg([]byte)                           {}
func (d *metaDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *metaDelegate) LocalState(join bool) []byte                { return nil }
func (d *metaDelegate) MergeRemoteState(buf []byte, join bool)     {}

// slogWriter maps memberlist's "[LEVEL] memberlist: ..." lines onto slog.
// Its routine chatter goes to debug so that a volunteer's default output
// stays readable: INFO lines (suspicions, members marked failed, which the
// node reports itself as events) and the WARN lines of ordinary failure
// detection on the internet (refuting a suspicion, a probe without an ack).
type slogWriter struct{ log *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	lvl := slog.LevelInfo
	if i := bytes.IndexByte(line, '['); i >= 0 {
		rest := line[i:]
		switch {
		case bytes.HasPrefix(rest, []byte("[DEBUG]")), bytes.HasPrefix(rest, []byte("[INFO]")):
			lvl = slog.LevelDebug
		case bytes.HasPrefix(rest, []byte("[WARN]")):
			lvl = slog.LevelWarn
			if routineWarning(rest) {
				lvl = slog.LevelDebug
			}
		case bytes.HasPrefix(rest, []byte("[ERR]")):
			lvl = slog.LevelError
			if bytes.Contains(rest, []byte(ErrClosed.Error())) {
				lvl = slog.LevelDebug // a send racing this node's own shutdown
			}
		}
		line = rest
	}
	w.log.Log(context.Background(), lvl, string(line), "component", "memberlist")
	return len(p), nil
}

var _ io.Writer = slogWriter{}

// routineWarning reports memberlist warnings that are part of normal failure
// detection over the internet rather than a problem to act on.
func routineWarning(line []byte) bool {
	for _, w := range []string{"Refuting", "suspect", "Suspect", "no acks", "Failed fallback ping", "Failed to send ping"} {
		if bytes.Contains(line, []byte(w)) {
			return true
		}
	}
	return false
}
