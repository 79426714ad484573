package data

import "math/bits"

// feistelRounds is the number of Feistel rounds. Four rounds of a good round
// function give a pseudorandom permutation (Luby-Rackoff); six add margin.
const feistelRounds = 6

// Permutation is a keyed bijection of [0, N) that needs O(1) memory: a
// balanced Feistel network on the smallest even number of bits that covers
// N, restricted to [0, N) by cycle walking (re-applying the network until the
// value falls inside the domain; on average fewer than 4 applications).
//
// The zero value is not usable; build one with NewPermutation. A Permutation
// is a small value, safe to copy and to use from many goroutines.
type Permutation struct {
	n    uint64
	half uint   // bits in each Feistel half
	mask uint64 // (1<<half)-1
	keys [feistelRounds]uint64
}

// NewPermutation returns the permutation of [0, n) selected by (seed, epoch).
// Different epochs of the same seed give unrelated permutations.
func NewPermutation(n, seed, epoch uint64) Permutation {
	p := Permutation{n: n}
	b := uint(bits.Len64(n - 1)) // bits needed to hold n-1; 0 for n <= 1
	if n == 0 {
		b = 0
	}
	if b < 2 {
		b = 2
	}
	b += b & 1
	p.half = b / 2
	p.mask = 1<<p.half - 1
	k := mix64(seed ^ mix64(epoch+0x6a09e667f3bcc908))
	for i := range p.keys {
		p.keys[i] = mix64(k + uint64(i+1)*0x9e3779b97f4a7c15)
	}
	return p
}

// N returns the size of the domain.
func (p Permutation) N() uint64 { return p.n }

// At returns the image of i, which must be in [0, N); it panics otherwise.
func (p Permutation) At(i uint64) uint64 {
	if i >= p.n {
		panic("data: Permutation.At index out of range")
	}
	x := p.feistel(i)
	for x >= p.n {
		x = p.feistel(x)
	}
	return x
}

// feistel applies the network to x in [0, 2^(2*half)).
func (p Permutation) feistel(x uint64) uint64 {
	l, r := x>>p.half, x&p.mask
	for _, k := range p.keys {
		l, r = r, l^(mix64(r^k)&p.mask)
	}
	return l<<p.half | r
}

// mix64 is the splitmix64 finalizer: a fast bijective 64-bit mixer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
