package data

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math"
	"strconv"
	"sync"

	"github.com/klauspost/compress/zstd"
)

//go:generate go run gen_gpt2_ranks.go

// gpt2Ranks is the rank table of r50k_base (see gen_gpt2_ranks.go): zstd of,
// for each rank r = 0..50255, one byte n and the n bytes of token r.
//
//go:embed gpt2_ranks.zst
var gpt2Ranks []byte

const (
	// GPT2VocabSize is the vocabulary size of GPT2Tokenizer: 50256 BPE
	// tokens and <|endoftext|>.
	GPT2VocabSize = 50257
	// GPT2EndOfText is the id of <|endoftext|>.
	GPT2EndOfText = 50256
	// EndOfText is the text of the end-of-text special token (GPT2EndOfText).
	EndOfText = "<|endoftext|>"
	// GPT2VocabHash is GPT2Tokenizer's VocabHash: the SHA-256 of
	// r50k_base.tiktoken, as OpenAI publishes it (tiktoken_ext/openai_public.py).
	GPT2VocabHash = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
)

// GPT2Tokenizer is OpenAI's GPT-2 byte-level BPE (tiktoken's "gpt2" and
// "r50k_base"): Encode gives the ids tiktoken's encode_ordinary gives for
// valid UTF-8, and encodes any bytes. Make one with NewGPT2Tokenizer or
// NewTokenizer("gpt2"); the tables are built once per process (about 50 ms)
// and shared. It is safe for concurrent use.
type GPT2Tokenizer struct {
	v *gpt2Vocab
}

var (
	_ Named          = (*GPT2Tokenizer)(nil)
	_ SpecialEncoder = (*GPT2Tokenizer)(nil)
)

// NewGPT2Tokenizer returns the GPT-2 tokenizer. It fails only if the
// embedded rank table is damaged.
func NewGPT2Tokenizer() (*GPT2Tokenizer, error) {
	v, err := loadGPT2()
	if err != nil {
		return nil, err
	}
	return &GPT2Tokenizer{v: v}, nil
}

// Name returns "gpt2".
func (*GPT2Tokenizer) Name() string { return "gpt2" }

// VocabHash returns GPT2VocabHash, the hash of the table it was built from.
func (g *GPT2Tokenizer) VocabHash() string { return g.v.hash }

// VocabSize returns GPT2VocabSize.
func (*GPT2Tokenizer) VocabSize() int { return GPT2VocabSize }

// Encode returns the ids of p. <|endoftext|> in p is ordinary text.
func (g *GPT2Tokenizer) Encode(p []byte) []int32 {
	c := g.v.caches.Get().(*mergeCache)
	defer g.v.caches.Put(c)
	return g.v.appendOrdinary(make([]int32, 0, len(p)/3+8), p, c)
}

// AppendEncode appends the ids of p to dst (Encode without the
// allocation).
func (g *GPT2Tokenizer) AppendEncode(dst []int32, p []byte) []int32 {
	c := g.v.caches.Get().(*mergeCache)
	defer g.v.caches.Put(c)
	return g.v.appendOrdinary(dst, p, c)
}

// EncodeSpecial returns the ids of p with every <|endoftext|> in p as
// GPT2EndOfText; the text between them is encoded as by Encode, each stretch
// on its own (tiktoken's encode with allowed_special="all").
func (g *GPT2Tokenizer) EncodeSpecial(p []byte) []int32 {
	c := g.v.caches.Get().(*mergeCache)
	defer g.v.caches.Put(c)
	ids := make([]int32, 0, len(p)/3+8)
	for {
		i := bytes.Index(p, []byte(EndOfText))
		if i < 0 {
			return g.v.appendOrdinary(ids, p, c)
		}
		ids = append(g.v.appendOrdinary(ids, p[:i], c), GPT2EndOfText)
		p = p[i+len(EndOfText):]
	}
}

// Decode returns the bytes of ids; GPT2EndOfText is <|endoftext|> and ids
// outside [0, GPT2VocabSize) are U+FFFD.
func (g *GPT2Tokenizer) Decode(ids []int32) []byte {
	out := make([]byte, 0, 4*len(ids))
	for _, id := range ids {
		switch {
		case id >= 0 && id < GPT2EndOfText:
			out = append(out, g.v.token(id)...)
		case id == GPT2EndOfText:
			out = append(out, EndOfText...)
		default:
			out = append(out, replacement...)
		}
	}
	return out
}

