// Package scenario reads the scripted test scenarios of the protocol state
// machines (optimizer/testdata/butterfly, pipeline/testdata/relay): one
// directive per line, fields separated by spaces, '#' starting a comment.
// It only splits the text; what the directives mean is each test's.
package scenario

import (
	"bufio"
	"bytes"
	"strings"
)

// Line is one directive: its line number (from 1), its text without the
// comment, and its fields.
type Line struct {
	No     int
	Text   string
	Fields []string
}

// Parse splits a scenario file into its directives, skipping blank lines
// and comments.
func Parse(data []byte) []Line {
	var out []Line
	sc := bufio.NewScanner(bytes.NewReader(data))
	for no := 1; sc.Scan(); no++ {
		text := sc.Text()
		if i := strings.Index(text, "#"); i >= 0 {
			text = text[:i]
		}
		if text = strings.TrimSpace(text); text != "" {
			out = append(out, Line{No: no, Text: text, Fields: strings.Fields(text)})
		}
	}
	return out
}
