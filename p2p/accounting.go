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
type Traffic struct {
	Total          Bytes
	ByPeer         map[peer.ID]Bytes
	ByProtocol     map[protocol.ID]Bytes
	ByPeerProtocol map[PeerProtocol]Bytes
}

type counter struct{ in, out atomic.Int64 }

// accounting is the host's metrics.Reporter: exact atomic totals, with
// libp2p's BandwidthCounter alongside for smoothed rates.
type accounting struct {
	rates *metrics.BandwidthCounter
	total counter
	mu    sync.RWMutex
	pairs map[PeerProtocol]*counter
}

var _ metrics.Reporter = (*accounting)(nil)

func newAccounting() *accounting {
	return &accounting{rates: metrics.NewBandwidthCounter(), pairs: make(map[PeerProtocol]*counter)}
}

func (a *accounting) pair(p peer.ID, proto protocol.ID) *counter {
	k := PeerProtocol{p, proto}
	a.mu.RLock()
	c := a.pairs[k]
	a.mu.RUnlock()
	if c != nil {
		return c
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if c = a.pairs[k]; c == nil {
		c = new(counter)
		a.pairs[k] = c
	}
	return c
}

func (a *accounting) LogSentMessage(size int64) { a.rates.LogSentMessage(size) }
func (a *accounting) LogRecvMessage(size int64) { a.rates.LogRecvMessage(size) }

func (a *accounting) LogSentMessageStream(size int64, proto protocol.ID, p peer.ID) {
	a.total.out.Add(size)
	a.pair(p, proto).out.Add(size)
	a.rates.LogSentMessageStream(size, proto, p)
}

func (a *accounting) LogRecvMessageStream(size int64, proto protocol.ID, p peer.ID) {
	a.total.in.Add(size)
	a.pair(p, proto).in.Add(size)
	a.rates.LogRecvMessageStream(size, proto, p)
}

func (a *accounting) GetBandwidthForPeer(p peer.ID) metrics.Stats {
	return a.rates.GetBandwidthForPeer(p)
}

func (a *accounting) GetBandwidthForProtocol(proto protocol.ID) metrics.Stats {
	return a.rates.GetBandwidthForProtocol(proto)
}
func (a *accounting) GetBandwidthTotals() metrics.Stats { return a.rates.GetBandwidthTotals() }
func (a *accounting) GetBandwidthByPeer() map[peer.ID]metrics.Stats {
	return a.rates.GetBandwidthByPeer()
}

func (a *accounting) GetBandwidthByProtocol() map[protocol.ID]metrics.Stats {
	return a.rates.GetBandwidthByProtocol()
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
	a.mu.RUnlock()
	rt := a.rates.GetBandwidthTotals()
	t.Total.RateIn, t.Total.RateOut = rt.RateIn, rt.RateOut
	for p, s := range a.rates.GetBandwidthByPeer() {
		b := t.ByPeer[p]
		b.RateIn, b.RateOut = s.RateIn, s.RateOut
		t.ByPeer[p] = b
	}
	for p, s := range a.rates.GetBandwidthByProtocol() {
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
func (a *accounting) Reset() { a.rates.Reset() }

// TrimIdle is part of metrics.Reporter.
func (a *accounting) TrimIdle(since time.Time) { a.rates.TrimIdle(since) }
