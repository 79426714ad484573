package optimizer

import (
	"errors"
	"testing"
)

func TestMessageRoundTripAndErrors(t *testing.T) {
	h := header{kind: kindPart, round: 7, group: 99, step: 3, chunk: 2}
	msg := appendMessage(nil, h, []byte("body"))
	got, body, err := parseMessage(msg)
	if err != nil || got != h || string(body) != "body" {
		t.Fatalf("round trip: %+v %q %v", got, body, err)
	}
	bad := func(mut func([]byte) []byte) []byte { return mut(append([]byte(nil), msg...)) }
	tests := []struct {
		name string
		p    []byte
	}{
		{"empty", nil},
		{"short", msg[:headerLen-1]},
		{"magic", bad(func(b []byte) []byte { b[0] = 'X'; return b })},
		{"version", bad(func(b []byte) []byte { b[2] = 9; return b })},
		{"kind zero", bad(func(b []byte) []byte { b[3] = 0; return b })},
		{"kind of the deleted ring", bad(func(b []byte) []byte { b[3] = 2; return b })},
		{"kind unknown", bad(func(b []byte) []byte { b[3] = 200; return b })},
		{"truncated body", msg[:len(msg)-1]},
		{"trailing bytes", append(append([]byte(nil), msg...), 0)},
	}
	for _, tt := range tests {
		if _, _, err := parseMessage(tt.p); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: got %v, want ErrBadMessage", tt.name, err)
		}
	}
}

// FuzzMessage: the header's decoder never panics and never returns a body
// that points outside the input.
func FuzzMessage(f *testing.F) {
	f.Add(appendMessage(nil, header{kind: kindPart, round: 1, group: 2, step: 0, chunk: 1}, []byte{1, 2, 3}))
	f.Add(appendMessage(nil, header{kind: kindGossip, round: 1}, []byte{1}))
	f.Add([]byte("SK\x01\x05"))
	f.Fuzz(func(t *testing.T, p []byte) {
		_, body, err := parseMessage(p)
		if err != nil {
			return
		}
		if len(body) != len(p)-headerLen {
			t.Fatalf("body of %d from %d bytes", len(body), len(p))
		}
	})
}
