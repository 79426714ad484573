package p2p

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/libp2p/go-libp2p/core/peer"
)

// fakeReach is a direct check whose answer the test sets.
type fakeReach struct {
	mu     sync.Mutex
	down   map[peer.ID]bool
	checks map[peer.ID]int
}

func newFakeReach() *fakeReach {
	return &fakeReach{down: make(map[peer.ID]bool), checks: make(map[peer.ID]int)}
}

func (f *fakeReach) reach(ctx context.Context, id peer.ID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checks[id]++
	if f.down[id] {
		return errors.New("fake: no answer")
	}
	return nil
}

func (f *fakeReach) set(id peer.ID, down bool) { f.mu.Lock(); f.down[id] = down; f.mu.Unlock() }
func (f *fakeReach) count(id peer.ID) int      { f.mu.Lock(); defer f.mu.Unlock(); return f.checks[id] }

// LogRecorder is a slog.Handler that keeps every record with the
// attributes it was logged with (the external tests use it too).
type LogRecorder struct {
	attrs []slog.Attr
	mu    *sync.Mutex
	recs  *[]LogRecord
}

// LogRecord is one recorded log line.
type LogRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]slog.Value
}

// NewLogRecorder returns an empty recorder.
func NewLogRecorder() *LogRecorder { return &LogRecorder{mu: new(sync.Mutex), recs: new([]LogRecord)} }

func (r *LogRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *LogRecorder) WithGroup(string) slog.Handler            { return r }
func (r *LogRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *r
	c.attrs = append(append([]slog.Attr(nil), r.attrs...), as...)
	return &c
}

func (r *LogRecorder) Handle(_ context.Context, rec slog.Record) error {
	lr := LogRecord{Level: rec.Level, Msg: rec.Message, Attrs: make(map[string]slog.Value)}
	for _, a := range r.attrs {
		lr.Attrs[a.Key] = a.Value
	}
	rec.Attrs(func(a slog.Attr) bool { lr.Attrs[a.Key] = a.Value; return true })
	r.mu.Lock()
	*r.recs = append(*r.recs, lr)
	r.mu.Unlock()
	return nil
}

// Records returns the records at level or above whose message contains msg.
func (r *LogRecorder) Records(level slog.Level, msg string) []LogRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []LogRecord
	for _, lr := range *r.recs {
		if lr.Level >= level && strings.Contains(lr.Msg, msg) {
			out = append(out, lr)
		}
	}
	return out
}

// disputeWarning is the start of the warning a dispute logs.
const disputeWarning = "answers directly"

// awaitUnlisted waits until ev no longer holds member id: a failure
// memberlist declares is reported once the direct check has failed
// (dispute.go), a dial and a ping later on a real node.
func awaitUnlisted(t testing.TB, ev *events, id peer.ID) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		ev.mu.Lock()
		_, listed := ev.members[id]
		ev.mu.Unlock()
		if !listed {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("member %s still listed after 10 s", id)
		}
	}
}

