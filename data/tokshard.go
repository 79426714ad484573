package data

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"strings"
)

// A token shard is a stretch of a packed dataset's token stream (skein data
// pack), named by the SHA-256 of its header. The header lists the SHA-256 of
// every chunk of the tokens, so a member can fetch and verify any chunk
// alone: a volunteer downloads only the chunks it trains on. All integers
// are little-endian:
//
//	offset  size  field
//	0       8     magic "SKTOKEN1" (the final byte is the format version)
//	8       1     W, bytes per token: 2 (vocabulary <= 65536) or 4
//	9       3     zero
//	12      4     V, the vocabulary size, in [1, MaxTokenVocab]
//	16      32    the tokenizer's vocabulary hash (Named.VocabHash, raw)
//	48      8     N, the token count, in [1, MaxShardTokens]
//	56      8     D, the documents that start in this shard
//	64      4     C, tokens per chunk, in [1, MaxChunkTokens]
//	68      4     K = ceil(N / C), the chunk count
//	72      32*K  the SHA-256 of each chunk's bytes
//	H             the tokens: N values of W bytes, each < V
//
// H = 72 + 32K and the shard's size is exactly H + W*N. Chunk k holds tokens
// [kC, min(kC+C, N)). The shard's name is the SHA-256 of its H header
// bytes, in lowercase hex, which covers every chunk's hash, so a chunk
// that hashes right is the chunk the name was made for.
const (
	// TokenShardMagic opens every token shard.
	TokenShardMagic = "SKTOKEN1"
	// MaxTokenVocab bounds a token shard's vocabulary.
	MaxTokenVocab = 1 << 24
	// MaxShardTokens bounds a token shard's length (so that it stays within
	// MaxShardBytes at 4 bytes a token).
	MaxShardTokens = (MaxShardBytes - tokenHeaderFixed) / 4
	// MaxChunkTokens bounds the tokens of one chunk.
	MaxChunkTokens = 1 << 22
	// DefaultChunkTokens is the chunk packers use: 256 Ki tokens, 512 KiB at
	// 2 bytes a token, about what one volunteer trains on in a round of a
	// GPT-2 run at batch 8 (50 steps of 8 x 1025 tokens is 410 Ki).
	DefaultChunkTokens = 1 << 18
	// DefaultShardTokens is the shard length packers aim at: 32 Mi tokens,
	// 64 MiB at 2 bytes a token.
	DefaultShardTokens = 1 << 25

	tokenHeaderFixed = 72
	tokenKeyPrefix   = "tokens/"
)

// TokenShardHeader is a token shard's header, parsed.
type TokenShardHeader struct {
	Width       int      // bytes per token: 2 or 4
	Vocab       int      // vocabulary size
	VocabHash   [32]byte // the tokenizer's vocabulary hash
	Tokens      int64    // N
	Documents   int64    // documents starting in this shard
	ChunkTokens int      // C
	Chunks      [][32]byte
}

// Size is the header's length in bytes, H.
func (h *TokenShardHeader) Size() int64 { return tokenHeaderFixed + 32*int64(len(h.Chunks)) }

// ShardBytes is the whole shard's length.
func (h *TokenShardHeader) ShardBytes() int64 { return h.Size() + int64(h.Width)*h.Tokens }

// Chunk returns chunk k's first token and its token count.
func (h *TokenShardHeader) Chunk(k int) (first int64, n int) {
	first = int64(k) * int64(h.ChunkTokens)
	return first, int(min(int64(h.ChunkTokens), h.Tokens-first))
}

// ChunkRange returns chunk k's byte offset in the shard and its length.
func (h *TokenShardHeader) ChunkRange(k int) (off, n int64) {
	first, cnt := h.Chunk(k)
	return h.Size() + first*int64(h.Width), int64(cnt) * int64(h.Width)
}

// Marshal returns the header's bytes.
func (h *TokenShardHeader) Marshal() []byte {
	b := make([]byte, 0, h.Size())
	b = append(b, TokenShardMagic...)
	b = append(b, byte(h.Width), 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(h.Vocab))
	b = append(b, h.VocabHash[:]...)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.Tokens))
	b = binary.LittleEndian.AppendUint64(b, uint64(h.Documents))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.ChunkTokens))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(h.Chunks)))
	for _, c := range h.Chunks {
		b = append(b, c[:]...)
	}
	return b
}

