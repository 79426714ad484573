package optimizer

import (
	"bytes"
	"errors"
	"testing"
)

func TestMessageRoundTripAndErrors(t *testing.T) {
	h := header{kind: kindGather, round: 7, group: 99, step: 3, chunk: 2}
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
		{"kind unknown", bad(func(b []byte) []byte { b[3] = 200; return b })},
		{"truncated body", msg[:len(msg)-1]},
		{"trailing bytes", append(append([]byte(nil), msg...), 0)},
	}
	for _, tt := range tests {
		if _, _, err := parseMessage(tt.p); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: got %v, want ErrBadMessage", tt.name, err)
		}
	}
	chunks := [][]byte{[]byte("a"), nil, []byte("ccc")}
	back, err := parseDone(appendDone(nil, chunks))
	if err != nil || len(back) != 3 || !bytes.Equal(back[2], chunks[2]) || len(back[1]) != 0 {
		t.Fatalf("done round trip: %q %v", back, err)
	}
	for _, p := range [][]byte{nil, {0, 0, 0, 0}, {255, 255, 255, 255}, {1, 0, 0, 0, 9, 0, 0, 0}} {
		if _, err := parseDone(p); !errors.Is(err, ErrBadMessage) {
			t.Errorf("done %v: got %v", p, err)
		}
	}
}

// FuzzMessage: the collective's decoders never panic and never return a body
// or chunk that points outside the input.
func FuzzMessage(f *testing.F) {
	f.Add(appendMessage(nil, header{kind: kindReduce, round: 1, group: 2, step: 0, chunk: 1}, []byte{1, 2, 3}))
	f.Add(appendMessage(nil, header{kind: kindDone, round: 1}, appendDone(nil, [][]byte{{1}, {2, 3}})))
	f.Add([]byte("SK\x01\x05"))
	f.Fuzz(func(t *testing.T, p []byte) {
		h, body, err := parseMessage(p)
		if err != nil {
			return
		}
		if len(body) != len(p)-headerLen {
			t.Fatalf("body of %d from %d bytes", len(body), len(p))
		}
		if h.kind == kindDone {
			chunks, err := parseDone(body)
			if err == nil {
				total := 0
				for _, c := range chunks {
					total += len(c)
				}
				if total > len(body) {
					t.Fatalf("chunks total %d > body %d", total, len(body))
				}
			}
		}
	})
}
