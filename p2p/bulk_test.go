package p2p_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/p2p/p2ptest"
)

// memFile is an io.WriterAt over a fixed buffer.
type memFile struct{ b []byte }

func (m *memFile) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(m.b)) {
		return 0, fmt.Errorf("write [%d, +%d) outside %d", off, len(p), len(m.b))
	}
	return copy(m.b[off:], p), nil
}

// failingReader fails reads that reach past limit while armed.
type failingReader struct {
	r     *bytes.Reader
	limit int64
	armed atomic.Bool
}

func (f *failingReader) ReadAt(p []byte, off int64) (int, error) {
	if f.armed.Load() && off+int64(len(p)) > f.limit {
		return 0, errors.New("disk on fire")
	}
	return f.r.ReadAt(p, off)
}

func TestBulkFetch(t *testing.T) {
	s := p2ptest.NewSwarm(t, 2, p2ptest.Options{})
	server, client := s.Nodes[0], s.Nodes[1]
	data := make([]byte, 48<<20+12345)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	fr := &failingReader{r: bytes.NewReader(data), limit: 20 << 20}
	if err := server.ServeBulk(func(ctx context.Context, from peer.ID, key string) (io.ReaderAt, int64, error) {
		switch key {
		case "weights":
			return bytes.NewReader(data), int64(len(data)), nil
		case "flaky":
			return fr, int64(len(data)), nil
		}
		return nil, 0, fmt.Errorf("no key %q", key)
	}, 0); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, streams := range []int{1, 4} {
		out := &memFile{b: make([]byte, len(data))}
		n, err := client.Fetch(ctx, server.ID(), "weights", out, p2p.FetchOptions{Length: -1, Streams: streams, ChunkSize: 1 << 20})
		if err != nil || n != int64(len(data)) || !bytes.Equal(out.b, data) {
			t.Fatalf("streams=%d: n=%d err=%v equal=%v", streams, n, err, bytes.Equal(out.b, data))
		}
	}
	// A sub-range lands at its own offsets.
	out := &memFile{b: make([]byte, len(data))}
	if n, err := client.Fetch(ctx, server.ID(), "weights", out, p2p.FetchOptions{Offset: 1000, Length: 5 << 20, Streams: 2, ChunkSize: 1 << 20}); err != nil || n != 5<<20 ||
		!bytes.Equal(out.b[1000:1000+5<<20], data[1000:1000+5<<20]) {
		t.Fatalf("range: n=%d err=%v", n, err)
	}
	// Unknown keys are refused.
	if _, err := client.Fetch(ctx, server.ID(), "nope", out, p2p.FetchOptions{Length: -1}); !errors.Is(err, p2p.ErrBulk) {
		t.Fatalf("unknown key: %v", err)
	}
	// A transfer that breaks midway resumes from the offset it reports.
	fr.armed.Store(true)
	out = &memFile{b: make([]byte, len(data))}
	n, err := client.Fetch(ctx, server.ID(), "flaky", out, p2p.FetchOptions{Length: -1, Streams: 3, ChunkSize: 1 << 20})
	if err == nil || n > fr.limit || n == 0 {
		t.Fatalf("flaky: n=%d err=%v, want a partial prefix", n, err)
	}
	t.Logf("interrupted after %d bytes: %v", n, err)
	fr.armed.Store(false)
	m, err := client.Fetch(ctx, server.ID(), "flaky", out, p2p.FetchOptions{Offset: n, Length: -1, Streams: 3, ChunkSize: 1 << 20})
	if err != nil || n+m != int64(len(data)) || !bytes.Equal(out.b, data) {
		t.Fatalf("resume: m=%d err=%v", m, err)
	}
	// Bytes are accounted per peer and per protocol.
	tr := client.Traffic()
	in := tr.ByProtocol[p2p.ProtocolID("test", "bulk", 1)].In
	if in < 3*int64(len(data)) {
		t.Errorf("bulk protocol counted %d bytes in, want >= %d", in, 3*len(data))
	}
	if tr.ByPeer[server.ID()].In < in {
		t.Errorf("peer counted %d bytes in, protocol %d", tr.ByPeer[server.ID()].In, in)
	}
}