// Name is the shard's name: the SHA-256 of its header, lowercase hex.
func (h *TokenShardHeader) Name() string {
	sum := sha256.Sum256(h.Marshal())
	return hex.EncodeToString(sum[:])
}

// tokenWidth is the bytes per token a vocabulary of v needs.
func tokenWidth(v int) int {
	if v <= math.MaxUint16+1 {
		return 2
	}
	return 4
}

// ParseTokenShardHeader checks and parses a token shard's header from the
// start of b, which must hold at least the whole header (the first
// tokenHeaderFixed bytes say how long it is: TokenHeaderSize). Every
// length is checked against the format's bounds before it is used.
func ParseTokenShardHeader(b []byte) (*TokenShardHeader, error) {
	n, err := TokenHeaderSize(b)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) < n {
		return nil, fmt.Errorf("data: token shard header of %d bytes, have %d: %w", n, len(b), ErrShardFormat)
	}
	h := &TokenShardHeader{
		Width:       int(b[8]),
		Vocab:       int(binary.LittleEndian.Uint32(b[12:])),
		Tokens:      int64(binary.LittleEndian.Uint64(b[48:])),
		Documents:   int64(binary.LittleEndian.Uint64(b[56:])),
		ChunkTokens: int(binary.LittleEndian.Uint32(b[64:])),
	}
	copy(h.VocabHash[:], b[16:48])
	k := int(binary.LittleEndian.Uint32(b[68:]))
	h.Chunks = make([][32]byte, k)
	for i := range h.Chunks {
		copy(h.Chunks[i][:], b[tokenHeaderFixed+32*i:])
	}
	return h, nil
}

// TokenHeaderSize checks the fixed part of a token shard's header (the
// first 72 bytes, which b must hold) and returns the whole header's
// length.
func TokenHeaderSize(b []byte) (int64, error) {
	if len(b) < tokenHeaderFixed {
		return 0, fmt.Errorf("data: token shard of %d bytes, shorter than its %d-byte header: %w", len(b), tokenHeaderFixed, ErrShardFormat)
	}
	if string(b[:8]) != TokenShardMagic {
		return 0, fmt.Errorf("data: token shard magic %q, want %q: %w", b[:8], TokenShardMagic, ErrShardFormat)
	}
	w, v := int(b[8]), int64(binary.LittleEndian.Uint32(b[12:]))
	n, docs := binary.LittleEndian.Uint64(b[48:]), binary.LittleEndian.Uint64(b[56:])
	c, k := int64(binary.LittleEndian.Uint32(b[64:])), int64(binary.LittleEndian.Uint32(b[68:]))
	switch {
	case b[9] != 0 || b[10] != 0 || b[11] != 0:
		return 0, fmt.Errorf("data: token shard: reserved bytes not zero: %w", ErrShardFormat)
	case v < 1 || v > MaxTokenVocab:
		return 0, fmt.Errorf("data: token shard: vocabulary %d out of range [1, %d]: %w", v, MaxTokenVocab, ErrShardFormat)
	case w != tokenWidth(int(v)):
		return 0, fmt.Errorf("data: token shard: %d bytes a token for a vocabulary of %d (want %d): %w", w, v, tokenWidth(int(v)), ErrShardFormat)
	case n < 1 || n > MaxShardTokens:
		return 0, fmt.Errorf("data: token shard: %d tokens, out of range [1, %d]: %w", n, int64(MaxShardTokens), ErrShardFormat)
	case docs > n:
		return 0, fmt.Errorf("data: token shard: %d documents in %d tokens: %w", docs, n, ErrShardFormat)
	case c < 1 || c > MaxChunkTokens:
		return 0, fmt.Errorf("data: token shard: chunks of %d tokens, out of range [1, %d]: %w", c, MaxChunkTokens, ErrShardFormat)
	case k != (int64(n)+c-1)/c:
		return 0, fmt.Errorf("data: token shard: %d chunks for %d tokens of %d a chunk: %w", k, n, c, ErrShardFormat)
	}
	h := tokenHeaderFixed + 32*k
	if h+int64(w)*int64(n) > MaxShardBytes {
		return 0, fmt.Errorf("data: token shard of %d bytes exceeds %d: %w", h+int64(w)*int64(n), int64(MaxShardBytes), ErrShardFormat)
	}
	return h, nil
}

