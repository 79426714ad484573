package data

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Tokenizer maps bytes to token ids and back.
type Tokenizer interface {
	// Encode returns the token ids of p. Every byte of p is encoded, and
	// Decode(Encode(p)) is p.
	Encode(p []byte) []int32
	// Decode returns the bytes of ids. Ids outside [0, VocabSize()) decode
	// to the UTF-8 replacement character.
	Decode(ids []int32) []byte
	// VocabSize is the number of distinct ids; every id is in [0, VocabSize()).
	VocabSize() int
}

// Named is a Tokenizer that says which vocabulary its ids index, so that a
// run's manifest can name it and every member can check it has the same one.
// Every tokenizer NewTokenizer returns is Named.
type Named interface {
	Tokenizer
	// Name is the tokenizer's name for NewTokenizer.
	Name() string
	// VocabHash is the lowercase hex SHA-256 of the tokenizer's rank table
	// in tiktoken's text form: for each rank r in order, the line
	// "base64(the token's bytes) r\n". Special tokens are not part of it.
	VocabHash() string
}

// Appender is a Tokenizer that can append ids to a slice the caller owns.
type Appender interface {
	// AppendEncode appends the ids of p (Encode's) to dst.
	AppendEncode(dst []int32, p []byte) []int32
}

// SpecialEncoder is a Tokenizer with special tokens, such as GPT-2's
// <|endoftext|>.
type SpecialEncoder interface {
	// EncodeSpecial is Encode, except that the text of each special token
	// in p becomes that token's id.
	EncodeSpecial(p []byte) []int32
}

// ErrUnknownTokenizer is returned by NewTokenizer for a name it does not know.
var ErrUnknownTokenizer = errors.New("data: unknown tokenizer")

// TokenizerNames returns the names NewTokenizer knows.
func TokenizerNames() []string { return []string{"byte", "gpt2"} }

// NewTokenizer returns the tokenizer called name: "byte" (ByteTokenizer) or
// "gpt2" (GPT2Tokenizer). The result is Named.
func NewTokenizer(name string) (Tokenizer, error) {
	switch name {
	case "byte":
		return ByteTokenizer{}, nil
	case "gpt2":
		return NewGPT2Tokenizer()
	}
	return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknownTokenizer, name, strings.Join(TokenizerNames(), ", "))
}

// ErrInvalidUTF8 is returned by CheckUTF8.
var ErrInvalidUTF8 = errors.New("invalid UTF-8")

// CheckUTF8 returns nil if p is valid UTF-8, else ErrInvalidUTF8 wrapped
// with the offset and value of the first byte that does not begin a valid
// UTF-8 sequence.
func CheckUTF8(p []byte) error {
	if utf8.Valid(p) {
		return nil
	}
	for i := 0; i < len(p); {
		r, w := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && w == 1 {
			return fmt.Errorf("%w at byte offset %d (0x%02x)", ErrInvalidUTF8, i, p[i])
		}
		i += w
	}
	return nil
}

// ByteVocabSize is the vocabulary size of ByteTokenizer.
const ByteVocabSize = 256

// ByteVocabHash is ByteTokenizer's VocabHash: the hash of the table in which
// rank b is the byte b.
const ByteVocabHash = "e66088df4cdb28fbad3c55ac5a7ae741bc402e732ed948eb096a8ed6f852768f"

// ByteTokenizer is the default Tokenizer: each byte is one token whose id is
// the byte's value. It is the tokenization of the Loader's token stream.
type ByteTokenizer struct{}

var _ Named = ByteTokenizer{}

// DefaultTokenizer returns the tokenizer that matches the Loader's token stream.
func DefaultTokenizer() Tokenizer { return ByteTokenizer{} }

// Name returns "byte".
func (ByteTokenizer) Name() string { return "byte" }

// VocabHash returns ByteVocabHash.
func (ByteTokenizer) VocabHash() string { return ByteVocabHash }

// Encode returns one id per byte of p.
func (ByteTokenizer) Encode(p []byte) []int32 {
	ids := make([]int32, len(p))
	for i, c := range p {
		ids[i] = int32(c)
	}
	return ids
}

// AppendEncode appends the ids of p to dst.
func (ByteTokenizer) AppendEncode(dst []int32, p []byte) []int32 {
	for _, c := range p {
		dst = append(dst, int32(c))
	}
	return dst
}

// replacement is U+FFFD in UTF-8.
const replacement = "\uFFFD"

// Decode returns the bytes of ids; ids outside [0, 256) become U+FFFD.
func (ByteTokenizer) Decode(ids []int32) []byte {
	out := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id < 0 || id >= ByteVocabSize {
			out = append(out, replacement...)
			continue
		}
		out = append(out, byte(id))
	}
	return out
}

// VocabSize returns 256.
func (ByteTokenizer) VocabSize() int { return ByteVocabSize }