// gpt2Vocab holds the tables of GPT2Tokenizer. For r50k_base a token's rank
// is its id, so merging by rank is merging by id.
type gpt2Vocab struct {
	text   []byte     // the tokens' bytes, by id
	off    []uint32   // token id is text[off[id]:off[id+1]]
	byteID [256]int32 // the id of each single byte
	// bytePair[a<<8|b] is the id of the two-byte token ab, or 0: the first
	// merges of every piece, without the cache misses of pairs.
	bytePair [1 << 16]uint16
	ids      tokenTable // token bytes -> id
	pairs    pairTable  // (a, b) -> id of the token a+b, if there is one
	hash     string
	caches   sync.Pool // of *mergeCache
}

// maxGPT2Token is the length of the longest token in bytes.
const maxGPT2Token = 128

var loadGPT2 = sync.OnceValues(func() (*gpt2Vocab, error) {
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	defer d.Close()
	table, err := d.DecodeAll(gpt2Ranks, nil)
	if err != nil {
		return nil, fmt.Errorf("data: embedded gpt2 rank table: %w", err)
	}
	return newGPT2Vocab(table)
})

// newGPT2Vocab builds the tables from the decompressed rank table and checks
// that it hashes to GPT2VocabHash.
func newGPT2Vocab(table []byte) (*gpt2Vocab, error) {
	v := &gpt2Vocab{
		text: make([]byte, 0, len(table)),
		off:  make([]uint32, 1, GPT2EndOfText+1),
	}
	v.caches.New = func() any { return newMergeCache() }
	for i := 0; i < len(table); {
		n := int(table[i])
		if n == 0 || n > maxGPT2Token || i+1+n > len(table) {
			return nil, fmt.Errorf("data: gpt2 rank table: token %d of length %d at byte %d", len(v.off)-1, n, i)
		}
		v.text = append(v.text, table[i+1:i+1+n]...)
		v.off = append(v.off, uint32(len(v.text)))
		i += 1 + n
	}
	if len(v.off)-1 != GPT2EndOfText {
		return nil, fmt.Errorf("data: gpt2 rank table has %d ranks, want %d", len(v.off)-1, GPT2EndOfText)
	}
	v.hash = tiktokenHash(GPT2EndOfText, func(id int) []byte { return v.token(int32(id)) })
	if v.hash != GPT2VocabHash {
		return nil, fmt.Errorf("data: gpt2 rank table hashes to %s, want %s", v.hash, GPT2VocabHash)
	}
	v.ids = newTokenTable(v)
	for id := range int32(GPT2EndOfText) {
		t := v.token(id)
		if got, ok := v.ids.get(t, pieceHash(t)); !ok || got != id {
			return nil, fmt.Errorf("data: gpt2 rank table repeats token %d %q", id, t)
		}
		if len(t) == 1 {
			v.byteID[t[0]] = id
		}
	}
	// Every split of a token into two tokens is a pair that merges into it:
	// tiktoken looks the concatenation of two adjacent parts up, whichever
	// merge made the token.
	var pairs []uint64
	for id := range int32(GPT2EndOfText) {
		t := v.token(id)
		for k := 1; k < len(t); k++ {
			a, okA := v.ids.get(t[:k], pieceHash(t[:k]))
			b, okB := v.ids.get(t[k:], pieceHash(t[k:]))
			if okA && okB {
				pairs = append(pairs, pairEntry(a, b, id))
			}
		}
	}
	v.pairs = newPairTable(pairs)
	for id := range int32(GPT2EndOfText) {
		if t := v.token(id); len(t) == 2 {
			v.bytePair[int(t[0])<<8|int(t[1])] = uint16(id)
		}
	}
	return v, nil
}

func (v *gpt2Vocab) token(id int32) []byte { return v.text[v.off[id]:v.off[id+1]] }

// appendOrdinary appends the ids of p, all of it ordinary text; c may be nil.
func (v *gpt2Vocab) appendOrdinary(dst []int32, p []byte, c *mergeCache) []int32 {
	for i := 0; i < len(p); {
		j := gpt2PieceEnd(p, i)
		dst = v.appendPiece(dst, p[i:j], c)
		i = j
	}
	return dst
}

// appendPiece appends the ids of one piece of the pre-tokenizer: the token
// it is, if it is one (tiktoken looks the piece up before merging), else
// the result of the merges. c may be nil.
func (v *gpt2Vocab) appendPiece(dst []int32, piece []byte, c *mergeCache) []int32 {
	if len(piece) == 1 {
		return append(dst, v.byteID[piece[0]])
	}
	if len(piece) > maxGPT2Token {
		return v.appendMergedLarge(dst, piece)
	}
	h := pieceHash(piece)
	if id, ok := v.ids.get(piece, h); ok {
		return append(dst, id)
	}
	if len(piece) > smallPiece {
		return v.appendMergedLarge(dst, piece)
	}
	if c == nil {
		return v.appendMerged(dst, piece)
	}
	if ids, ok := c.get(piece, h); ok {
		return append(dst, ids...)
	}
	n := len(dst)
	dst = v.appendMerged(dst, piece)
	c.put(piece, h, dst[n:])
	return dst
}

