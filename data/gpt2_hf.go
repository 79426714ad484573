package data

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// HuggingFaceFiles are the GPT-2 tokenizer's files as transformers'
// GPT2Tokenizer loads them beside a model: vocab.json (each token's bytes
// through GPT-2's byte-to-unicode map, and its id) and merges.txt (the
// merges in rank order). They are derived from the embedded rank table, not
// stored: a token of rank r was made by the merge that BPE with the merges
// of rank below r leaves as its last one, two tokens whose bytes join to
// it. merges.txt comes out byte for byte as OpenAI's vocab.bpe (tested
// against its published SHA-256).
func (g *GPT2Tokenizer) HuggingFaceFiles() (map[string][]byte, error) {
	v := g.v
	enc := gpt2ByteEncoder()
	name := func(t []byte) string {
		var b strings.Builder
		for _, c := range t {
			b.WriteRune(enc[c])
		}
		return b.String()
	}
	vocab := make(map[string]int, GPT2VocabSize)
	for id := range int32(GPT2EndOfText) {
		vocab[name(v.token(id))] = int(id)
	}
	vocab["<|endoftext|>"] = GPT2EndOfText
	vj, err := json.Marshal(vocab)
	if err != nil {
		return nil, err
	}
	var merges bytes.Buffer
	merges.WriteString("#version: 0.2\n")
	for id := int32(256); id < GPT2EndOfText; id++ {
		a, b, ok := v.lastMerge(id)
		if !ok {
			return nil, fmt.Errorf("data: gpt2 token %d %q is not a merge of two earlier tokens", id, v.token(id))
		}
		fmt.Fprintf(&merges, "%s %s\n", name(v.token(a)), name(v.token(b)))
	}
	return map[string][]byte{"vocab.json": vj, "merges.txt": merges.Bytes()}, nil
}

// lastMerge is the pair of tokens BPE joins last to make token id: BPE on
// its bytes with only the merges of lower rank, which ends in two parts.
func (v *gpt2Vocab) lastMerge(id int32) (a, b int32, ok bool) {
	t := v.token(id)
	parts := make([]int32, len(t))
	for i, c := range t {
		parts[i] = v.byteID[c]
	}
	for len(parts) > 2 {
		best, at := int32(-1), -1
		for i := 0; i+1 < len(parts); i++ {
			if m := v.pairs.get(parts[i], parts[i+1]); m != noRank && m < id && (best < 0 || m < best) {
				best, at = m, i
			}
		}
		if at < 0 {
			return 0, 0, false
		}
		parts[at] = best
		parts = append(parts[:at+1], parts[at+2:]...)
	}
	if len(parts) != 2 || v.pairs.get(parts[0], parts[1]) != id {
		return 0, 0, false
	}
	return parts[0], parts[1], true
}

// gpt2ByteEncoder is GPT-2's bytes_to_unicode: printable bytes stand for
// themselves, the others for code points from 256 up, in byte order.
func gpt2ByteEncoder() [256]rune {
	var enc [256]rune
	n := 0
	for c := range 256 {
		if (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF) {
			enc[c] = rune(c)
		} else {
			enc[c] = rune(256 + n)
			n++
		}
	}
	return enc
}
