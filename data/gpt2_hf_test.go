package data

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
)

// The tokenizer files for a Hugging Face export: merges.txt is OpenAI's
// vocab.bpe byte for byte (its SHA-256 is the one tiktoken checks the
// download against), and vocab.json maps every token to its id.
func TestGPT2HuggingFaceFiles(t *testing.T) {
	g, err := NewGPT2Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	files, err := g.HuggingFaceFiles()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(files["merges.txt"])
	if got := hex.EncodeToString(sum[:]); got != "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5" {
		lines := strings.SplitN(string(files["merges.txt"]), "\n", 4)
		t.Fatalf("merges.txt SHA-256 %s, not vocab.bpe's; starts %q", got, lines)
	}
	var vocab map[string]int
	if err := json.Unmarshal(files["vocab.json"], &vocab); err != nil {
		t.Fatal(err)
	}
	if len(vocab) != GPT2VocabSize {
		t.Fatalf("%d entries", len(vocab))
	}
	for tok, id := range map[string]int{"hello": 31373, "Ġworld": 995, "<|endoftext|>": 50256, "!": 0, "Ġt": 256} {
		if vocab[tok] != id {
			t.Errorf("vocab[%q] = %d, want %d", tok, vocab[tok], id)
		}
	}
}
