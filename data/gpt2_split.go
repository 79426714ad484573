package data

import (
	"unicode"
	"unicode/utf8"
)

// GPT-2's pre-tokenizer cuts text into pieces with the pattern
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// (leftmost alternative first, each quantifier greedy, backtracking), and BPE
// never merges across pieces. Go's regexp has no lookahead, so gpt2PieceEnd
// follows the pattern by hand; the classes are tiktoken's (Rust regex):
// \s is the Unicode White_Space property (unicode.IsSpace), \p{L} is
// unicode.IsLetter and \p{N} is unicode.IsNumber. A byte that is not part of
// valid UTF-8 is a piece-character of its own in class "other", like U+FFFD.

// charClass is a rune's class in the pattern.
type charClass uint8

const (
	classOther  charClass = iota // [^\s\p{L}\p{N}]
	classLetter                  // \p{L}
	classNumber                  // \p{N}
	classSpace                   // \s
)

var asciiClass = func() (t [utf8.RuneSelf]charClass) {
	for c := range t {
		switch {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
			t[c] = classLetter
		case '0' <= c && c <= '9':
			t[c] = classNumber
		case c == ' ' || '\t' <= c && c <= '\r':
			t[c] = classSpace
		}
	}
	return t
}()

// classAt returns the class and the width of the rune at p[i].
func classAt(p []byte, i int) (charClass, int) {
	if c := p[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, w := utf8.DecodeRune(p[i:])
	switch {
	case w == 1: // invalid UTF-8: one byte, class other
		return classOther, 1
	case unicode.IsLetter(r):
		return classLetter, w
	case unicode.IsNumber(r):
		return classNumber, w
	case unicode.IsSpace(r):
		return classSpace, w
	}
	return classOther, w
}

// runEnd returns the end of the run of class k that starts at p[j].
func runEnd(p []byte, j int, k charClass) int {
	for j < len(p) {
		if c := p[j]; c < utf8.RuneSelf {
			if asciiClass[c] != k {
				break
			}
			j++
			continue
		}
		k2, w := classAt(p, j)
		if k2 != k {
			break
		}
		j += w
	}
	return j
}

// gpt2PieceEnd returns the end of the piece that starts at p[i], i < len(p):
// the end of the pattern's match at i.
func gpt2PieceEnd(p []byte, i int) int {
	c := p[i]
	if c == '\'' && i+1 < len(p) { // 's|'t|'re|'ve|'m|'ll|'d
		switch p[i+1] {
		case 's', 't', 'm', 'd':
			return i + 2
		case 'r', 'v':
			if i+2 < len(p) && p[i+2] == 'e' {
				return i + 3
			}
		case 'l':
			if i+2 < len(p) && p[i+2] == 'l' {
				return i + 3
			}
		}
	}
	start := i
	if c == ' ' && i+1 < len(p) {
		if k, _ := classAt(p, i+1); k != classSpace {
			start = i + 1 // ' ?' of ' ?\p{L}+', ' ?\p{N}+' or ' ?[^\s\p{L}\p{N}]+'
		}
	}
	k, w := classAt(p, start)
	if k != classSpace {
		return runEnd(p, start+w, k)
	}
	// \s+(?!\S)|\s+ at i: the whole run at the end of the input; else the
	// run less its last rune, which goes with what follows; else (a run of
	// one rune) that rune.
	j, last := i+w, i
	for j < len(p) {
		k, w := classAt(p, j)
		if k != classSpace {
			break
		}
		last, j = j, j+w
	}
	if j == len(p) || last == i {
		return j
	}
	return last
}
