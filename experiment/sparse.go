package experiment

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/skein-ml/skein/compression"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/transport"
)

// sparseGather is an in-process Collective for measuring the sparse codec's
// quality (issue [3/4]): every member sends its pseudo-gradient through its
// own error feedback and the sparse codec to all the others (an
// all-gather, SparseLoCo's exchange), and each averages the M decoded
// messages in member order, so every member holds the same bits. It is not
// robust (a plain mean; the robust aggregation of sparse contributions in
// the butterfly is not built yet) and runs no network: the bytes it counts
// are what the all-gather would send, (M-1) copies of each message.
type sparseGather struct {
	hub  *sparseHub
	self int
	enc  *compression.SparseEncoder
	dec  *compression.SparseDecoder
	fb   *compression.SparseFeedback
	buf  []float32
	// robust, if set, replaces the mean: each message decoded on its own
	// (zeros where it sent nothing), then the robust rule per coordinate
	// over the union, so a coordinate one member alone sends is trimmed.
	robust  optimizer.RobustConfig
	inputs  [][]float32
	scratch []float32
}

// sparseHub is the members' meeting point, one round at a time.
type sparseHub struct {
	mu    sync.Mutex
	cond  *sync.Cond
	m     int
	round uint64
	msgs  [][]byte
	have  int
	done  int
	sent  int64
}

func newSparseHub(m int) *sparseHub {
	h := &sparseHub{m: m, msgs: make([][]byte, m)}
	h.cond = sync.NewCond(&h.mu)
	return h
}

func newSparseGather(h *sparseHub, self, n int, cfg compression.SparseConfig, beta float32) (*sparseGather, error) {
	enc, err := compression.NewSparseEncoder(cfg)
	if err != nil {
		return nil, err
	}
	dec, err := compression.NewSparseDecoder()
	if err != nil {
		return nil, err
	}
	fb, err := compression.NewSparseFeedback(n, beta)
	if err != nil {
		return nil, err
	}
	return &sparseGather{hub: h, self: self, enc: enc, dec: dec, fb: fb, buf: make([]float32, n)}, nil
}

func (g *sparseGather) Self() transport.PeerID {
	return transport.PeerID(fmt.Sprintf("worker-%02d", g.self))
}

// AllReduceMean implements optimizer.Collective.
func (g *sparseGather) AllReduceMean(ctx context.Context, round uint64, x, out []float32) (optimizer.RoundStats, error) {
	msg, err := g.fb.Encode(g.enc, nil, x)
	if err != nil {
		return optimizer.RoundStats{}, err
	}
	h := g.hub
	h.mu.Lock()
	for h.have == h.m { // the previous round is still being read
		h.cond.Wait()
	}
	h.msgs[g.self] = msg
	h.have++
	h.sent += int64(len(msg)) * int64(h.m-1)
	h.cond.Broadcast()
	for h.have < h.m && ctx.Err() == nil {
		h.cond.Wait()
	}
	msgs := append([][]byte(nil), h.msgs...)
	h.mu.Unlock()

	if g.robust != (optimizer.RobustConfig{}) {
		for len(g.inputs) < len(msgs) {
			g.inputs = append(g.inputs, make([]float32, len(out)))
		}
		for i, b := range msgs {
			clear(g.inputs[i])
			if err := g.dec.DecodeAdd(b, g.inputs[i]); err != nil {
				return optimizer.RoundStats{}, err
			}
		}
		g.scratch = g.robust.Aggregate(out, g.inputs[:len(msgs)], g.scratch)
	} else {
		clear(out)
		for _, b := range msgs {
			if err := g.dec.DecodeAdd(b, out); err != nil {
				return optimizer.RoundStats{}, err
			}
		}
		inv := float32(1) / float32(len(msgs))
		for i := range out {
			out[i] *= inv
		}
	}

	h.mu.Lock()
	h.done++
	if h.done == h.m { // the last reader opens the next round
		h.have, h.done = 0, 0
		h.cond.Broadcast()
	}
	h.mu.Unlock()
	return optimizer.RoundStats{Round: round, Attempts: 1, BytesSent: int64(len(msg)) * int64(h.m-1)}, nil
}

// nominationHub is an in-process optimizer.Nominator: it waits for every
// member's nominations of a round and gives each the sorted union. (Over
// the network the nominations would cross the wire too; here they are
// free, so the arm measures the support's quality, not its cost.)
type nominationHub struct {
	mu    sync.Mutex
	cond  *sync.Cond
	m     int
	round uint64
	have  int
	done  int
	union []int32
}

func newNominationHub(m int) *nominationHub {
	h := &nominationHub{m: m}
	h.cond = sync.NewCond(&h.mu)
	return h
}

// Nominate implements optimizer.Nominator.
func (h *nominationHub) Nominate(ctx context.Context, round uint64, own []int32) ([]int32, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.have == h.m { // the previous round is still being read
		h.cond.Wait()
	}
	h.union = append(h.union, own...)
	h.have++
	h.cond.Broadcast()
	for h.have < h.m && ctx.Err() == nil {
		h.cond.Wait()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if h.done == 0 {
		slices.Sort(h.union)
		h.union = slices.Compact(h.union)
	}
	out := slices.Clone(h.union)
	h.done++
	if h.done == h.m {
		h.have, h.done, h.union = 0, 0, h.union[:0]
		h.cond.Broadcast()
	}
	return out, nil
}
