package optimizer

import (
	"fmt"
	"math"
	"slices"

	"github.com/skein-ml/skein/internal/topk"
)

// A shared support (issue [3/4]; ALGORITHMS.md 7): the outer exchange sends,
// of every chunk of Chunk coordinates, only the K of the round's support,
// a set every member of the round computes alike without a coordinator:
// the FromMomentum coordinates of the chunk with the largest outer
// momentum (part of the certified state, so the same bits on every
// member) and the rest drawn by a keyed hash of the round. Every
// contribution then covers the same coordinates, so the collective's
// robust rule (norm clipping, trimmed mean, cross-checks, audits) applies
// to the compacted vector unchanged, with the collective's breakdown
// point; no positions cross the wire and the aggregate is as small as a
// contribution. What a member does not send stays in its residual (error
// feedback, local, decayed by Decay each round) and is sent when its
// coordinates are in a later round's support.

// SupportConfig configures DiLoCoConfig.Support.
type SupportConfig struct {
	Chunk        int     // coordinates per chunk, >= 2
	K            int     // support coordinates per chunk, in [1, Chunk]
	FromMomentum int     // of K, chosen by the largest |outer momentum|, in [0, K]
	Decay        float32 // residual decay per round, in (0, 1]
}

// DefaultSupport is 64 of every 4096 (1.56%), half by momentum.
func DefaultSupport() SupportConfig {
	return SupportConfig{Chunk: 4096, K: 64, FromMomentum: 32, Decay: 1}
}

// Validate names the first invalid field.
func (c SupportConfig) Validate() error {
	switch {
	case c.Chunk < 2 || c.Chunk > 1<<24:
		return fmt.Errorf("%w: support chunk %d out of range [2, 2^24]", ErrConfig, c.Chunk)
	case c.K < 1 || c.K > c.Chunk:
		return fmt.Errorf("%w: support K %d out of range [1, %d]", ErrConfig, c.K, c.Chunk)
	case c.FromMomentum < 0 || c.FromMomentum > c.K:
		return fmt.Errorf("%w: support from momentum %d out of range [0, %d]", ErrConfig, c.FromMomentum, c.K)
	case !(c.Decay > 0 && c.Decay <= 1):
		return fmt.Errorf("%w: residual decay %v out of range (0, 1]", ErrConfig, c.Decay)
	}
	return nil
}

// SupportLen is the length of the compacted vector of n coordinates.
func (c SupportConfig) SupportLen(n int) int {
	return n/c.Chunk*c.K + min(c.K, n%c.Chunk)
}

// Support appends to dst the round's support of a tensor whose outer
// momentum is mom: for each chunk, its positions in increasing order.
func (c SupportConfig) Support(dst []int32, mom []float32, round uint64) []int32 {
	keys := make([]uint64, 0, c.Chunk)
	var chosen []int32
	for base := 0; base < len(mom); base += c.Chunk {
		m := min(c.Chunk, len(mom)-base)
		k := min(c.K, m)
		chosen = chosen[:0]
		// The largest |momentum| (the lower index between equals); zeros
		// are never chosen this way (at a run's start, all of them).
		if f := min(c.FromMomentum, k); f > 0 {
			keys = keys[:0]
			for i, v := range mom[base : base+m] {
				if a := math.Float32bits(v) &^ (1 << 31); a != 0 {
					keys = append(keys, uint64(a)<<32|uint64(math.MaxUint32-uint32(i)))
				}
			}
			if len(keys) > f {
				keys = topk.Largest(keys, f)
			}
			for _, key := range keys {
				chosen = append(chosen, int32(math.MaxUint32-uint32(key)))
			}
			slices.Sort(chosen)
		}
		// The rest by a keyed hash of (round, chunk, draw), without repeats.
		for t := uint64(0); len(chosen) < k; t++ {
			p := int32(splitmix(round*0x9E3779B97F4A7C15^uint64(base)*0xBF58476D1CE4E5B9^t) % uint64(m))
			if i, found := slices.BinarySearch(chosen, p); !found {
				chosen = slices.Insert(chosen, i, p)
			}
		}
		for _, p := range chosen {
			dst = append(dst, int32(base)+p)
		}
	}
	return dst
}

// splitmix is SplitMix64's output function.
func splitmix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
	x = (x ^ x>>27) * 0x94D049BB133111EB
	return x ^ x>>31
}
