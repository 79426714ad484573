package p2p

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"
)

// memRW is an in-memory DeadlineReadWriter.
type memRW struct {
	io.Reader
	io.Writer
}

func (memRW) SetReadDeadline(time.Time) error  { return nil }
func (memRW) SetWriteDeadline(time.Time) error { return nil }

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	cfg := DefaultFrameConfig()
	cfg.MaxSize = 100 << 10
	w := NewFrameStream(memRW{Writer: &buf}, cfg)
	payloads := [][]byte{nil, []byte("hello"), bytes.Repeat([]byte{7}, 100<<10)}
	for i, p := range payloads {
		if err := w.WriteFrame(uint8(i+1), p); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteFrame(9, make([]byte, 100<<10+1)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized write: %v", err)
	}
	r := NewFrameStream(memRW{Reader: &buf}, cfg)
	for i, p := range payloads {
		typ, got, err := r.ReadFrame()
		if err != nil || typ != uint8(i+1) || !bytes.Equal(got, p) {
			t.Fatalf("frame %d: typ %d len %d err %v", i, typ, len(got), err)
		}
	}
	if _, _, err := r.ReadFrame(); err != io.EOF {
		t.Fatalf("after last frame: %v", err)
	}
}

func TestFrameRejects(t *testing.T) {
	cfg := DefaultFrameConfig()
	cfg.MaxSize = 16
	cases := map[string]struct {
		in   []byte
		want error
	}{
		"too large": {[]byte{1, 1, 0, 0, 0xff, 0xff, 0xff, 0xff}, ErrFrameTooLarge},
		"version":   {[]byte{1, 2, 0, 0, 0, 0, 0, 1, 0}, ErrBadFrame},
		"flags":     {[]byte{1, 1, 0, 1, 0, 0, 0, 1, 0}, ErrBadFrame},
		"truncated": {[]byte{1, 1, 0, 0, 0, 0, 0, 4, 0}, io.ErrUnexpectedEOF},
	}
	for name, c := range cases {
		r := NewFrameStream(memRW{Reader: bytes.NewReader(c.in)}, cfg)
		if _, _, err := r.ReadFrame(); !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", name, err, c.want)
		}
	}
}

// FuzzFrame: the decoder never panics and never holds more than MaxSize.
func FuzzFrame(f *testing.F) {
	f.Add([]byte{1, 1, 0, 0, 0, 0, 0, 3, 'a', 'b', 'c'})
	f.Add([]byte{1, 1, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		cfg := DefaultFrameConfig()
		cfg.MaxSize = 4096
		r := NewFrameStream(memRW{Reader: bytes.NewReader(in)}, cfg)
		for {
			_, p, err := r.ReadFrame()
			if err != nil {
				return
			}
			if len(p) > int(cfg.MaxSize) || cap(r.buf) > int(cfg.MaxSize) {
				t.Fatalf("payload %d / buffer %d over limit %d", len(p), cap(r.buf), cfg.MaxSize)
			}
		}
	})
}

func TestMetaRoundTrip(t *testing.T) {
	m := Meta{Role: RoleVolunteer, RunID: "run-1", Stage: 2, Device: "cuda:H100", Version: "0.1.0",
		ComputeTFLOPS: 412.5, UpMbps: 100, DownMbps: 1000, CapUpMbps: 50, CapDownMbps: 500, CapMemMiB: 16384, TCPPort: 4001,
		Round: 1 << 40, StateHash: 0xdeadbeefcafef00d}
	b, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got Meta
	if err := got.UnmarshalBinary(b); err != nil || got != m {
		t.Fatalf("got %+v err %v", got, err)
	}
	long := m
	long.RunID = string(bytes.Repeat([]byte("r"), MaxRunIDLen))
	long.Device = string(bytes.Repeat([]byte("d"), maxDeviceLen))
	long.Version = string(bytes.Repeat([]byte("v"), maxVersionLen))
	b, err = long.MarshalBinary()
	if err != nil || len(b) > MetaLimit {
		t.Fatalf("longest meta: %d bytes, err %v", len(b), err)
	}
	t.Logf("longest metadata: %d of %d bytes", len(b), MetaLimit)
	long.Device += "x"
	if _, err := long.MarshalBinary(); !errors.Is(err, ErrBadMeta) {
		t.Fatalf("device over bound: %v", err)
	}
}

func FuzzMeta(f *testing.F) {
	b, _ := Meta{RunID: "r", Device: "cpu", Stage: -1}.MarshalBinary()
	f.Add(b)
	f.Add([]byte{1, 0, 200})
	f.Fuzz(func(t *testing.T, in []byte) {
		var m Meta
		if err := m.UnmarshalBinary(in); err != nil {
			return
		}
		out, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded meta does not re-encode: %v", err)
		}
		var m2 Meta
		if err := m2.UnmarshalBinary(out); err != nil {
			t.Fatalf("re-encoded meta does not decode: %v", err)
		}
	})
}

func FuzzPeerBook(f *testing.F) {
	f.Add([]byte(`{"version":1,"peers":[{"id":"12D3KooWHGr3gLQADoFvneeDwLbcdTzShdqRFdw8hUypthwHXD1Y","addrs":["/ip4/127.0.0.1/udp/4001/quic-v1"],"role":1,"seen":1700000000}]}`))
	f.Add([]byte(`{"version":1,"peers":[]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		recs, err := DecodePeerBook(in)
		if err != nil {
			return
		}
		if len(recs) > maxPeerBookPeers {
			t.Fatalf("%d peers over limit", len(recs))
		}
		b, err := EncodePeerBook(recs)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodePeerBook(b); err != nil {
			t.Fatalf("re-encoded book does not decode: %v", err)
		}
	})
}

func FuzzBulkHeaders(f *testing.F) {
	f.Add(bulkRequest{Key: "weights", Offset: 10, Length: 4096}.marshal())
	f.Add(bulkReplyHdr{Status: bulkOK, Total: 100, Length: 10, Msg: "ok"}.marshal())
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		if r, err := decodeBulkRequest(in); err == nil {
			if len(r.Key) > maxBulkKey {
				t.Fatalf("key of %d bytes", len(r.Key))
			}
			if !bytes.Equal(r.marshal(), in) {
				t.Fatalf("request does not round-trip")
			}
		}
		if r, err := decodeBulkReply(in); err == nil {
			if r.Length > r.Total || len(r.Msg) > maxBulkMsg {
				t.Fatalf("reply %+v out of bounds", r)
			}
		}
	})
}
