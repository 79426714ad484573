package data

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
)

// The hash tables of GPT2Tokenizer. Every piece is looked up once or twice
// (the token it may be, then the merge cache), so the tables hash it once
// (pieceHash) and keep their slots small.

// pieceHash hashes p as wyhash does: keys of up to 16 bytes in two loads
// that cover them and one multiply-fold; longer keys fold 16 bytes at a
// time, then their last 16.
func pieceHash(p []byte) uint64 {
	const s0, s1, s2 = 0xa0761d6478bd642f, 0xe7037ed1a0b428db, 0x8ebc6af09c88c6e3
	le64, le32 := binary.LittleEndian.Uint64, binary.LittleEndian.Uint32
	n := len(p)
	seed := uint64(s0)
	var a, b uint64
	switch {
	case n > 16:
		for q := p; len(q) > 16; q = q[16:] {
			seed = wymix(le64(q)^s1, le64(q[8:])^seed)
		}
		a, b = le64(p[n-16:]), le64(p[n-8:])
	case n >= 8:
		a, b = le64(p), le64(p[n-8:])
	case n >= 4:
		a, b = uint64(le32(p)), uint64(le32(p[n-4:]))
	case n > 0:
		a = uint64(p[0])<<16 | uint64(p[n>>1])<<8 | uint64(p[n-1])
	}
	return wymix(s1^uint64(n), wymix(a^s1, b^seed)^s2)
}

// wymix is wyhash's mum: the two halves of a*b, folded.
func wymix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// tokenTable maps the bytes of a token to its id: open addressing with
// linear probing over slots tag<<16 | (id+1), 0 empty, where tag is the top
// 16 bits of the hash; a slot whose tag matches is checked against the
// token's bytes.
type tokenTable struct {
	slots []uint32
	shift uint
	v     *gpt2Vocab
}

func newTokenTable(v *gpt2Vocab) tokenTable {
	const bits = 17 // 131072 slots for 50256 tokens
	t := tokenTable{slots: make([]uint32, 1<<bits), shift: 64 - bits, v: v}
	mask := uint64(len(t.slots) - 1)
	for id := range int32(GPT2EndOfText) {
		h := pieceHash(v.token(id))
		i := h >> t.shift
		for t.slots[i] != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = uint32(h>>48)<<16 | uint32(id+1)
	}
	return t
}

// get returns the id of the token whose bytes are p; h is pieceHash(p).
func (t *tokenTable) get(p []byte, h uint64) (int32, bool) {
	mask := uint64(len(t.slots) - 1)
	tag := uint32(h >> 48)
	for i := h >> t.shift; ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == 0 {
			return 0, false
		}
		if s>>16 == tag {
			if id := int32(s&0xffff) - 1; bytes.Equal(t.v.token(id), p) {
				return id, true
			}
		}
	}
}

// pairTable maps a pair of ids to the id they merge into: open addressing
// with linear probing over entries key<<32 | id, key = a<<16 | b.
type pairTable struct {
	e     []uint64
	shift uint
}

const emptyPair = math.MaxUint64

func pairEntry(a, b, id int32) uint64 { return uint64(a)<<48 | uint64(b)<<32 | uint64(uint32(id)) }

func newPairTable(entries []uint64) pairTable {
	bits := uint(1)
	for 1<<bits < 2*len(entries) {
		bits++
	}
	t := pairTable{e: make([]uint64, 1<<bits), shift: 32 - bits}
	for i := range t.e {
		t.e[i] = emptyPair
	}
	mask := uint32(len(t.e) - 1)
	for _, e := range entries {
		for i := t.slot(uint32(e >> 32)); ; i = (i + 1) & mask {
			if t.e[i] == emptyPair {
				t.e[i] = e
				break
			}
		}
	}
	return t
}

func (t *pairTable) slot(key uint32) uint32 { return (key * 0x9E3779B1) >> t.shift }

// get returns the id that a and b merge into, or noRank.
func (t *pairTable) get(a, b int32) int32 {
	key := uint32(a)<<16 | uint32(b)
	mask := uint32(len(t.e) - 1)
	for i := t.slot(key); ; i = (i + 1) & mask {
		e := t.e[i]
		if uint32(e>>32) == key {
			return int32(uint32(e))
		}
		if e == emptyPair {
			return noRank
		}
	}
}

// mergeCache remembers the ids of pieces that took merges (not tokens, at
// most smallPiece bytes), so that a piece seen again costs one probe. An
// Encode takes one from gpt2Vocab.caches and gives it back. Its slots grow
// from 1 Ki to 64 Ki; it holds at most maxCachedPieces pieces and 1 Mi ids
// and is emptied when either is reached, so it stays under about 7 MiB.
type mergeCache struct {
	slots []cacheSlot // a power of two, at most half full
	n     int
	keys  []byte
	ids   []int32
}

// cacheSlot is one piece: its hash, where its bytes are in keys (key) and
// where its ids are in ids (val), each as offset<<8 | length; val == 0 is
// empty (a piece has at least one id).
type cacheSlot struct {
	hash     uint64
	key, val uint32
}

const (
	minCacheSlots   = 1 << 10
	maxCachedPieces = 1 << 15
	maxCachedIDs    = 1 << 20
)

func newMergeCache() *mergeCache {
	return &mergeCache{slots: make([]cacheSlot, minCacheSlots)}
}

// get returns the ids of piece; h is pieceHash(piece).
func (c *mergeCache) get(piece []byte, h uint64) ([]int32, bool) {
	mask := uint64(len(c.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &c.slots[i]
		if s.val == 0 {
			return nil, false
		}
		if s.hash == h && bytes.Equal(c.keys[s.key>>8:s.key>>8+s.key&0xff], piece) {
			return c.ids[s.val>>8 : s.val>>8+s.val&0xff], true
		}
	}
}

// put adds piece, not in c, with its ids; h is pieceHash(piece).
func (c *mergeCache) put(piece []byte, h uint64, ids []int32) {
	switch {
	case c.n >= maxCachedPieces || len(c.ids)+len(ids) > maxCachedIDs:
		clear(c.slots)
		c.n, c.keys, c.ids = 0, c.keys[:0], c.ids[:0]
	case 2*(c.n+1) > len(c.slots):
		old := c.slots
		c.slots = make([]cacheSlot, 2*len(old))
		for _, s := range old {
			if s.val != 0 {
				c.insert(s)
			}
		}
	}
	c.insert(cacheSlot{hash: h, key: uint32(len(c.keys))<<8 | uint32(len(piece)), val: uint32(len(c.ids))<<8 | uint32(len(ids))})
	c.keys = append(c.keys, piece...)
	c.ids = append(c.ids, ids...)
	c.n++
}

func (c *mergeCache) insert(s cacheSlot) {
	mask := uint64(len(c.slots) - 1)
	i := s.hash & mask
	for c.slots[i].val != 0 {
		i = (i + 1) & mask
	}
	c.slots[i] = s
}
