package p2p

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Disputed failures.
//
// memberlist's suspect and dead messages are unsigned and memberlist has no
// hook to sign them: any member can gossip that a live member X is dead,
// and every node would drop X until X hears of it and refutes (re-announces
// itself with a higher incarnation), again and again if the forger repeats
// it. So the member table does not take memberlist's word alone for a
// failure. A member memberlist declares failed without a goodbye is
// dropped (EventFail) only if libp2p cannot reach it either: no answer to a
// ping (on its connection, or one dialed for it) within disputeTimeout. While it answers it stays
// listed, "disputed", is checked again every disputeRecheck by a goroutine
// of its own, and the node warns once, naming who declared it failed where
// the transport saw it (accusation.go). The dispute ends when memberlist
// admits the member again (its refutation: NotifyJoin or NotifyUpdate,
// silently), when any other event about it is emitted, or when it stops
// answering (EventFail, or EventLeave if it said goodbye meanwhile).
//
// What it costs: a member that really crashed is reported failed at most
// one disputeTimeout after memberlist's verdict (the dial is refused, or
// the ping times out). A graceful leave is not checked. A host that
// answers pings while its memberlist has stopped stays listed until it
// stops answering; that is a live process, and the collectives above
// tolerate a member that does not take part.
const (
	// disputeTimeout bounds one direct check: a ping is one round trip on
	// an open connection, so 2 s is ample on the internet and leaves room
	// for a loaded machine.
	disputeTimeout = 2 * time.Second
	// disputeRecheck is how often a disputed member is checked again:
	// while memberlist holds it dead it no longer probes it, so this check
	// is what notices a crash during the dispute.
	disputeRecheck = time.Second
	// maxDisputes bounds the disputes (and their goroutines) at once: the
	// members a node is sized for (DefaultLimits' ConnHigh of 256). Past
	// it, memberlist's verdict is taken as is.
	maxDisputes = 256
)

// dispute is one member being checked; ended is closed when the dispute
// ends for any reason other than its own check failing.
type dispute struct {
	ended chan struct{}
}

// disputeLocked starts checking m, which memberlist declared failed without
// a goodbye, and reports whether it did (false: emit EventFail now). e.mu
// is held.
func (e *events) disputeLocked(m Member) bool {
	if e.reach == nil || m.ID == e.self || e.closed {
		return false
	}
	if _, ok := e.disputed[m.ID]; ok {
		return true // already being checked
	}
	if len(e.disputed) >= maxDisputes {
		e.log.Warn("too many members declared failed at once to check them; trusting memberlist",
			"member", m.ID, "disputes", len(e.disputed))
		return false
	}
	d := &dispute{ended: make(chan struct{})}
	e.disputed[m.ID] = d
	e.arbiters.Add(1) // under e.mu with !e.closed: close waits for it
	go e.arbitrate(m.ID, d)
	return true
}

// endDisputeLocked ends the dispute about id, if any, and reports whether
// there was one. e.mu is held.
func (e *events) endDisputeLocked(id peer.ID) bool {
	d, ok := e.disputed[id]
	if !ok {
		return false
	}
	delete(e.disputed, id)
	close(d.ended)
	return true
}

// arbitrate checks member id until the dispute d ends: memberlist takes it
// back, it stops answering, or the node closes.
func (e *events) arbitrate(id peer.ID, d *dispute) {
	defer e.arbiters.Done()
	warned := false
	for {
		select {
		case <-d.ended: // also when it ended as the recheck timer fired
			e.log.Debug("disputed member taken back by memberlist", "member", id)
			return
		default:
		}
		ctx, cancel := context.WithTimeout(e.stop, e.disputeTimeout)
		err := e.reach(ctx, id)
		cancel()
		if e.stop.Err() != nil {
			return
		}
		if err != nil {
			e.settle(id, d, err) // nothing if memberlist took it back meanwhile
			return
		}
		// Warned even if memberlist took it back during the check: it
		// was declared failed while alive, and the warning names by whom.
		if !warned {
			warned = true
			var who []string
			if e.blame != nil {
				who = e.blame(id)
			}
			e.log.Warn("memberlist declared a member failed but it answers directly; keeping it listed",
				"member", id, "accusations", who)
		}
		t := time.NewTimer(e.disputeRecheck)
		select {
		case <-t.C:
		case <-d.ended:
			t.Stop()
		case <-e.stop.Done():
			t.Stop()
			return
		}
	}
}

// settle reports member id gone after its direct check failed with err,
// unless the dispute ended meanwhile: a leave if it said goodbye during the
// dispute, a failure otherwise.
func (e *events) settle(id peer.ID, d *dispute, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || e.disputed[id] != d {
		return
	}
	m, ok := e.members[id]
	if !ok {
		e.endDisputeLocked(id)
		return
	}
	kind := EventFail
	if at, left := e.leftAt[id]; left && time.Since(at) < leaveWindow {
		delete(e.leftAt, id)
		kind = EventLeave
	}
	e.log.Debug("member declared failed does not answer directly", "member", id, "err", err)
	e.emitLocked(kind, m, time.Time{})
}
