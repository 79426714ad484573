package optimizer

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/bits"
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
	Chunk        int // coordinates per chunk, >= 2
	K            int // support coordinates per chunk, in [1, Chunk]
	FromMomentum int // of K, chosen by the largest |outer momentum|, in [0, K]
	// Decay is the residual's decay per round, in [0, 1]: 0 sends each
	// round's own pseudo-gradient at its support and keeps nothing (no
	// error feedback; with Rotate and the outer momentum, the best warm
	// rule measured, BENCHMARKS.md session 14).
	Decay float32
	// Nominate, if positive, is how many positions of each chunk a member
	// nominates from its own residual plus pseudo-gradient (its largest
	// magnitudes); the union of the round's nominations (DiLoCoConfig's
	// Nominator) comes first in the support, then the momentum's, then the
	// hash's. An experiment: nominations are not yet exchanged over the
	// network, and a member's nominations could steer at most its share.
	Nominate int
	// NominateFromResidual nominates from the residual alone, known when
	// the previous round ends, so the nominations can cross the network
	// during the inner phase instead of after it.
	NominateFromResidual bool
	// Cycle takes the coordinates the nominations and the momentum leave
	// in turn instead of by the hash: round r takes of each chunk the
	// positions congruent to r (plus a keyed phase of the chunk) modulo
	// Chunk/K, so every coordinate is sent once every Chunk/K rounds with
	// what its residual gathered meanwhile, where a hash makes some wait
	// far longer. K must divide Chunk.
	Cycle bool
	// FeedRounding keeps in the residual what the wire's rounding lost of
	// the support's values (error feedback of the quantization too, when
	// the collective reports what it sent: the butterfly does), instead
	// of nothing: a member's sent values then add up to what it meant.
	FeedRounding bool
	// NominateBlock, if above 1, nominates whole blocks of that many
	// consecutive coordinates (a chunk's Nominate/NominateBlock blocks of
	// the largest sum of squares) instead of single coordinates: a block's
	// index costs the wire what one position did.
	NominateBlock int
	// Rotate takes the support, the residual and the values sent in a
	// rotated basis of each chunk (rotate.go: a fixed randomized
	// Hadamard transform, Chunk a power of two): the support's K rotated
	// coordinates carry a share of every coordinate of the chunk, and
	// signs of rotated values lose no more than 8-bit values of the
	// plain ones (BENCHMARKS.md, session 14). The average is rotated back
	// before the outer step, which then moves every coordinate. It
	// excludes FromMomentum and nominations, which pick plain
	// coordinates.
	Rotate bool
	// Tiled draws the hash's positions once a round, for the first
	// chunk, and tiles them: every other whole chunk takes them shifted
	// cyclically by an offset the hash draws for it (a last, partial
	// chunk draws its own). Each position is still in a round's support
	// with probability K/Chunk, independently from round to round, but a
	// round's draws cost one chunk's and an offset per chunk instead of
	// every chunk's (0.2 s a round at 124M). Without the offsets, every
	// chunk would miss the same rotated coordinates, which measured 0.5%
	// worse (BENCHMARKS.md, session 16). It excludes FromMomentum,
	// nominations and Cycle, which choose per chunk.
	Tiled bool
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
	case !(c.Decay >= 0 && c.Decay <= 1):
		return fmt.Errorf("%w: residual decay %v out of range [0, 1]", ErrConfig, c.Decay)
	case c.Nominate < 0 || c.Nominate > c.K:
		return fmt.Errorf("%w: nominations %d out of range [0, %d]", ErrConfig, c.Nominate, c.K)
	case c.Cycle && c.Chunk%c.K != 0:
		return fmt.Errorf("%w: a cycling support needs K (%d) to divide the chunk (%d)", ErrConfig, c.K, c.Chunk)
	case c.NominateBlock > 1 && (c.Chunk%c.NominateBlock != 0 || c.Nominate%c.NominateBlock != 0):
		return fmt.Errorf("%w: nomination blocks of %d must divide the chunk (%d) and the nominations (%d)", ErrConfig, c.NominateBlock, c.Chunk, c.Nominate)
	case c.Rotate && c.Chunk&(c.Chunk-1) != 0:
		return fmt.Errorf("%w: a rotated support needs a chunk that is a power of two, not %d", ErrConfig, c.Chunk)
	case c.Tiled && (c.FromMomentum > 0 || c.Nominate > 0 || c.Cycle):
		return fmt.Errorf("%w: a tiled support is all by the hash: no momentum's, nominated or cycling positions", ErrConfig)
	case c.Rotate && (c.FromMomentum > 0 || c.Nominate > 0):
		return fmt.Errorf("%w: a rotated support picks rotated coordinates: no momentum's or nominated ones", ErrConfig)
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
	return c.SupportWith(dst, mom, round, nil)
}

