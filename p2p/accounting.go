package p2p

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/metrics"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// Bytes is a byte count in both directions with current rates.
type Bytes struct {
	In, Out         int64   // bytes received and sent since start, exact
	RateIn, RateOut float64 // bytes per second, smoothed (updated about once a second)
}

// PeerProtocol keys the finest counters.
type PeerProtocol struct {
	Peer     peer.ID
	Protocol protocol.ID
}

// Traffic is a snapshot of the node's byte accounting: every byte of every
// stream (this package's protocols, memberlist and libp2p's own identify,
// relay and hole punching), in total, per peer, per protocol and per (peer,
// protocol). It counts stream payload, not QUIC, TLS or TCP overhead.
//
// Total and ByProtocol count every byte since start. ByPeer and
// ByPeerProtocol hold the peers seen recently: a pair idle for a whole
// maintenance interval (NodeConfig.RejoinInterval) whose peer is no longer
// connected is dropped (its bytes stay in Total and ByProtocol; if the peer
// comes back its counts start again from zero), and beyond 8192 pairs new
// ones are counted only in Total and ByProtocol until room is made.
type Traffic struct {
	Total          Bytes
	ByPeer         map[peer.ID]Bytes
	ByProtocol     map[protocol.ID]Bytes
	ByPeerProtocol map[PeerProtocol]Bytes
}

type counter struct {
	in, out atomic.Int64
	mark    int64 // in+out at the last trim; under accounting.mu's write lock
}

// maxTrafficPairs bounds the (peer, protocol) counters. Every peer that
// connects adds a few (identify at least), so a long-running seed would
// otherwise keep one per peer it ever saw. The live set is about the
// connections a node is sized for (DefaultLimits' ConnHigh of 256) times the
// protocols a peer speaks (libp2p's identify, ping, relay, hole punching and
// AutoNAT, three membership protocols, bulk and a few of the caller's): 16 x
// 256 = 4096; the bound doubles that. About 150 bytes a pair.
const maxTrafficPairs = 8192

// accounting is the host's metrics.Reporter: exact atomic totals, with
// libp2p's BandwidthCounter alongside for smoothed rates.
//
// Per-pair counters are bounded (trim, max): a pair idle since the previous
// trim whose peer is not connected is folded into its protocol's retired
// counter, and once max pairs exist new pairs are counted there directly
// rather than evicting live ones (trim frees the room). Protocols are a
// small set (those this node serves or opens), so retired needs no bound.
type accounting struct {
	rates   atomic.Pointer[metrics.BandwidthCounter]
	total   counter
	max     int
	mu      sync.RWMutex
	pairs   map[PeerProtocol]*counter
	retired map[protocol.ID]*counter // bytes of trimmed and overflowing pairs
	// trimmed counts pairs folded since rates was created. BandwidthCounter
	// keeps a meter per peer forever (its TrimIdle removes nothing in
	// go-flow-metrics v0.3.0), so trim replaces it after max pairs, and
	// overflowing pairs are logged there without their peer.
	trimmed int
}

var _ metrics.Reporter = (*accounting)(nil)

func newAccounting(max int) *accounting {
	a := &accounting{max: max, pairs: make(map[PeerProtocol]*counter), retired: make(map[protocol.ID]*counter)}
	a.rates.Store(metrics.NewBandwidthCounter())
	return a
}

// count adds to the (p, proto) counter. It reports false when the pair is
// over the bound and was counted only under its protocol.
func (a *accounting) count(p peer.ID, proto protocol.ID, in, out int64) bool {
	k := PeerProtocol{p, proto}
	// The read lock is held across the adds, so trim (write lock) never
	// folds a counter that is still being added to.
	a.mu.RLock()
	c, own := a.pairs[k], true
	if c == nil && len(a.pairs) >= a.max {
		c, own = a.retired[proto], false
	}
	if c != nil {
		c.in.Add(in)
		c.out.Add(out)
		a.mu.RUnlock()
		return own
	}
	a.mu.RUnlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	c, own = a.pairs[k], true
	if c == nil {
		if len(a.pairs) >= a.max {
			c, own = a.retiredFor(proto), false
		} else {
			c = new(counter)
			a.pairs[k] = c
		}
	}
	c.in.Add(in)
	c.out.Add(out)
	return own
}

// retiredFor returns proto's retired counter; a.mu must be write locked.
func (a *accounting) retiredFor(proto protocol.ID) *counter {
	c := a.retired[proto]
	if c == nil {
		c = new(counter)
		a.retired[proto] = c
	}
	return c
}

