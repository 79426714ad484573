package status

import (
	"bytes"
	"strings"
	"testing"
)

// A hostile status server's strings reach the terminal without control
// characters: no escape sequence survives FormatText.
func TestFormatTextDropsEscapes(t *testing.T) {
	esc := "\x1b]0;pwned\x07\x1b[2J"
	s := Snapshot{RunID: "run" + esc, Preset: esc, Optimizer: "diloco",
		Members: []MemberRow{{Peer: "peer" + esc, Role: esc, Device: "cpu" + esc, Online: true, StateHash: esc, Agreement: Agree}},
		Events:  []EventRow{{Peer: esc, Kind: "join" + esc, Role: esc, Device: esc}}}
	var buf bytes.Buffer
	FormatText(&buf, s)
	if strings.ContainsAny(buf.String(), "\x1b\x07") {
		t.Fatalf("escape sequences reached the terminal: %q", buf.String())
	}
}