// The dispute logic with a fake direct check: memberlist's NotifyLeave
// without a goodbye drops a member only once the check fails.
func TestDispute(t *testing.T) {
	type env struct {
		t     *testing.T
		ev    *events
		reach *fakeReach
		log   *LogRecorder
		sub   *Subscription
		id    peer.ID
		node  *memberlist.Node
		move  func(addr string) *memberlist.Node // the member at another address
	}
	// next returns the next event about the member other than its join,
	// or false when none comes within d.
	next := func(e *env, d time.Duration) (Event, bool) {
		for {
			select {
			case ev := <-e.sub.C:
				if ev.Kind == EventJoin && ev.Member.ID == e.id {
					continue
				}
				return ev, true
			case <-time.After(d):
				return Event{}, false
			}
		}
	}
	expect := func(e *env, kind EventKind) {
		e.t.Helper()
		ev, ok := next(e, 10*time.Second)
		if !ok || ev.Kind != kind || ev.Member.ID != e.id {
			e.t.Fatalf("event %v of %s (received %v), want %v of %s", ev.Kind, ev.Member.ID, ok, kind, e.id)
		}
	}
	// listedThrough checks that the member stays listed, and no event
	// comes, while it is checked again n times.
	listedThrough := func(e *env, n int) {
		e.t.Helper()
		for start := e.reach.count(e.id); e.reach.count(e.id) < start+n; time.Sleep(5 * time.Millisecond) {
			if _, ok := e.ev.get(e.id); !ok {
				e.t.Fatal("disputed member dropped from the list")
			}
		}
		if ev, ok := next(e, 0); ok {
			e.t.Fatalf("unexpected event %v of %s", ev.Kind, ev.Member.ID)
		}
	}
	warnings := func(e *env) int { return len(e.log.Records(slog.LevelWarn, disputeWarning)) }

	cases := []struct {
		name string
		run  func(e *env)
	}{
		{"forged dead of a reachable member: listed, no event, one warning", func(e *env) {
			e.ev.NotifyLeave(e.node)
			listedThrough(e, 3)
			if n := warnings(e); n != 1 {
				e.t.Fatalf("%d warnings, want 1", n)
			}
			if w := e.log.Records(slog.LevelWarn, disputeWarning)[0]; w.Attrs["member"].String() != e.id.String() ||
				!strings.Contains(w.Attrs["accusations"].String(), "blamed "+e.id.String()) {
				e.t.Fatalf("warning %q %v does not name the member and its accusers", w.Msg, w.Attrs)
			}
		}},
		{"unreachable member: fail after the check", func(e *env) {
			e.reach.set(e.id, true)
			e.ev.NotifyLeave(e.node)
			expect(e, EventFail)
			if _, ok := e.ev.get(e.id); ok || e.reach.count(e.id) != 1 {
				e.t.Fatalf("failed member still listed, or checked %d times (want 1)", e.reach.count(e.id))
			}
			if warnings(e) != 0 {
				e.t.Fatal("warned about a member that does not answer")
			}
		}},
		{"goodbye then leave: immediate, unchecked", func(e *env) {
			e.ev.markLeft(e.id, time.Now())
			e.ev.NotifyLeave(e.node)
			if _, ok := e.ev.get(e.id); ok {
				e.t.Fatal("member listed after its leave")
			}
			expect(e, EventLeave)
			if n := e.reach.count(e.id); n != 0 {
				e.t.Fatalf("a leaving member was checked %d times", n)
			}
		}},
		{"refutation ends the dispute silently", func(e *env) {
			e.ev.NotifyLeave(e.node)
			listedThrough(e, 1)
			e.ev.NotifyJoin(e.node) // memberlist takes it back, unchanged
			if ev, ok := next(e, 200*time.Millisecond); ok {
				e.t.Fatalf("refutation emitted %v", ev.Kind)
			}
			e.ev.mu.Lock()
			n := len(e.ev.disputed)
			e.ev.mu.Unlock()
			if n != 0 {
				e.t.Fatalf("%d disputes after the refutation", n)
			}
			// The checks have stopped: going down now is memberlist's to
			// notice, not the ended dispute's.
			e.reach.set(e.id, true)
			c := e.reach.count(e.id)
			if ev, ok := next(e, 10*e.ev.disputeRecheck); ok || e.reach.count(e.id) != c {
				e.t.Fatalf("after the dispute ended: event %v (%v), checks %d -> %d", ev.Kind, ok, c, e.reach.count(e.id))
			}
		}},
		{"refutation with new metadata is an update", func(e *env) {
			e.ev.NotifyLeave(e.node)
			listedThrough(e, 1)
			e.ev.NotifyJoin(e.move("127.0.0.1:4002"))
			expect(e, EventUpdate)
		}},
		{"crash during the dispute: fail at the next check", func(e *env) {
			e.ev.NotifyLeave(e.node)
			listedThrough(e, 2)
			e.reach.set(e.id, true)
			expect(e, EventFail)
			if n := warnings(e); n != 1 {
				e.t.Fatalf("%d warnings, want 1", n)
			}
		}},
		{"goodbye during the dispute: leave", func(e *env) {
			e.ev.NotifyLeave(e.node)
			listedThrough(e, 1)
			e.ev.markLeft(e.id, time.Now())
			e.reach.set(e.id, true)
			expect(e, EventLeave)
		}},
		{"close stops the checks", func(e *env) {
			e.ev.NotifyLeave(e.node)
			listedThrough(e, 1)
			e.ev.close() // waits for the checker
			c := e.reach.count(e.id)
			time.Sleep(5 * e.ev.disputeRecheck)
			if e.reach.count(e.id) != c {
				e.t.Fatal("checked after close")
			}
			e.ev.NotifyJoin(e.node)
			e.ev.NotifyLeave(e.node) // after close: memberlist's word, no new checker
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := NewLogRecorder()
			ev := newEvents("run", "", slog.New(rec))
			f := newFakeReach()
			ev.reach = f.reach
			ev.blame = func(id peer.ID) []string { return []string{"blamed " + id.String()} }
			ev.disputeRecheck = 20 * time.Millisecond
			defer ev.close()
			sub := ev.subscribe()
			defer sub.Close()
			node, move := memberAt(t, Meta{RunID: "run"}, "127.0.0.1:4001")
			id, _ := peer.Decode(node.Name)
			ev.NotifyJoin(node)
			c.run(&env{t: t, ev: ev, reach: f, log: rec, sub: sub, id: id, node: node, move: move})
		})
	}
}

// Without a direct check (reach nil) memberlist's verdict stands, and past
// maxDisputes it stands too: the checks are bounded.
func TestDisputesBounded(t *testing.T) {
	ev := newEvents("run", "", nil)
	f := newFakeReach()
	ev.reach = f.reach
	ev.disputeRecheck = time.Hour
	defer ev.close()
	nodes := make([]*memberlist.Node, maxDisputes+1)
	for i := range nodes {
		id, meta := signedMember(t, Meta{RunID: "run"})
		nodes[i] = &memberlist.Node{Name: id.String(), Meta: meta}
		ev.NotifyJoin(nodes[i])
	}
	for _, n := range nodes {
		ev.NotifyLeave(n)
	}
	ev.mu.Lock()
	disputes, members := len(ev.disputed), len(ev.members)
	ev.mu.Unlock()
	if disputes != maxDisputes || members != maxDisputes {
		t.Fatalf("%d disputes, %d members; want %d of each (the last one failed at once)", disputes, members, maxDisputes)
	}

	plain := newEvents("run", "", nil)
	plain.NotifyJoin(nodes[0])
	plain.NotifyLeave(nodes[0])
	if plain.count() != 0 || len(plain.disputed) != 0 {
		t.Fatal("without a direct check a failure was disputed")
	}
}