// trim folds the pairs idle since the previous trim whose peer is not
// connected into their protocol's retired counter. The node calls it every
// RejoinInterval.
func (a *accounting) trim(connected func(peer.ID) bool) {
	a.mu.Lock()
	var idle []PeerProtocol
	for k, c := range a.pairs {
		if n := c.in.Load() + c.out.Load(); n != c.mark {
			c.mark = n
		} else {
			idle = append(idle, k)
		}
	}
	a.mu.Unlock()
	// Ask libp2p outside the lock: the reporter is called from its streams.
	live := make(map[peer.ID]bool)
	for _, k := range idle {
		if _, ok := live[k.Peer]; !ok {
			live[k.Peer] = connected(k.Peer)
		}
	}
	a.mu.Lock()
	for _, k := range idle {
		c := a.pairs[k]
		if c == nil || live[k.Peer] || c.in.Load()+c.out.Load() != c.mark {
			continue
		}
		r := a.retiredFor(k.Protocol)
		r.in.Add(c.in.Load())
		r.out.Add(c.out.Load())
		delete(a.pairs, k)
		a.trimmed++
	}
	fresh := a.trimmed >= a.max
	if fresh {
		a.trimmed = 0
	}
	a.mu.Unlock()
	if fresh {
		// Rates restart from zero and are current again within seconds.
		a.rates.Store(metrics.NewBandwidthCounter())
	}
}

func (a *accounting) LogSentMessage(size int64) { a.rates.Load().LogSentMessage(size) }
func (a *accounting) LogRecvMessage(size int64) { a.rates.Load().LogRecvMessage(size) }

func (a *accounting) LogSentMessageStream(size int64, proto protocol.ID, p peer.ID) {
	a.total.out.Add(size)
	if !a.count(p, proto, 0, size) {
		p = "" // no per-peer meter for a pair over the bound
	}
	a.rates.Load().LogSentMessageStream(size, proto, p)
}

func (a *accounting) LogRecvMessageStream(size int64, proto protocol.ID, p peer.ID) {
	a.total.in.Add(size)
	if !a.count(p, proto, size, 0) {
		p = ""
	}
	a.rates.Load().LogRecvMessageStream(size, proto, p)
}

func (a *accounting) GetBandwidthForPeer(p peer.ID) metrics.Stats {
	return a.rates.Load().GetBandwidthForPeer(p)
}

func (a *accounting) GetBandwidthForProtocol(proto protocol.ID) metrics.Stats {
	return a.rates.Load().GetBandwidthForProtocol(proto)
}
func (a *accounting) GetBandwidthTotals() metrics.Stats { return a.rates.Load().GetBandwidthTotals() }
func (a *accounting) GetBandwidthByPeer() map[peer.ID]metrics.Stats {
	return a.rates.Load().GetBandwidthByPeer()
}

func (a *accounting) GetBandwidthByProtocol() map[protocol.ID]metrics.Stats {
	return a.rates.Load().GetBandwidthByProtocol()
}

func (a *accounting) snapshot() Traffic {
	t := Traffic{
		ByPeer:         make(map[peer.ID]Bytes),
		ByProtocol:     make(map[protocol.ID]Bytes),
		ByPeerProtocol: make(map[PeerProtocol]Bytes),
	}
	t.Total = Bytes{In: a.total.in.Load(), Out: a.total.out.Load()}
	a.mu.RLock()
	for k, c := range a.pairs {
		b := Bytes{In: c.in.Load(), Out: c.out.Load()}
		t.ByPeerProtocol[k] = b
		add(t.ByPeer, k.Peer, b)
		add(t.ByProtocol, k.Protocol, b)
	}
	for proto, c := range a.retired {
		add(t.ByProtocol, proto, Bytes{In: c.in.Load(), Out: c.out.Load()})
	}
	a.mu.RUnlock()
	rates := a.rates.Load()
	rt := rates.GetBandwidthTotals()
	t.Total.RateIn, t.Total.RateOut = rt.RateIn, rt.RateOut
	for p, s := range rates.GetBandwidthByPeer() {
		if _, ok := t.ByPeer[p]; !ok {
			continue // trimmed, or over the bound
		}
		b := t.ByPeer[p]
		b.RateIn, b.RateOut = s.RateIn, s.RateOut
		t.ByPeer[p] = b
	}
	for p, s := range rates.GetBandwidthByProtocol() {
		b := t.ByProtocol[p]
		b.RateIn, b.RateOut = s.RateIn, s.RateOut
		t.ByProtocol[p] = b
	}
	return t
}

func add[K comparable](m map[K]Bytes, k K, b Bytes) {
	o := m[k]
	o.In += b.In
	o.Out += b.Out
	m[k] = o
}

// Traffic returns a snapshot of the byte counters.
func (n *Node) Traffic() Traffic { return n.bw.snapshot() }

// Reset is part of metrics.Reporter; exact totals are never reset.
func (a *accounting) Reset() { a.rates.Load().Reset() }

// TrimIdle is part of metrics.Reporter.
func (a *accounting) TrimIdle(since time.Time) { a.rates.Load().TrimIdle(since) }
