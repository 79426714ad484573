package data

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
)

// TokenizedCorpus is a corpus's files run through a tokenizer, held in
// memory as one token stream per split (2 bytes a token while the
// vocabulary fits in 16 bits): the TokenSource a Loader draws windows from
// when a run's tokenizer is not byte. Documents come in the corpus's
// stream order: a text file is one, a JSONL file one per record, an llm.c
// .bin file is taken as the GPT-2 tokens it holds (formats.go); with the
// gpt2 tokenizer <|endoftext|> precedes each document, as in llm.c's data.
// Every byte of every document is encoded.
//
// It is the single-process path (skein train --tokenizer): a distributed
// run will draw pre-tokenized shards instead (not built yet).
type TokenizedCorpus struct {
	name   string
	vocab  int
	splits [2][]uint16
	docs   [2]int
}

// MaxTokenizedBytes bounds the text Tokenize reads (4 GiB: about 2.5 GB of
// tokens in memory at GPT-2's 3.5 bytes a token).
const MaxTokenizedBytes = 4 << 30

// Tokenize encodes every file of c with tok. progress, if set, is told the
// bytes done after each file. A vocabulary past 16 bits is refused (none
// of ours is). Cancelled with ctx.
func Tokenize(ctx context.Context, c *Corpus, tok Tokenizer, progress func(done, total int64)) (*TokenizedCorpus, error) {
	if tok.VocabSize() > math.MaxUint16+1 {
		return nil, fmt.Errorf("data: a vocabulary of %d does not fit in 16-bit tokens: %w", tok.VocabSize(), ErrInvalidConfig)
	}
	total := c.Size(Train) + c.Size(Validation)
	if total > MaxTokenizedBytes {
		return nil, fmt.Errorf("data: %d bytes of text, more than the %d tokenized in memory: %w", total, int64(MaxTokenizedBytes), ErrInvalidConfig)
	}
	t := &TokenizedCorpus{vocab: tok.VocabSize(), name: "byte"}
	if n, ok := tok.(Named); ok {
		t.name = n.Name()
	}
	eot := int32(-1)
	if t.name == "gpt2" {
		eot = GPT2EndOfText
	}
	var done int64
	var buf []byte
	for _, s := range []Split{Train, Validation} {
		for _, f := range c.Files(s) {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if int64(cap(buf)) < f.Size {
				buf = make([]byte, f.Size)
			}
			b := buf[:f.Size]
			if _, err := c.cache.readAt(f.Path, b, f.Offset); err != nil {
				return nil, fmt.Errorf("data: tokenizing %s: %w", f.Path, err)
			}
			add := func(doc []byte) {
				if eot >= 0 {
					t.splits[s] = append(t.splits[s], uint16(eot))
				}
				for _, id := range tok.Encode(doc) {
					t.splits[s] = append(t.splits[s], uint16(id))
				}
				t.docs[s]++
			}
			switch fileFormat(f.Rel) {
			case "jsonl":
				if err := jsonlDocuments(f.Rel, b, add); err != nil {
					return nil, err
				}
			case "llmc":
				if t.name != "gpt2" {
					return nil, fmt.Errorf("data: %s holds llm.c's GPT-2 tokens; the run's tokenizer is %s: %w", f.Rel, t.name, ErrDataFormat)
				}
				raw, n, err := llmcTokens(f.Rel, b)
				if err != nil {
					return nil, err
				}
				for i := range n {
					id := binary.LittleEndian.Uint16(raw[2*i:])
					if int(id) >= t.vocab {
						return nil, fmt.Errorf("data: %s: token %d is %d, outside the vocabulary of %d: %w", f.Rel, i, id, t.vocab, ErrDataFormat)
					}
					t.splits[s] = append(t.splits[s], id)
				}
				t.docs[s]++
			default:
				add(b)
			}
			done += f.Size
			if progress != nil {
				progress(done, total)
			}
		}
	}
	return t, nil
}

// Name is the tokenizer's name.
func (t *TokenizedCorpus) Name() string { return t.name }

// VocabSize is the tokenizer's vocabulary size.
func (t *TokenizedCorpus) VocabSize() int { return t.vocab }

// Documents is the number of files of split s.
func (t *TokenizedCorpus) Documents(s Split) int { return t.docs[s] }

// Tokens is the length of split s's stream.
func (t *TokenizedCorpus) Tokens(s Split) int64 {
	if int(s) >= len(t.splits) {
		return 0
	}
	return int64(len(t.splits[s]))
}

// ReadTokens fills dst with split s's tokens from off on.
func (t *TokenizedCorpus) ReadTokens(s Split, dst []int32, off int64) error {
	if int(s) >= len(t.splits) || off < 0 || off+int64(len(dst)) > int64(len(t.splits[s])) {
		return fmt.Errorf("data: %d tokens at %d of the %v split's %d: %w", len(dst), off, s, t.Tokens(s), ErrInvalidConfig)
	}
	for i, id := range t.splits[s][off : off+int64(len(dst))] {
		dst[i] = int32(id)
	}
	return nil
}
