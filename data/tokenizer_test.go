package data

import (
	"bytes"
	"testing"
)

func TestByteTokenizerRoundTrip(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	tests := []struct {
		name string
		in   []byte
	}{
		{"empty", nil},
		{"ascii", []byte("package main\n")},
		{"utf8", []byte("héllo, 世界")},
		{"every byte", all},
		{"invalid utf8", []byte{0xff, 0xfe, 0x00, 0x80}},
	}
	tok := DefaultTokenizer()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids := tok.Encode(tt.in)
			if len(ids) != len(tt.in) {
				t.Fatalf("Encode gave %d ids for %d bytes", len(ids), len(tt.in))
			}
			for i, id := range ids {
				if id < 0 || int(id) >= tok.VocabSize() || id != int32(tt.in[i]) {
					t.Fatalf("id %d = %d, want %d in [0, %d)", i, id, tt.in[i], tok.VocabSize())
				}
			}
			if got := tok.Decode(ids); !bytes.Equal(got, tt.in) {
				t.Fatalf("Decode(Encode(%q)) = %q", tt.in, got)
			}
		})
	}
}

func TestByteTokenizerDecodeOutOfRange(t *testing.T) {
	got := ByteTokenizer{}.Decode([]int32{'a', -1, 256, 'b'})
	if want := "a\uFFFD\uFFFDb"; string(got) != want {
		t.Fatalf("Decode = %q, want %q", got, want)
	}
	if n := (ByteTokenizer{}).VocabSize(); n != 256 {
		t.Fatalf("VocabSize = %d, want 256", n)
	}
}