// ReadTokenShardHeader reads and checks the header of the token shard in r
// (size bytes long, named name if name is not empty: the header must hash
// to it).
func ReadTokenShardHeader(r io.ReaderAt, size int64, name string) (*TokenShardHeader, error) {
	fixed := make([]byte, tokenHeaderFixed)
	if _, err := r.ReadAt(fixed, 0); err != nil {
		return nil, shardReadErr("token shard header", err)
	}
	n, err := TokenHeaderSize(fixed)
	if err != nil {
		return nil, err
	}
	if n > size {
		return nil, fmt.Errorf("data: token shard header of %d bytes in a %d-byte shard: %w", n, size, ErrShardFormat)
	}
	b := make([]byte, n)
	if _, err := r.ReadAt(b, 0); err != nil {
		return nil, shardReadErr("token shard header", err)
	}
	h, err := ParseTokenShardHeader(b)
	if err != nil {
		return nil, err
	}
	if h.ShardBytes() != size {
		return nil, fmt.Errorf("data: token shard header says %d bytes, the shard has %d: %w", h.ShardBytes(), size, ErrShardFormat)
	}
	if name != "" {
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != name {
			return nil, fmt.Errorf("data: token shard header does not hash to its name %s: %w", name, ErrShardCorrupt)
		}
	}
	return h, nil
}

// CheckChunk reports whether b is chunk k of the shard h describes: its
// length, its hash and every token below the vocabulary.
func (h *TokenShardHeader) CheckChunk(k int, b []byte) error {
	if k < 0 || k >= len(h.Chunks) {
		return fmt.Errorf("data: chunk %d of a shard of %d: %w", k, len(h.Chunks), ErrShardFormat)
	}
	if _, n := h.ChunkRange(k); int64(len(b)) != n {
		return fmt.Errorf("data: chunk %d has %d bytes, want %d: %w", k, len(b), n, ErrShardCorrupt)
	}
	if sha256.Sum256(b) != h.Chunks[k] {
		return fmt.Errorf("data: chunk %d does not hash to the header's entry: %w", k, ErrShardCorrupt)
	}
	if i, id := h.outOfVocab(b); i >= 0 {
		return fmt.Errorf("data: chunk %d token %d is %d, outside the vocabulary of %d: %w", k, i, id, h.Vocab, ErrShardFormat)
	}
	return nil
}

// outOfVocab returns the first token of b at or past the vocabulary, or -1.
func (h *TokenShardHeader) outOfVocab(b []byte) (int, uint32) {
	if h.Width == 2 {
		if h.Vocab > math.MaxUint16 {
			return -1, 0
		}
		for i := 0; i+1 < len(b); i += 2 {
			if id := uint32(binary.LittleEndian.Uint16(b[i:])); int(id) >= h.Vocab {
				return i / 2, id
			}
		}
		return -1, 0
	}
	for i := 0; i+3 < len(b); i += 4 {
		if id := binary.LittleEndian.Uint32(b[i:]); int(id) >= h.Vocab {
			return i / 4, id
		}
	}
	return -1, 0
}

// decodeTokens widens chunk bytes of width w into dst.
func decodeTokens(dst []int32, b []byte, w int) {
	if w == 2 {
		for i := range dst {
			dst[i] = int32(binary.LittleEndian.Uint16(b[2*i:]))
		}
		return
	}
	for i := range dst {
		dst[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

// TokenKey is the bulk key members serve a token shard under.
func TokenKey(name string) string { return tokenKeyPrefix + name }

// ParseTokenKey returns the shard name of a TokenKey.
func ParseTokenKey(key string) (string, bool) {
	name, ok := strings.CutPrefix(key, tokenKeyPrefix)
	if !ok || !validHash(name) {
		return "", false
	}
	return name, true
}
