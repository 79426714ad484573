package data

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/klauspost/compress/zstd"
)

func gpt2(tb testing.TB) *GPT2Tokenizer {
	tb.Helper()
	g, err := NewGPT2Tokenizer()
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// The embedded table is r50k_base.tiktoken, byte for byte once rendered, as
// OpenAI publishes it; the byte tokenizer's hash follows the same rule.
func TestVocabHashes(t *testing.T) {
	d, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	table, err := d.DecodeAll(gpt2Ranks, nil)
	if err != nil {
		t.Fatal(err)
	}
	var tokens [][]byte
	for i := 0; i < len(table); i += 1 + int(table[i]) {
		tokens = append(tokens, table[i+1:i+1+int(table[i])])
	}
	if len(tokens) != GPT2EndOfText {
		t.Fatalf("%d tokens in the embedded table, want %d", len(tokens), GPT2EndOfText)
	}
	if got := tiktokenHash(len(tokens), func(r int) []byte { return tokens[r] }); got != GPT2VocabHash {
		t.Errorf("embedded table hashes to %s, want %s", got, GPT2VocabHash)
	}
	if got := gpt2(t).VocabHash(); got != GPT2VocabHash {
		t.Errorf("VocabHash = %s, want %s", got, GPT2VocabHash)
	}
	if got := tiktokenHash(256, func(r int) []byte { return []byte{byte(r)} }); got != ByteVocabHash {
		t.Errorf("byte table hashes to %s, want ByteVocabHash %s", got, ByteVocabHash)
	}
	if _, err := newGPT2Vocab(append([]byte{1, 'x'}, table[2:]...)); err == nil {
		t.Error("a changed table was accepted")
	}
}

func TestNewTokenizer(t *testing.T) {
	for _, tt := range []struct {
		name string
		size int
		hash string
	}{
		{"byte", ByteVocabSize, ByteVocabHash},
		{"gpt2", GPT2VocabSize, GPT2VocabHash},
	} {
		tok, err := NewTokenizer(tt.name)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		n, ok := tok.(Named)
		if !ok {
			t.Fatalf("%s: %T is not Named", tt.name, tok)
		}
		if n.Name() != tt.name || n.VocabHash() != tt.hash || tok.VocabSize() != tt.size {
			t.Errorf("%s: Name %q, VocabHash %s, VocabSize %d", tt.name, n.Name(), n.VocabHash(), tok.VocabSize())
		}
	}
	_, err := NewTokenizer("gpt-2")
	if !errors.Is(err, ErrUnknownTokenizer) || !strings.Contains(err.Error(), `"gpt-2"`) || !strings.Contains(err.Error(), "byte, gpt2") {
		t.Errorf("NewTokenizer(gpt-2) = %v, want ErrUnknownTokenizer naming it and the known names", err)
	}
}

type gpt2Case struct {
	Text    string  `json:"text"`
	IDs     []int32 `json:"ids"`
	Special []int32 `json:"special"`
}

// readGPT2Cases reads the reference ids of testdata/gpt2/expected.jsonl
// (gen_expected.js: gpt-tokenizer's r50k_base, cross-checked with
// gpt-3-encoder).
func readGPT2Cases(tb testing.TB) []gpt2Case {
	tb.Helper()
	f, err := os.Open(filepath.Join("testdata", "gpt2", "expected.jsonl"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var cases []gpt2Case
	s := bufio.NewScanner(f)
	s.Buffer(nil, 1<<20)
	for s.Scan() {
		var c gpt2Case
		if err := json.Unmarshal(s.Bytes(), &c); err != nil {
			tb.Fatalf("expected.jsonl line %d: %v", len(cases)+1, err)
		}
		cases = append(cases, c)
	}
	if err := s.Err(); err != nil {
		tb.Fatal(err)
	}
	return cases
}

func TestGPT2Reference(t *testing.T) {
	g := gpt2(t)
	cases := readGPT2Cases(t)
	if len(cases) < 300 {
		t.Fatalf("%d reference cases, want at least 300", len(cases))
	}
	for i, c := range cases {
		p := []byte(c.Text)
		if got := g.Encode(p); !slices.Equal(got, c.IDs) && (len(got) > 0 || len(c.IDs) > 0) {
			t.Errorf("case %d: Encode(%q)\n got %v\nwant %v", i+1, c.Text, got, c.IDs)
		}
		if c.Special != nil {
			if got := g.EncodeSpecial(p); !slices.Equal(got, c.Special) {
				t.Errorf("case %d: EncodeSpecial(%q)\n got %v\nwant %v", i+1, c.Text, got, c.Special)
			}
		}
		if got := g.Decode(c.IDs); string(got) != c.Text {
			t.Errorf("case %d: Decode(%v) = %q, want %q", i+1, c.IDs, got, c.Text)
		}
	}
}

// OpenAI's own examples (tiktoken's tests/test_encoding.py).
func TestGPT2OpenAIExamples(t *testing.T) {
	g := gpt2(t)
	for _, tt := range []struct {
		text string
		want []int32
	}{
		{"hello world", []int32{31373, 995}},
		{"0", []int32{15}},
		{"00", []int32{405}},
		{"000", []int32{830}},
		{"0000", []int32{2388}},
		{"00000", []int32{20483}},
		{"000000", []int32{10535}},
		{"0000000", []int32{24598}},
		{"00000000", []int32{8269}},
		{"000000000", []int32{10535, 830}},
		{"0000000000", []int32{8269, 405}},
		{"00000000000", []int32{8269, 830}},
		{"000000000000", []int32{8269, 2388}},
		{"0000000000000", []int32{8269, 20483}},
		{"00000000000000", []int32{8269, 10535}},
		{"000000000000000", []int32{8269, 24598}},
		{"0000000000000000", []int32{25645}},
		{"00000000000000000", []int32{8269, 10535, 830}},
	} {
		if got := g.Encode([]byte(tt.text)); !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
	if got := g.EncodeSpecial([]byte("hello <|endoftext|>")); !slices.Equal(got, []int32{31373, 220, 50256}) {
		t.Errorf("EncodeSpecial(hello <|endoftext|>) = %v, want [31373 220 50256]", got)
	}
	if got := g.Encode([]byte("<|endoftext|>")); slices.Contains(got, GPT2EndOfText) {
		t.Errorf("Encode(<|endoftext|>) = %v: the special token from ordinary text", got)
	}
	if got := string(g.Decode([]int32{31373, 995, GPT2EndOfText, -1, GPT2VocabSize})); got != "hello world<|endoftext|>\uFFFD\uFFFD" {
		t.Errorf("Decode = %q", got)
	}
	if got := g.Encode(nil); len(got) != 0 {
		t.Errorf("Encode(nil) = %v", got)
	}
}

// Every token's bytes, as one piece, encode to that token (tiktoken's
// encode_single_token(decode_single_token_bytes(t)) == t).
func TestGPT2EveryToken(t *testing.T) {
	g := gpt2(t)
	for id := range int32(GPT2EndOfText) {
		b := g.v.token(id)
		if got := g.v.appendPiece(nil, b, nil); len(got) != 1 || got[0] != id {
			t.Fatalf("token %d %q encodes to %v", id, b, got)
		}
		if got := g.Decode([]int32{id}); !bytes.Equal(got, b) {
			t.Fatalf("Decode(%d) = %q, want %q", id, got, b)
		}
	}
}

// The heap that merges long pieces merges like the scans: compare them on
// pieces short enough for both, some of them the bytes of tokens.
func TestGPT2MergeLargeMatchesSmall(t *testing.T) {
	g := gpt2(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		var piece []byte
		if i%2 == 0 {
			for len(piece) < 2 || rng.IntN(3) > 0 && len(piece) < smallPiece-maxGPT2Token {
				piece = append(piece, g.v.token(int32(rng.IntN(GPT2EndOfText)))...)
			}
			if len(piece) > smallPiece {
				piece = piece[:smallPiece]
			}
		} else {
			piece = randomText(rng, 2+rng.IntN(smallPiece-1))
			if len(piece) > smallPiece {
				piece = piece[:smallPiece]
			}
			if len(piece) < 2 {
				continue
			}
		}
		small, large := g.v.appendMerged(nil, piece), g.v.appendMergedLarge(nil, piece)
		if !slices.Equal(small, large) {
			t.Fatalf("piece %q: scans %v, heap %v", piece, small, large)
		}
	}
}

// gpt2Pattern is GPT-2's pattern without its lookahead, with tiktoken's
// classes; splitByRegexp applies \s+(?!\S) afterwards.
var gpt2Pattern = regexp.MustCompile(`'s|'t|'re|'ve|'m|'ll|'d| ?\pL+| ?\pN+| ?[^\pL\pN` + whiteSpace + `]+|[` + whiteSpace + `]+`)

// whiteSpace is the Unicode White_Space property, as in Rust's regex.
const whiteSpace = `\t-\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}`

var isWhiteSpace = regexp.MustCompile(`^[` + whiteSpace + `]+$`)

// splitByRegexp splits p as GPT-2's pattern does, with Go's regexp: a run
// of two or more whitespace runes that something follows leaves its last
// rune to the next piece, which is what \s+(?!\S) does.
func splitByRegexp(p []byte) [][]byte {
	var pieces [][]byte
	for len(p) > 0 {
		loc := gpt2Pattern.FindIndex(p)
		if loc == nil || loc[0] != 0 {
			panic("pattern skipped input")
		}
		end := loc[1]
		if m := p[:end]; end < len(p) && isWhiteSpace.Match(m) && utf8.RuneCount(m) > 1 {
			_, w := utf8.DecodeLastRune(m)
			end -= w
		}
		pieces = append(pieces, p[:end])
		p = p[end:]
	}
	return pieces
}

func splitGPT2(p []byte) [][]byte {
	var pieces [][]byte
	for i := 0; i < len(p); {
		j := gpt2PieceEnd(p, i)
		pieces = append(pieces, p[i:j])
		i = j
	}
	return pieces
}

func TestGPT2Split(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want []string
	}{
		{"hello world", []string{"hello", " world"}},
		{"a  b", []string{"a", " ", " b"}},
		{"a   b", []string{"a", "  ", " b"}},
		{"a \t b", []string{"a", " \t", " b"}},
		{"a\tb", []string{"a", "\t", "b"}},
		{"a\t\tb", []string{"a", "\t", "\t", "b"}},
		{"end  ", []string{"end", "  "}},
		{"x\n\n\tfunc", []string{"x", "\n\n", "\t", "func"}},
		{"don't I'M we'll 'RE", []string{"don", "'t", " I", "'", "M", " we", "'ll", " '", "RE"}},
		{"''s", []string{"''", "s"}},
		{"x1.5e9", []string{"x", "1", ".", "5", "e", "9"}},
		{" !!", []string{" !!"}},
		{"a\u3000\u3000b", []string{"a", "\u3000", "\u3000", "b"}},
		{"a \u0085b", []string{"a", " ", "\u0085", "b"}},
		{"a \ufeffb", []string{"a", " \ufeff", "b"}},
		{"e\u0301!", []string{"e", "\u0301!"}},
		{"a\xff\xfeb", []string{"a", "\xff\xfe", "b"}},
		{" \xff", []string{" \xff"}},
	} {
		got := splitGPT2([]byte(tt.in))
		var s []string
		for _, p := range got {
			s = append(s, string(p))
		}
		if !slices.Equal(s, tt.want) {
			t.Errorf("split(%q) = %q, want %q", tt.in, s, tt.want)
		}
	}
}

// The hand-written pre-tokenizer agrees with the pattern on random text and
// random bytes.
func TestGPT2SplitMatchesRegexp(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 5000 {
		var p []byte
		if i%4 == 3 {
			p = make([]byte, rng.IntN(40))
			for j := range p {
				p[j] = byte(rng.Uint32())
			}
		} else {
			p = randomText(rng, rng.IntN(60))
		}
		got, want := splitGPT2(p), splitByRegexp(p)
		if !slices.EqualFunc(got, want, bytes.Equal) {
			t.Fatalf("split(%q)\n got %q\nwant %q", p, got, want)
		}
	}
}

// textFragments are what randomText draws from: every class, the
// contractions and whitespace of several kinds.
var textFragments = []string{
	"a", "Z", "the", " of", "don", "'", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'L",
	" ", " ", "  ", "\t", "\n", "\r\n", "\v", "\f", "\u0085", "\u00a0", "\u2003", "\u3000", "\u2028",
	"0", "7", "42", "١", "½", "Ⅻ", "é", "ß", "Ж", "日本", "e\u0301", "\u0300", "ǅ", "ʰ",
	"\ufeff", "\u200d", "🙂", "👍🏽", ".", ",", "!", "-", "_", "(", "{", "\x00", "\x1f", "\x7f",
	"<|endoftext|>", "\uFFFD",
}

// randomText returns about n bytes of random valid UTF-8 text.
func randomText(rng *rand.Rand, n int) []byte {
	var b []byte
	for len(b) < n {
		b = append(b, textFragments[rng.IntN(len(textFragments))]...)
	}
	return b
}

func TestGPT2RoundTrip(t *testing.T) {
	g := gpt2(t)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 2000 {
		var p []byte
		if i%2 == 0 {
			p = make([]byte, rng.IntN(300))
			for j := range p {
				p[j] = byte(rng.Uint32())
			}
		} else {
			p = randomText(rng, rng.IntN(300))
		}
		checkGPT2RoundTrip(t, g, p)
	}
	checkGPT2RoundTrip(t, g, bytes.Repeat([]byte("x"), 100_000)) // one long piece
	checkGPT2RoundTrip(t, g, bytes.Repeat([]byte{0xff}, 10_000))
}

func checkGPT2RoundTrip(t *testing.T, g *GPT2Tokenizer, p []byte) {
	t.Helper()
	for _, ids := range [][]int32{g.Encode(p), g.EncodeSpecial(p)} {
		for _, id := range ids {
			if id < 0 || id >= GPT2VocabSize {
				t.Fatalf("Encode(%q): id %d out of range", p, id)
			}
		}
		if got := g.Decode(ids); !bytes.Equal(got, p) {
			t.Fatalf("Decode(Encode(%q)) = %q", p, got)
		}
	}
}

// The merge cache gives what merging gives, also across its resets, and
// encoders sharing the tokenizer do not disturb each other.
func TestGPT2Cache(t *testing.T) {
	g := gpt2(t)
	rng := rand.New(rand.NewPCG(7, 8))
	var text []byte
	for range 3 * maxCachedPieces {
		text = append(text, ' ')
		for range 3 + rng.IntN(8) { // mostly words that are not tokens
			text = append(text, byte('a'+rng.IntN(26)))
		}
	}
	want := g.v.appendOrdinary(nil, text, nil)
	var wg sync.WaitGroup
	encoders := 4
	if testing.Short() {
		encoders = 2
	}
	for range encoders {
		wg.Go(func() {
			for range 2 {
				if got := g.Encode(text); !slices.Equal(got, want) {
					t.Error("Encode with the cache differs from merging every piece")
				}
			}
		})
	}
	wg.Wait()
}

func TestCheckUTF8(t *testing.T) {
	for _, tt := range []struct {
		in  string
		off int // -1: valid
	}{
		{"", -1},
		{"héllo, 世界 🙂", -1},
		{"\xff", 0},
		{"ab\xc3", 2},
		{"héllo\x80", 6},
		{"a\xed\xa0\x80", 1}, // a UTF-16 surrogate
		{"\xc0\xaf", 0},      // overlong
	} {
		err := CheckUTF8([]byte(tt.in))
		switch {
		case tt.off < 0 && err != nil:
			t.Errorf("CheckUTF8(%q) = %v", tt.in, err)
		case tt.off >= 0 && (!errors.Is(err, ErrInvalidUTF8) || !strings.Contains(err.Error(), "byte offset "+strconv.Itoa(tt.off)+" ")):
			t.Errorf("CheckUTF8(%q) = %v, want ErrInvalidUTF8 at byte offset %d", tt.in, err, tt.off)
		}
	}
}

func FuzzGPT2(f *testing.F) {
	for _, s := range []string{"", "hello world", "don't I'M", "a  b \n\n\tc  ", "<|endoftext|>x", "\xff\xfe", "🙂 é\u0301 \u0085 \ufeff"} {
		f.Add([]byte(s))
	}
	g := gpt2(f)
	f.Fuzz(func(t *testing.T, p []byte) {
		ids := g.Encode(p)
		for _, id := range ids {
			if id < 0 || id >= GPT2EndOfText {
				t.Fatalf("Encode(%q): id %d", p, id)
			}
		}
		if got := g.Decode(ids); !bytes.Equal(got, p) {
			t.Fatalf("Decode(Encode(%q)) = %q", p, got)
		}
		if utf8.Valid(p) {
			if got := g.Decode(g.EncodeSpecial(p)); !bytes.Equal(got, p) {
				t.Fatalf("Decode(EncodeSpecial(%q)) = %q", p, got)
			}
		}
		if got, want := splitGPT2(p), splitByRegexp(p); !slices.EqualFunc(got, want, bytes.Equal) {
			t.Fatalf("split(%q)\n got %q\nwant %q", p, got, want)
		}
	})
}
