package pipeline

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/skein-ml/skein/compression"
)

func wirePath() Path { return Path{Nodes: []int{4, 1, 7}, Stages: []int{0, 2, 1}} }

func TestRelayMessageRoundTrip(t *testing.T) {
	for _, m := range []relayMsg{
		{kind: kindAct, iter: 9, mb: 3, stage: 2, hop: 1, path: wirePath(), frame: []byte("frame bytes")},
		{kind: kindAct, iter: 1, mb: 0, stage: 0, hop: 3, path: wirePath(), frame: []byte{}},
		{kind: kindGrad, iter: 1 << 40, mb: 1 << 20, stage: 1, hop: 2, path: wirePath(), frame: []byte{1, 2, 3}},
		{kind: kindFail, iter: 2, mb: 5, hop: 1, path: wirePath(), reason: reasonTimeout},
		{kind: kindAbort, iter: 2, mb: 5, path: Path{Nodes: []int{0}, Stages: []int{0}}},
	} {
		b := appendRelayMsg(nil, m)
		got, err := parseRelayMsg(b)
		if err != nil {
			t.Fatalf("%s: %v", m.kind, err)
		}
		if got.kind != m.kind || got.iter != m.iter || got.mb != m.mb || got.stage != m.stage || got.hop != m.hop ||
			!pathEqual(got.path, m.path) || got.reason != m.reason || !bytes.Equal(got.frame, m.frame) {
			t.Fatalf("%s: got %+v, want %+v", m.kind, got, m)
		}
	}
}

// TestRelayMessageRejects: every way a message can be malformed is
// reported as ErrBadMessage.
func TestRelayMessageRejects(t *testing.T) {
	good := appendRelayMsg(nil, relayMsg{kind: kindAct, iter: 1, mb: 2, stage: 2, hop: 1, path: wirePath(), frame: []byte("xyz")})
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	pathLenAt := 20
	for name, b := range map[string][]byte{
		"empty":            nil,
		"short header":     good[:relayHdrLen-1],
		"magic":            edit(func(b []byte) []byte { b[0] = 'X'; return b }),
		"version":          edit(func(b []byte) []byte { b[2] = 2; return b }),
		"kind 0":           edit(func(b []byte) []byte { b[3] = 0; return b }),
		"kind 5":           edit(func(b []byte) []byte { b[3] = 5; return b }),
		"empty path":       edit(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[pathLenAt:], 0); return b }),
		"path too long":    edit(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[pathLenAt:], maxPathLen+1); return b }),
		"path past end":    edit(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[pathLenAt:], 200); return b }),
		"hop past path":    edit(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[18:], 4); return b }),
		"node too large":   edit(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[relayHdrLen:], maxNodeIndex); return b }),
		"stage too large":  edit(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[relayHdrLen+4:], maxPathLen); return b }),
		"frame truncated":  good[:len(good)-1],
		"frame len short":  good[:relayHdrLen+3*visitLen+2],
		"trailing byte":    append(bytes.Clone(good), 0),
		"fail no reason":   appendRelayMsg(nil, relayMsg{kind: kindFail, path: wirePath()}),
		"fail reason high": appendRelayMsg(nil, relayMsg{kind: kindFail, path: wirePath(), reason: maxReason + 1}),
		"abort trailing":   append(appendRelayMsg(nil, relayMsg{kind: kindAbort, path: wirePath()}), 1),
	} {
		if _, err := parseRelayMsg(b); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := parseRelayMsg(good); err != nil {
		t.Fatal(err)
	}
}

// FuzzRelayMessage: the parser never panics, and whatever it accepts
// encodes back to the same bytes (so nothing in a message goes unchecked).
func FuzzRelayMessage(f *testing.F) {
	enc, err := compression.NewEncoder(compression.Config{Codec: compression.BF16, BlockSize: 64, ChunkElems: 64, MaxElements: 64})
	if err != nil {
		f.Fatal(err)
	}
	frame, _ := enc.Append(nil, []float32{1, 2, 3, 4}, 0)
	enc.Close()
	f.Add(appendRelayMsg(nil, relayMsg{kind: kindAct, iter: 1, mb: 2, stage: 2, hop: 1, path: wirePath(), frame: frame}))
	f.Add(appendRelayMsg(nil, relayMsg{kind: kindGrad, iter: 1, mb: 2, stage: 1, hop: 2, path: wirePath(), frame: frame}))
	f.Add(appendRelayMsg(nil, relayMsg{kind: kindFail, iter: 1, path: wirePath(), reason: reasonMemory}))
	f.Add(appendRelayMsg(nil, relayMsg{kind: kindAbort, iter: 1, path: wirePath()}))
	f.Add([]byte("SR\x01\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseRelayMsg(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v is not ErrBadMessage", err)
			}
			return
		}
		if len(m.path.Nodes) > maxPathLen || len(m.frame) > len(b) {
			t.Fatalf("accepted past the bounds: %d visits, frame %d of %d bytes", len(m.path.Nodes), len(m.frame), len(b))
		}
		if again := appendRelayMsg(nil, m); !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", again, b)
		}
	})
}
