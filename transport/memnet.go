package transport

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// MemNetwork is an in-memory network of Peers for tests and single-process
// simulations (skein demo, skein bench convergence), with fault injection:
// killing a member, delaying its messages, and dropping or failing sends after
// a count. Messages between two members are delivered in order.
type MemNetwork struct {
	mu      sync.Mutex
	members map[PeerID]*MemPeer
	// DetectAfter is how long after Kill the other members stop listing the
	// dead member (the failure detector's delay); 0 means at once.
	DetectAfter time.Duration
	sent        map[PeerID]int64        // bytes sent per member
	hidden      map[[2]PeerID]time.Time // (viewer, member) -> not listed until
}

// NewMemNetwork returns an empty network.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{members: map[PeerID]*MemPeer{}, sent: map[PeerID]int64{}}
}

// MemPeer is one member's endpoint on a MemNetwork.
type MemPeer struct {
	net   *MemNetwork
	id    PeerID
	inbox chan Message

	// guarded by net.mu
	dead      bool
	diedAt    time.Time
	delay     time.Duration // added to every message this member sends
	jitter    time.Duration
	uplink    float64   // bytes per second this member sends at (0: unlimited)
	upFree    time.Time // when its uplink finishes the messages already sent
	failAfter int       // sends left before this member dies (-1: never)
	rng       *rand.Rand
	last      map[PeerID]time.Time     // per-destination delivery time, for ordering
	links     map[PeerID]chan timedMsg // per-destination delivery queues
}

type timedMsg struct {
	at  time.Time
	msg Message
}

// Join adds a member and returns its endpoint.
func (n *MemNetwork) Join(id PeerID) *MemPeer {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := &MemPeer{net: n, id: id, inbox: make(chan Message, 4096), failAfter: -1,
		rng:   rand.New(rand.NewPCG(uint64(len(n.members)), 7)),
		last:  map[PeerID]time.Time{},
		links: map[PeerID]chan timedMsg{}}
	n.members[id] = p
	return p
}

// Kill makes a member vanish without leaving: its sends and receives fail,
// messages to it are dropped, and the others stop listing it after
// DetectAfter.
func (n *MemNetwork) Kill(id PeerID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p, ok := n.members[id]; ok && !p.dead {
		p.dead, p.diedAt = true, time.Now()
	}
}

// Leave removes a member gracefully: the others stop listing it at once.
func (n *MemNetwork) Leave(id PeerID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p, ok := n.members[id]; ok {
		p.dead, p.diedAt = true, time.Now().Add(-n.DetectAfter)
	}
}

// Hide keeps member out of viewer's Members for d, as when gossip has not
// yet told viewer about a joiner: members disagree on the membership.
func (n *MemNetwork) Hide(viewer, member PeerID, d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.hidden == nil {
		n.hidden = map[[2]PeerID]time.Time{}
	}
	n.hidden[[2]PeerID{viewer, member}] = time.Now().Add(d)
}

// SetDelay delays every message the member sends by d plus up to jitter.
func (n *MemNetwork) SetDelay(id PeerID, d, jitter time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p, ok := n.members[id]; ok {
		p.delay, p.jitter = d, jitter
	}
}

// SetUplink limits what the member sends to bytesPerSec in total, as a home
// uplink does: its messages leave one after another, each taking
// len/bytesPerSec, then travel for the member's delay (0: unlimited).
func (n *MemNetwork) SetUplink(id PeerID, bytesPerSec float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p, ok := n.members[id]; ok {
		p.uplink = bytesPerSec
	}
}

// FailAfterSends kills the member when it attempts its (k+1)-th send from
// now: it dies "while sending".
func (n *MemNetwork) FailAfterSends(id PeerID, k int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p, ok := n.members[id]; ok {
		p.failAfter = k
	}
}

// Close stops the network's delivery goroutines; endpoints fail afterwards.
func (n *MemNetwork) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.members {
		p.dead = true
		for to, l := range p.links {
			close(l)
			delete(p.links, to)
		}
	}
}

// BytesSent reports the payload bytes a member has sent.
func (n *MemNetwork) BytesSent(id PeerID) int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sent[id]
}

// Self implements Peers.
func (p *MemPeer) Self() PeerID { return p.id }

// Members implements Peers: live members, plus dead ones not yet detected.
func (p *MemPeer) Members() []PeerID {
	n := p.net
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []PeerID
	now := time.Now()
	for id, m := range n.members {
		if (!m.dead || now.Sub(m.diedAt) < n.DetectAfter) && !now.Before(n.hidden[[2]PeerID{p.id, id}]) {
			out = append(out, id)
		}
	}
	return out
}

// Send implements Peers.
func (p *MemPeer) Send(ctx context.Context, to PeerID, payload []byte) error {
	n := p.net
	n.mu.Lock()
	if p.dead {
		n.mu.Unlock()
		return fmt.Errorf("%w: %s (self)", ErrClosed, p.id)
	}
	if p.failAfter == 0 {
		p.dead, p.diedAt = true, time.Now()
		n.mu.Unlock()
		return fmt.Errorf("%w: %s died while sending", ErrClosed, p.id)
	}
	if p.failAfter > 0 {
		p.failAfter--
	}
	dst, ok := n.members[to]
	if !ok || dst.dead {
		n.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrPeerGone, to)
	}
	n.sent[p.id] += int64(len(payload))
	d := p.delay
	if p.jitter > 0 {
		d += time.Duration(p.rng.Int64N(int64(p.jitter)))
	}
	now := time.Now()
	if p.uplink > 0 {
		start := now
		if p.upFree.After(start) {
			start = p.upFree
		}
		p.upFree = start.Add(time.Duration(float64(len(payload)) / p.uplink * float64(time.Second)))
		now = p.upFree
	}
	at := now.Add(d)
	if prev := p.last[to]; at.Before(prev) {
		at = prev // keep per-link order
	}
	p.last[to] = at
	link, ok := p.links[to]
	if !ok {
		link = make(chan timedMsg, 4096)
		p.links[to] = link
		go n.deliver(dst, link)
	}
	// Enqueue under the lock so Close cannot close the link meanwhile.
	select {
	case link <- timedMsg{at: at, msg: Message{From: p.id, Payload: append([]byte(nil), payload...)}}:
	default: // link queue full: the message is lost, as on a congested network
	}
	n.mu.Unlock()
	return nil
}

// deliver drains one link in order, holding each message until its time.
func (n *MemNetwork) deliver(dst *MemPeer, link chan timedMsg) {
	for m := range link {
		if wait := time.Until(m.at); wait > 0 {
			time.Sleep(wait)
		}
		n.mu.Lock()
		gone := dst.dead
		n.mu.Unlock()
		if gone {
			continue
		}
		select {
		case dst.inbox <- m.msg:
		default: // inbox full: lost
		}
	}
}

// Recv implements Peers.
func (p *MemPeer) Recv(ctx context.Context) (Message, error) {
	for {
		p.net.mu.Lock()
		dead := p.dead
		p.net.mu.Unlock()
		if dead {
			return Message{}, fmt.Errorf("%w: %s", ErrClosed, p.id)
		}
		select {
		case m := <-p.inbox:
			return m, nil
		case <-ctx.Done():
			return Message{}, ctx.Err()
		case <-time.After(50 * time.Millisecond): // re-check death
		}
	}
}