// smallPiece is the longest piece merged by appendMerged's scans; longer
// pieces take appendMergedLarge's heap, which is O(n log n) where the scans
// are O(n²).
const smallPiece = 64

// noRank is the rank of a pair that does not merge.
const noRank = math.MaxInt32

// appendMerged appends the BPE of piece, 2 <= len(piece) <= smallPiece, as
// tiktoken's byte_pair_merge does: while some adjacent pair of parts merges,
// merge the pair of lowest rank, the leftmost of equals.
func (v *gpt2Vocab) appendMerged(dst []int32, piece []byte) []int32 {
	var idBuf, rankBuf [smallPiece]int32
	n := len(piece)
	ids, ranks := idBuf[:n], rankBuf[:n] // ranks[i]: the pair (ids[i], ids[i+1])
	for i, c := range piece {
		ids[i] = v.byteID[c]
	}
	for i := 0; i < n-1; i++ {
		ranks[i] = noRank
		if id := v.bytePair[int(piece[i])<<8|int(piece[i+1])]; id != 0 {
			ranks[i] = int32(id)
		}
	}
	ranks[n-1] = noRank
	for n > 1 {
		best, at := int32(noRank), -1
		for i, r := range ranks[:n-1] {
			if r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		ids[at] = best
		copy(ids[at+1:n-1], ids[at+2:n])
		copy(ranks[at+1:n-1], ranks[at+2:n])
		n--
		if at > 0 {
			ranks[at-1] = v.pairs.get(ids[at-1], ids[at])
		}
		if at < n-1 {
			ranks[at] = v.pairs.get(ids[at], ids[at+1])
		} else {
			ranks[at] = noRank
		}
	}
	return append(dst, ids[:n]...)
}

// appendMergedLarge is appendMerged for any length: the parts are a linked
// list indexed by their first byte, the candidate pairs a min-heap on (rank,
// position); a candidate is stale once either of its parts changed.
func (v *gpt2Vocab) appendMergedLarge(dst []int32, piece []byte) []int32 {
	type part struct {
		id         int32
		next, prev int32 // -1: none
		ver        uint32
	}
	n := len(piece)
	parts := make([]part, n)
	for i, c := range piece {
		parts[i] = part{id: v.byteID[c], next: int32(i + 1), prev: int32(i - 1)}
	}
	parts[n-1].next = -1
	h := make(mergeHeap, 0, n)
	push := func(l int32) {
		if l < 0 || parts[l].next < 0 {
			return
		}
		r := parts[l].next
		if rank := v.pairs.get(parts[l].id, parts[r].id); rank != noRank {
			h.push(mergeCand{rank: rank, left: l, right: r, lver: parts[l].ver, rver: parts[r].ver})
		}
	}
	for i := range int32(n - 1) {
		push(i)
	}
	for len(h) > 0 {
		c := h.pop()
		l, r := &parts[c.left], &parts[c.right]
		if l.ver != c.lver || r.ver != c.rver {
			continue
		}
		l.id, l.next = c.rank, r.next
		l.ver++
		r.ver++ // dead: every candidate naming it is stale
		if r.next >= 0 {
			parts[r.next].prev = c.left
		}
		push(l.prev)
		push(c.left)
	}
	for i := int32(0); i >= 0; i = parts[i].next {
		dst = append(dst, parts[i].id)
	}
	return dst
}

// mergeCand is a pair of adjacent parts that merges into token rank.
type mergeCand struct {
	rank, left, right int32
	lver, rver        uint32
}

// mergeHeap is a binary min-heap of candidates on (rank, left).
type mergeHeap []mergeCand

func (h mergeHeap) less(i, j int) bool {
	return h[i].rank < h[j].rank || h[i].rank == h[j].rank && h[i].left < h[j].left
}

func (h *mergeHeap) push(c mergeCand) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *mergeHeap) pop() mergeCand {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		m, l, r := i, 2*i+1, 2*i+2
		if l < len(s) && s.less(l, m) {
			m = l
		}
		if r < len(s) && s.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// tiktokenHash is the lowercase hex SHA-256 of a rank table written as
// tiktoken writes one: for each rank r from 0 to n-1 the line
// "base64(token r) r\n".
func tiktokenHash(n int, token func(int) []byte) string {
	h := sha256.New()
	var line []byte
	for r := range n {
		line = base64.StdEncoding.AppendEncode(line[:0], token(r))
		line = append(line, ' ')
		line = strconv.AppendInt(line, int64(r), 10)
		line = append(line, '\n')
		h.Write(line)
	}
	return hex.EncodeToString(h.Sum(nil))
}
