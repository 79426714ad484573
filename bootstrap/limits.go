package bootstrap

import (
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// A volunteer reports once per outer round, which takes seconds at least;
// reportBurst reports may arrive closer together (a few adopted rounds at
// once), then one per reportInterval. Each accepted report is a durable
// write, so one member looping on the telemetry protocol must not be able
// to keep the store (and the status page behind it) busy.
const (
	reportInterval = 500 * time.Millisecond
	reportBurst    = 8
	// maxLimited bounds the peers tracked; when it is reached, peers idle
	// for a minute are forgotten and, if that is not enough, arbitrary
	// ones until a quarter is free (a forgotten peer only gets a fresh
	// burst; only members get this far).
	maxLimited = 4096
)

// reportLimits is a token bucket per peer.
type reportLimits struct {
	mu    sync.Mutex
	peers map[peer.ID]*bucket
}

type bucket struct {
	tokens float64
	last   time.Time
}

// allow takes a token from from's bucket at now, if it has one.
func (l *reportLimits) allow(from peer.ID, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.peers == nil {
		l.peers = map[peer.ID]*bucket{}
	}
	b, ok := l.peers[from]
	if !ok {
		if len(l.peers) >= maxLimited {
			l.evict(now)
		}
		b = &bucket{tokens: reportBurst, last: now}
		l.peers[from] = b
	}
	b.tokens = min(reportBurst, b.tokens+now.Sub(b.last).Seconds()/reportInterval.Seconds())
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// evict frees at least a quarter of the table, idle peers first: one scan
// per maxLimited/4 new peers.
func (l *reportLimits) evict(now time.Time) {
	for id, b := range l.peers {
		if now.Sub(b.last) > time.Minute {
			delete(l.peers, id)
		}
	}
	for id := range l.peers { // map order is arbitrary
		if len(l.peers) <= maxLimited*3/4 {
			break
		}
		delete(l.peers, id)
	}
}
