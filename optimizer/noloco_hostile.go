package optimizer

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/skein-ml/skein/compression"
)

// The hostile behaviours of NoLoCoConfig.Hostile, for chaos tests only
// (skein demo --chaos --hostile noloco-scale, noloco-rollback or
// noloco-bomb; the fourth NoLoCo attack, noloco-jump, lies in a volunteer's
// announcements and is node's). A hostile member trains, averages and
// steps like an honest one and lies only in what it sends its partners, in
// Gossip.Start: the honest code paths never test for a mode, so what the
// soak exercises is the honest members' defences (noloco_clip.go,
// decodeGossip, Gossip.keep).
const (
	// HostileNoLoCoScale sends its partners a phi and an outer gradient far
	// from its own: phi + 1e3 per element and the outer gradient times
	// 1e3, each value within MaxAbs for a model of small weights (and
	// refused whole when not). Partners clip both to the scale of their
	// own outer steps.
	HostileNoLoCoScale = "noloco-scale"
	// HostileNoLoCoRollback sends the weights it started from (in a fresh
	// run, the run's initial weights) as its phi every step, with its true
	// outer gradient: every value in range, and a pull that would erase
	// the run's progress. Partners clip the distance.
	HostileNoLoCoRollback = "noloco-rollback"
	// HostileNoLoCoBomb sends, instead of its message, gossip bodies whose
	// phi frame declares far more elements than the model has (2^40, and
	// where the model is small enough a real zstd frame of zeros that
	// decodes to max(4n, 2^22) elements in a few KiB), and floods every
	// member it sees with several of them per step: twice for the step,
	// once for each of the next two, and for three later steps. Partners'
	// decoders are capped at the model's size, and a member keeps only
	// this step's partners' messages, one per sender and step, within byte
	// budgets.
	HostileNoLoCoBomb = "noloco-bomb"
)

// NoLoCoHostileModes lists the hostile behaviours of NoLoCoConfig.Hostile.
var NoLoCoHostileModes = []string{HostileNoLoCoScale, HostileNoLoCoRollback, HostileNoLoCoBomb}

const (
	// hostileShift and hostileGain are HostileNoLoCoScale's lie: the phi
	// sent is phi + hostileShift per element, the outer gradient d times
	// hostileGain.
	hostileShift = 1e3
	hostileGain  = 1e3
	// bombClaim is the element count that HostileNoLoCoBomb's forged phi
	// frame header declares; bombRealMax bounds the elements of its real
	// zstd bomb (the hostile member allocates them once to encode it).
	bombClaim   = 1 << 40
	bombRealMax = 1 << 24
)

// gossipLie is what a hostile member (NoLoCoConfig.Hostile) needs to lie.
type gossipLie struct {
	mode    string
	initial []float32 // HostileNoLoCoRollback: the weights it started from
	phi, d  []float32 // HostileNoLoCoScale's values, reused
	bombs   [][]byte  // HostileNoLoCoBomb: gossip bodies, built once
}

// lie returns the phi and outer gradient a hostile member sends instead of
// its own phi and d (its own for HostileNoLoCoBomb, which sends no real
// message; flood).
func (l *gossipLie) lie(phi, d []float32) ([]float32, []float32) {
	switch l.mode {
	case HostileNoLoCoScale:
		l.phi, l.d = grown(l.phi, len(phi)), grown(l.d, len(d))
		for i := range phi {
			l.phi[i] = phi[i] + hostileShift
			l.d[i] = d[i] * hostileGain
		}
		return l.phi, l.d
	case HostileNoLoCoRollback:
		if l.initial == nil { // a Gossip without NoLoCo: its first step's phi
			l.initial = slices.Clone(phi)
		}
		return l.initial, d
	}
	return phi, d
}

// grown returns x resized to n elements, reallocated only when too small.
func grown(x []float32, n int) []float32 {
	if cap(x) < n {
		return make([]float32, n)
	}
	return x[:n]
}

// flood is HostileNoLoCoBomb's messages at step: to every member this one
// sees, partner or not, a bomb for the step twice (one per sender is
// kept), for each of the next two steps, and for three later ones (one per
// sender is kept ahead, within half the budget).
func (g *Gossip) flood(step uint64) ([]Envelope, error) {
	bombs, err := g.lie.bodies(g.cfg, len(g.tmp))
	if err != nil {
		return nil, err
	}
	steps := []uint64{step, step, step + 1, step + 2, step + 3, step + 50, step + 1<<20}
	var out []Envelope
	for _, p := range g.view {
		if p == g.self {
			continue
		}
		for i, s := range steps {
			// Which bomb comes first alternates with the step: the one
			// first for a step is the one kept.
			msg := appendMessage(nil, header{kind: kindGossip, round: s}, bombs[(i+int(step%2))%len(bombs)])
			out = append(out, Envelope{To: p, Payload: msg})
		}
	}
	return out, nil
}

// bodies returns HostileNoLoCoBomb's gossip bodies for a model of n
// parameters, built on first use: each a phi frame that declares far more
// than n elements, followed by an honest outer-gradient frame of 64 zeros
// (never read: the phi frame is refused first).
func (l *gossipLie) bodies(cfg NoLoCoConfig, n int) ([][]byte, error) {
	if l.bombs != nil {
		return l.bombs, nil
	}
	c := cfg.PhiCodec
	c.ZstdLevel = 3 // zeros shrink to almost nothing
	enc, err := compression.NewEncoder(c)
	if err != nil {
		return nil, err
	}
	defer enc.Close()
	body := func(phi []float32, forge bool) ([]byte, error) {
		b, err := enc.Append(make([]byte, 4), phi, 0)
		if err != nil {
			return nil, err
		}
		if forge {
			// The frame header (compression/doc.go): the element count at
			// bytes 8..15, the xxhash64 of bytes 0..23 at 24..31.
			h := b[4 : 4+32]
			binary.LittleEndian.PutUint64(h[8:], bombClaim)
			binary.LittleEndian.PutUint64(h[24:], xxhash.Sum64(h[:24]))
		}
		binary.LittleEndian.PutUint32(b, uint32(len(b)-4))
		return enc.Append(b, make([]float32, 64), 0)
	}
	forged, err := body(make([]float32, 64), true)
	if err != nil {
		return nil, fmt.Errorf("hostile bomb: %w", err)
	}
	l.bombs = [][]byte{forged}
	if elems := max(4*n, 1<<22); elems <= bombRealMax {
		b, err := body(make([]float32, elems), false)
		if err != nil {
			return nil, fmt.Errorf("hostile bomb: %w", err)
		}
		l.bombs = append(l.bombs, b)
	}
	return l.bombs, nil
}