// SupportWith is Support with nominated positions (sorted, absolute)
// taken first, at most K of each chunk (the lowest positions), before the
// momentum's and the keyed hash's.
func (c SupportConfig) SupportWith(dst []int32, mom []float32, round uint64, nominated []int32) []int32 {
	dst = slices.Grow(dst, c.SupportLen(len(mom)))
	if c.Tiled {
		return c.appendTiled(dst, round, len(mom))
	}
	var top topk.Top
	var chosen []int32
	var taken []uint64
	for base := 0; base < len(mom); base += c.Chunk {
		m := min(c.Chunk, len(mom)-base)
		k := min(c.K, m)
		chosen = chosen[:0]
		for len(nominated) > 0 && nominated[0] < int32(base) {
			nominated = nominated[1:]
		}
		for len(nominated) > 0 && nominated[0] < int32(base+m) {
			if p := nominated[0] - int32(base); len(chosen) < k && (len(chosen) == 0 || chosen[len(chosen)-1] < p) {
				chosen = append(chosen, p)
			}
			nominated = nominated[1:]
		}
		// The largest |momentum| (the lower index between equals); zeros
		// are never chosen this way (at a run's start, all of them).
		if f := min(c.FromMomentum, k-len(chosen)); f > 0 {
			pre := len(chosen)
			top.Reset(f)
			floor := top.Floor()
			for i, v := range mom[base : base+m] {
				a := math.Float32bits(v) &^ (1 << 31)
				key := uint64(a)<<32 | uint64(math.MaxUint32-uint32(i))
				if a == 0 || key <= floor {
					continue
				}
				if pre > 0 {
					if _, taken := slices.BinarySearch(chosen[:pre], int32(i)); taken {
						continue
					}
				}
				top.Push(key)
				floor = top.Floor()
			}
			for _, key := range top.Keys() {
				chosen = append(chosen, int32(math.MaxUint32-uint32(key)))
			}
			slices.Sort(chosen)
		}
		if c.Cycle {
			// The round's turn of the chunk's positions.
			stride := c.Chunk / c.K
			pre := len(chosen)
			for p := int32((splitmix(uint64(base)) + round) % uint64(stride)); p < int32(m) && len(chosen) < k; p += int32(stride) {
				if _, dup := slices.BinarySearch(chosen[:pre], p); !dup {
					chosen = append(chosen, p)
				}
			}
			slices.Sort(chosen)
		}
		// The rest by a keyed hash of (round, chunk, draw), without repeats
		// (a bitmap of the chunk says which are taken: a sorted insert per
		// draw would cost K^2 a chunk).
		if len(chosen) < k {
			dst, taken = hashDraw(dst, taken, chosen, round, base, m, k)
			continue
		}
		for _, p := range chosen {
			dst = append(dst, int32(base)+p)
		}
	}
	return dst
}

