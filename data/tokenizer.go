package data

// Tokenizer maps bytes to token ids and back.
type Tokenizer interface {
	// Encode returns the token ids of p.
	Encode(p []byte) []int32
	// Decode returns the bytes of ids. Ids outside [0, VocabSize()) decode
	// to the UTF-8 replacement character.
	Decode(ids []int32) []byte
	// VocabSize is the number of distinct ids; every id is in [0, VocabSize()).
	VocabSize() int
}

// ByteVocabSize is the vocabulary size of ByteTokenizer.
const ByteVocabSize = 256

// ByteTokenizer is the default Tokenizer: each byte is one token whose id is
// the byte's value. It is the tokenization of the Loader's token stream.
type ByteTokenizer struct{}

var _ Tokenizer = ByteTokenizer{}

// DefaultTokenizer returns the tokenizer that matches the Loader's token stream.
func DefaultTokenizer() Tokenizer { return ByteTokenizer{} }

// Encode returns one id per byte of p.
func (ByteTokenizer) Encode(p []byte) []int32 {
	ids := make([]int32, len(p))
	for i, c := range p {
		ids[i] = int32(c)
	}
	return ids
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