// hashDraw appends the positions (absolute, increasing) of the chunk of m
// coordinates at base: the chosen ones (relative, sorted) and as many more
// as the keyed hash of (round, chunk, draw) takes to make k, without
// repeats (a bitmap of the chunk, taken, says which are taken: a sorted
// insert per draw would cost K^2 a chunk). It returns dst and taken.
func hashDraw(dst []int32, taken []uint64, chosen []int32, round uint64, base, m, k int) ([]int32, []uint64) {
	taken = slices.Grow(taken[:0], (m+63)/64)[:(m+63)/64]
	clear(taken)
	for _, p := range chosen {
		taken[p/64] |= 1 << (p % 64)
	}
	n := len(chosen)
	key := chunkKey(round, base)
	if m&(m-1) == 0 {
		drawPow2(taken, key, uint64(m-1), n, k)
	} else {
		for t := uint64(0); n < k; t++ {
			p := splitmix(key^t) % uint64(m)
			if w, b := &taken[p/64], uint64(1)<<(p%64); *w&b == 0 {
				*w |= b
				n++
			}
		}
	}
	// In increasing order, from the bitmap.
	for i, w := range taken {
		for at := int32(base + 64*i); w != 0; w &= w - 1 {
			dst = append(dst, at+int32(bits.TrailingZeros64(w)))
		}
	}
	return dst, taken
}

// tiledOffset is the cyclic shift of a tiled support's whole chunk at
// base (Tiled): 0 for the first, whose draw the others shift.
func tiledOffset(round uint64, base, chunk int) int32 {
	if base == 0 {
		return 0
	}
	return int32(splitmix(chunkKey(round, base)) % uint64(chunk))
}

// tiledDraws is a tiled support of n coordinates without its positions
// written out: first, the first chunk's draw (in increasing order; empty
// when n has no whole chunk), and tail, a last, partial chunk's own draw
// (absolute positions; empty when there is none). SupportWith's positions
// are, for each whole chunk at base, first shifted cyclically by
// tiledOffset, then tail. taken is scratch; all three are returned.
func (c SupportConfig) tiledDraws(first, tail []int32, taken []uint64, round uint64, n int) ([]int32, []int32, []uint64) {
	first, tail = first[:0], tail[:0]
	if n >= c.Chunk {
		first, taken = hashDraw(first, taken, nil, round, 0, c.Chunk, c.K)
	}
	if base, m := n/c.Chunk*c.Chunk, n%c.Chunk; m > 0 {
		tail, taken = hashDraw(tail, taken, nil, round, base, m, min(c.K, m))
	}
	return first, tail, taken
}

// appendTiled appends a tiled support's positions of n coordinates (all
// by the hash: Validate refuses momentum's, nominated or cycling ones):
// for each whole chunk, the first chunk's draw shifted by the chunk's
// offset (tiledRuns), then a last, partial chunk's own draw.
func (c SupportConfig) appendTiled(dst []int32, round uint64, n int) []int32 {
	first, tail, _ := c.tiledDraws(nil, nil, nil, round, n)
	for base := 0; base+c.Chunk <= n; base += c.Chunk {
		wrap, dw, rest, dr := tiledRuns(first, tiledOffset(round, base, c.Chunk), c.Chunk)
		for _, p := range wrap {
			dst = append(dst, int32(base)+p+dw)
		}
		for _, p := range rest {
			dst = append(dst, int32(base)+p+dr)
		}
	}
	return append(dst, tail...)
}

// tiledRuns splits a tiled chunk's positions (first shifted by o, modulo
// chunk) into the two runs that keep them increasing: those that wrap
// (first[cut:] + o - chunk), then the rest (first[:cut] + o).
func tiledRuns(first []int32, o int32, chunk int) (wrap []int32, dw int32, rest []int32, dr int32) {
	cut, _ := slices.BinarySearch(first, int32(chunk)-o)
	return first[cut:], o - int32(chunk), first[:cut], o
}

// Nominations appends to dst, for each chunk of x, the positions (absolute,
// increasing) of its n largest magnitudes: a member's nominations for a
// round's support (SupportConfig.Nominate).
func (c SupportConfig) Nominations(dst []int32, x []float32, n int) []int32 {
	if n <= 0 {
		return dst
	}
	if b := c.NominateBlock; b > 1 {
		return c.blockNominations(dst, x, n/b, b)
	}
	var top topk.Top
	for base := 0; base < len(x); base += c.Chunk {
		m := min(c.Chunk, len(x)-base)
		top.Reset(n)
		floor := top.Floor()
		for i, v := range x[base : base+m] {
			a := math.Float32bits(v) &^ (1 << 31)
			if key := uint64(a)<<32 | uint64(math.MaxUint32-uint32(i)); a != 0 && a < 0x7f800000 && key > floor {
				top.Push(key)
				floor = top.Floor()
			}
		}
		start := len(dst)
		for _, key := range top.Keys() {
			dst = append(dst, int32(base)+int32(math.MaxUint32-uint32(key)))
		}
		slices.Sort(dst[start:])
	}
	return dst
}

// blockNominations is Nominations by blocks: the positions of each chunk's
// n blocks of b coordinates with the largest sums of squares.
func (c SupportConfig) blockNominations(dst []int32, x []float32, n, b int) []int32 {
	var top topk.Top
	for base := 0; base < len(x); base += c.Chunk {
		m := min(c.Chunk, len(x)-base)
		top.Reset(n)
		floor := top.Floor()
		for blk := 0; blk*b < m; blk++ {
			var e float32
			for _, v := range x[base+blk*b : base+min(m, (blk+1)*b)] {
				e += v * v
			}
			a := math.Float32bits(e)
			if key := uint64(a)<<32 | uint64(math.MaxUint32-uint32(blk)); a != 0 && a < 0x7f800000 && key > floor {
				top.Push(key)
				floor = top.Floor()
			}
		}
		blocks := top.Keys()
		slices.SortFunc(blocks, func(p, q uint64) int { return cmp.Compare(math.MaxUint32-uint32(p), math.MaxUint32-uint32(q)) })
		for _, key := range blocks {
			lo := base + int(math.MaxUint32-uint32(key))*b
			for p := lo; p < min(lo+b, base+m); p++ {
				dst = append(dst, int32(p))
			}
		}
	}
	return dst
}

// A Nominator gathers a round's nominations (SupportConfig.Nominate): each
// member's own positions in, the sorted union over the round's members
// out, the same on every member.
type Nominator interface {
	Nominate(ctx context.Context, round uint64, own []int32) ([]int32, error)
}

// drawPow2 is the hash's draws for a chunk of mask+1 (a power of two)
// positions: draw t takes position splitmix(key^t)&mask unless taken
// (bitmap taken), until k are; n are taken already. Branch-free: whether a
// draw was new is as likely as not in a dense support, and a mispredicted
// branch per draw cost more than the draw itself.
func drawPow2(taken []uint64, key, mask uint64, n, k int) {
	for t := uint64(0); n < k; t++ {
		p := splitmix(key^t) & mask
		w := &taken[p>>6]
		old := *w
		*w = old | 1<<(p&63)
		n += int(^old >> (p & 63) & 1)
	}
}

// chunkKey keys the hash's draws for the chunk at base in a round: draw t
// of the chunk is splitmix(chunkKey(round, base)^t), and a tiled
// support's offset for it is splitmix(chunkKey(round, base)).
func chunkKey(round uint64, base int) uint64 {
	return round*0x9E3779B97F4A7C15 ^ uint64(base)*0xBF58476D1CE4E5B9
}

// splitmix is SplitMix64's output function.
func splitmix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ x>>30) * 0xBF58476D1CE4E5B9
	x = (x ^ x>>27) * 0x94D049BB133111EB
	return x ^ x>>31
}
