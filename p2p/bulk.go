package p2p

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	pool "github.com/libp2p/go-buffer-pool"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
)

// Bulk transfer: a pull protocol for large byte ranges (tensors, checkpoints)
// on /skein/<run>/bulk/1. The client sends request frames {key, offset,
// length}; the server answers each with a reply frame {status, total, length}
// followed by length raw bytes. Requests are pipelined (two in flight per
// stream), flow control is QUIC's (or yamux's on TCP), and a transfer is
// split into chunks that several streams take from a shared queue
// (striping). A failed transfer reports the contiguous prefix it completed,
// so the caller resumes with Offset += n.

const (
	bulkReq   = 1
	bulkReply = 2

	maxBulkKey  = 256
	maxBulkMsg  = 256
	bulkDepth   = 2 // requests in flight per stream
	bulkIOBlock = 256 << 10

	// DefaultChunkSize is the unit of striping and resumption.
	DefaultChunkSize = 4 << 20
)

// Bulk reply status codes.
const (
	bulkOK uint8 = iota
	bulkNotFound
	bulkRange
	bulkFailed
)

// BulkSource serves bulk keys: it returns the data for key and its size. It is
// called for each request, and a source that is also an io.Closer is closed
// when the request is served; returning an error refuses the request (the
// client's Fetch fails with ErrBulk).
type BulkSource func(ctx context.Context, from peer.ID, key string) (io.ReaderAt, int64, error)

// DefaultMaxFetch bounds a Fetch of unknown length (64 GiB).
const DefaultMaxFetch = 64 << 30

// FetchOptions shape one Fetch.
type FetchOptions struct {
	Offset int64 // first byte wanted
	Length int64 // bytes wanted; < 0 = to the end, at most MaxLength
	// MaxLength bounds a transfer whose length the peer announces (Length <
	// 0); default DefaultMaxFetch. The peer's word is checked against it
	// before anything is allocated.
	MaxLength int64
	Streams   int // parallel streams (striping); default 1
	// Conns spreads the streams over this many connections (the main one
	// plus Conns-1 lanes, see lanes.go); default 1. Use it on lossy long fat
	// pipes, where one connection's congestion control fills a fraction of
	// the link, and on fast links, where one connection is bound to a core.
	Conns     int
	ChunkSize int64 // default DefaultChunkSize
	// IOTimeout bounds every read and write of the transfer (default 30 s).
	IOTimeout time.Duration
}

type bulkRequest struct {
	Key            string
	Offset, Length uint64
}

type bulkReplyHdr struct {
	Status        uint8
	Total, Length uint64
	Msg           string
}

func (r bulkRequest) marshal() []byte {
	b := make([]byte, 0, 18+len(r.Key))
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.Key)))
	b = append(b, r.Key...)
	b = binary.BigEndian.AppendUint64(b, r.Offset)
	return binary.BigEndian.AppendUint64(b, r.Length)
}

// decodeBulkRequest parses a request frame payload; it never panics.
func decodeBulkRequest(b []byte) (bulkRequest, error) {
	if len(b) < 2 {
		return bulkRequest{}, fmt.Errorf("%w: request of %d bytes", ErrBulk, len(b))
	}
	n := int(binary.BigEndian.Uint16(b))
	if n > maxBulkKey {
		return bulkRequest{}, fmt.Errorf("%w: key of %d bytes, limit %d", ErrBulk, n, maxBulkKey)
	}
	if len(b) != 2+n+16 {
		return bulkRequest{}, fmt.Errorf("%w: request of %d bytes, want %d", ErrBulk, len(b), 2+n+16)
	}
	r := bulkRequest{Key: string(b[2 : 2+n])}
	r.Offset = binary.BigEndian.Uint64(b[2+n:])
	r.Length = binary.BigEndian.Uint64(b[2+n+8:])
	if r.Offset > 1<<62 || r.Length > 1<<62 {
		return bulkRequest{}, fmt.Errorf("%w: offset %d length %d out of range", ErrBulk, r.Offset, r.Length)
	}
	return r, nil
}

func (r bulkReplyHdr) marshal() []byte {
	msg := r.Msg
	if len(msg) > maxBulkMsg {
		msg = msg[:maxBulkMsg]
	}
	b := make([]byte, 0, 19+len(msg))
	b = append(b, r.Status)
	b = binary.BigEndian.AppendUint64(b, r.Total)
	b = binary.BigEndian.AppendUint64(b, r.Length)
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// decodeBulkReply parses a reply frame payload; it never panics.
func decodeBulkReply(b []byte) (bulkReplyHdr, error) {
	if len(b) < 19 {
		return bulkReplyHdr{}, fmt.Errorf("%w: reply of %d bytes", ErrBulk, len(b))
	}
	r := bulkReplyHdr{Status: b[0], Total: binary.BigEndian.Uint64(b[1:]), Length: binary.BigEndian.Uint64(b[9:])}
	n := int(binary.BigEndian.Uint16(b[17:]))
	if n > maxBulkMsg || len(b) != 19+n {
		return bulkReplyHdr{}, fmt.Errorf("%w: reply message of %d bytes in %d", ErrBulk, n, len(b))
	}
	r.Msg = string(b[19:])
	if r.Total > 1<<62 || r.Length > r.Total {
		return bulkReplyHdr{}, fmt.Errorf("%w: reply length %d of total %d", ErrBulk, r.Length, r.Total)
	}
	return r, nil
}

func bulkFrameConfig(timeout time.Duration) FrameConfig {
	return FrameConfig{Version: 1, MaxSize: 1024, ReadTimeout: timeout, WriteTimeout: timeout}
}

// MaxBulkStreamsPerPeer bounds the bulk streams one peer has served at once
// (a joiner fetching the state over 8 streams and shards over 8 more fits);
// more are reset, so that one member cannot take a server's whole uplink
// with streams. Who is served at all is the BulkSource's to say (members
// only, in node and bootstrap).
const MaxBulkStreamsPerPeer = 32

// ServeBulk serves bulk requests from src. ioTimeout bounds every read and
// write (0 = 30 s).
func (n *Node) ServeBulk(src BulkSource, ioTimeout time.Duration) error {
	if ioTimeout <= 0 {
		ioTimeout = DefaultFrameTimeout
	}
	var mu sync.Mutex
	active := make(map[peer.ID]int) // bulk streams being served, per peer; no entry at 0
	return n.Handle(ProtoBulk, bulkFrameConfig(ioTimeout), func(ctx context.Context, s *Stream) error {
		from := s.Peer()
		mu.Lock()
		if active[from] >= MaxBulkStreamsPerPeer {
			mu.Unlock()
			return fmt.Errorf("%w: %s has %d bulk streams open, limit %d", ErrBulk, from, MaxBulkStreamsPerPeer, MaxBulkStreamsPerPeer)
		}
		active[from]++
		mu.Unlock()
		defer func() {
			mu.Lock()
			if active[from]--; active[from] == 0 {
				delete(active, from)
			}
			mu.Unlock()
		}()
		buf := pool.Get(bulkIOBlock)
		defer pool.Put(buf)
		for {
			typ, p, err := s.ReadFrame()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			if typ != bulkReq {
				return fmt.Errorf("%w: frame type %d, want request", ErrBulk, typ)
			}
			req, err := decodeBulkRequest(p)
			if err != nil {
				return err
			}
			if err := serveBulkRequest(ctx, s, src, req, buf, ioTimeout); err != nil {
				return err
			}
		}
	})
}

func serveBulkRequest(ctx context.Context, s *Stream, src BulkSource, req bulkRequest, buf []byte, timeout time.Duration) error {
	r, total, err := src(ctx, s.Peer(), req.Key)
	if err != nil {
		return s.WriteFrame(bulkReply, bulkReplyHdr{Status: bulkNotFound, Msg: err.Error()}.marshal())
	}
	if c, ok := r.(io.Closer); ok {
		defer c.Close()
	}
	if total < 0 || req.Offset > uint64(total) || req.Length > uint64(total)-req.Offset {
		return s.WriteFrame(bulkReply, bulkReplyHdr{Status: bulkRange, Total: uint64(total),
			Msg: fmt.Sprintf("range [%d, +%d) outside [0, %d)", req.Offset, req.Length, total)}.marshal())
	}
	if err := s.WriteFrame(bulkReply, bulkReplyHdr{Status: bulkOK, Total: uint64(total), Length: req.Length}.marshal()); err != nil {
		return err
	}
	raw := s.Raw()
	off, end := int64(req.Offset), int64(req.Offset+req.Length)
	for off < end {
		k := min(int64(len(buf)), end-off)
		m, err := r.ReadAt(buf[:k], off)
		if int64(m) < k {
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("p2p: bulk source %q at %d: %w", req.Key, off, err)
		}
		_ = raw.SetWriteDeadline(time.Now().Add(timeout))
		if _, err := raw.Write(buf[:k]); err != nil {
			return err
		}
		off += k
	}
	return ctx.Err()
}

// Fetch pulls key's bytes [Offset, Offset+Length) from p into w at the same
// offsets. It returns the length of the contiguous prefix written from
// Offset: on error the caller can resume with Offset += n. Relayed
// connections are used only if ctx allows them.
func (n *Node) Fetch(ctx context.Context, p peer.ID, key string, w io.WriterAt, opt FetchOptions) (int64, error) {
	if len(key) > maxBulkKey {
		return 0, fmt.Errorf("%w: key of %d bytes, limit %d", ErrBulk, len(key), maxBulkKey)
	}
	if opt.Streams <= 0 {
		opt.Streams = 1
	}
	if opt.Conns <= 0 {
		opt.Conns = 1
	}
	if opt.Streams < opt.Conns {
		opt.Streams = opt.Conns
	}
	if opt.ChunkSize <= 0 {
		opt.ChunkSize = DefaultChunkSize
	}
	if opt.IOTimeout <= 0 {
		opt.IOTimeout = DefaultFrameTimeout
	}
	if opt.Offset < 0 {
		return 0, fmt.Errorf("%w: offset %d", ErrBulk, opt.Offset)
	}
	fcfg := bulkFrameConfig(opt.IOTimeout)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	hosts := []host.Host{n.h}
	if opt.Conns > 1 {
		lanes, err := n.laneHosts(opt.Conns - 1)
		if err != nil {
			return 0, err
		}
		hosts = append(hosts, lanes...)
	}
	first, err := n.Open(ctx, p, ProtoBulk, fcfg)
	if err != nil {
		return 0, err
	}
	if opt.Length < 0 {
		// Ask for nothing to learn the size.
		hdr, err := bulkRoundTrip(first, bulkRequest{Key: key, Offset: uint64(opt.Offset)})
		if err != nil {
			first.Reset()
			return 0, err
		}
		opt.Length = int64(hdr.Total) - opt.Offset
		limit := opt.MaxLength
		if limit <= 0 {
			limit = DefaultMaxFetch
		}
		if opt.Length > limit {
			first.Reset()
			return 0, fmt.Errorf("%w: peer announces %d bytes, limit %d", ErrBulk, opt.Length, limit)
		}
	}
	if opt.Length == 0 {
		first.Close()
		return 0, nil
	}
	chunks := int((opt.Length + opt.ChunkSize - 1) / opt.ChunkSize)
	q := newChunkQueue(chunks)
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var firstErr error
	go func() {
		select {
		case <-q.allDone:
			cancel() // stop stripes still on duplicate chunks
		case <-ctx.Done():
		}
	}()
	for i := range min(opt.Streams, chunks) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := first
			if i > 0 {
				var err error
				if st, err = n.openOn(ctx, hosts[i%len(hosts)], p, ProtoBulk, fcfg); err != nil {
					n.log.Debug("bulk stripe not opened", "peer", p, "stripe", i, "err", err)
					errMu.Lock()
					firstErr = cmpErr(firstErr, err)
					errMu.Unlock()
					return
				}
			}
			stop := context.AfterFunc(ctx, func() { st.Reset() })
			defer stop()
			if err := fetchStripe(ctx, st, key, w, opt, q); err != nil {
				st.Reset()
				select {
				case <-q.allDone: // a duplicate lost the race: not an error
					return
				default:
				}
				errMu.Lock()
				firstErr = cmpErr(firstErr, err)
				errMu.Unlock()
				return
			}
			st.Close()
		}()
	}
	wg.Wait()
	done := q.prefix() * opt.ChunkSize
	if done > opt.Length {
		done = opt.Length
	}
	if done == opt.Length {
		return done, nil
	}
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return done, fmt.Errorf("p2p: bulk %q from %s: %d of %d bytes: %w", key, p, done, opt.Length, firstErr)
}

func cmpErr(old, err error) error {
	if old != nil {
		return old
	}
	return err
}

// chunkQueue hands out chunk indexes to stripes and records completion.
// When every chunk has been handed out, idle stripes duplicate chunks still
// in flight elsewhere (end game, as in BitTorrent): one slow or stalled
// connection then no longer holds up the end of a transfer. Duplicates carry
// the same bytes for the same offsets; io.WriterAt forbids parallel writes
// to overlapping ranges, so writes into one chunk hold that chunk's lock,
// and a copy still arriving after the chunk is done is read and dropped.
type chunkQueue struct {
	writing []sync.Mutex // per chunk, held around each WriteAt into it
	mu      sync.Mutex
	next    int
	total   int
	done    []bool
	copies  []uint8 // fetches in flight or done per chunk
	ndone   int
	allDone chan struct{}
}

func newChunkQueue(n int) *chunkQueue {
	return &chunkQueue{writing: make([]sync.Mutex, n), total: n, done: make([]bool, n), copies: make([]uint8, n), allDone: make(chan struct{})}
}

// writeAt writes p at off of w as part of chunk i, unless another copy of
// the chunk has already finished it.
func (q *chunkQueue) writeAt(w io.WriterAt, i int, p []byte, off int64) error {
	q.writing[i].Lock()
	defer q.writing[i].Unlock()
	q.mu.Lock()
	done := q.done[i]
	q.mu.Unlock()
	if done {
		return nil
	}
	_, err := w.WriteAt(p, off)
	return err
}

// take returns a chunk for a stripe whose in-flight chunks are busy.
func (q *chunkQueue) take(busy []int) (int, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.next < q.total {
		q.next++
		q.copies[q.next-1]++
		return q.next - 1, true
	}
	// End game, for idle stripes only: the oldest unfinished chunk with a
	// single fetcher.
	if len(busy) > 0 {
		return 0, false
	}
	for i := range q.total {
		if !q.done[i] && q.copies[i] < 2 && !slices.Contains(busy, i) {
			q.copies[i]++
			return i, true
		}
	}
	return 0, false
}

func (q *chunkQueue) finish(i int) {
	q.writing[i].Lock() // no copy is mid-write when the chunk becomes done
	defer q.writing[i].Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.done[i] {
		return
	}
	q.done[i] = true
	q.ndone++
	if q.ndone == q.total {
		close(q.allDone)
	}
}

func (q *chunkQueue) prefix() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	var k int64
	for _, d := range q.done {
		if !d {
			break
		}
		k++
	}
	return k
}

func bulkRoundTrip(s *Stream, req bulkRequest) (bulkReplyHdr, error) {
	if err := s.WriteFrame(bulkReq, req.marshal()); err != nil {
		return bulkReplyHdr{}, err
	}
	return readBulkReply(s)
}

func readBulkReply(s *Stream) (bulkReplyHdr, error) {
	typ, p, err := s.ReadFrame()
	if err != nil {
		return bulkReplyHdr{}, err
	}
	if typ != bulkReply {
		return bulkReplyHdr{}, fmt.Errorf("%w: frame type %d, want reply", ErrBulk, typ)
	}
	hdr, err := decodeBulkReply(p)
	if err != nil {
		return hdr, err
	}
	if hdr.Status != bulkOK {
		return hdr, fmt.Errorf("%w: status %d: %s", ErrBulk, hdr.Status, hdr.Msg)
	}
	return hdr, nil
}

// fetchStripe runs one stream: it keeps bulkDepth requests in flight and
// copies each reply's bytes into w.
func fetchStripe(ctx context.Context, s *Stream, key string, w io.WriterAt, opt FetchOptions, q *chunkQueue) error {
	buf := pool.Get(bulkIOBlock)
	defer pool.Put(buf)
	raw := s.Raw()
	var inflight []int
	for {
		for len(inflight) < bulkDepth {
			i, ok := q.take(inflight)
			if !ok {
				break
			}
			off := opt.Offset + int64(i)*opt.ChunkSize
			length := min(opt.ChunkSize, opt.Offset+opt.Length-off)
			if err := s.WriteFrame(bulkReq, bulkRequest{Key: key, Offset: uint64(off), Length: uint64(length)}.marshal()); err != nil {
				return err
			}
			inflight = append(inflight, i)
		}
		if len(inflight) == 0 {
			return s.CloseWrite()
		}
		i := inflight[0]
		inflight = inflight[1:]
		off := opt.Offset + int64(i)*opt.ChunkSize
		want := min(opt.ChunkSize, opt.Offset+opt.Length-off)
		hdr, err := readBulkReply(s)
		if err != nil {
			return err
		}
		if int64(hdr.Length) != want {
			return fmt.Errorf("%w: reply of %d bytes for a request of %d", ErrBulk, hdr.Length, want)
		}
		for got := int64(0); got < want; {
			if err := ctx.Err(); err != nil {
				return err
			}
			k := min(int64(len(buf)), want-got)
			_ = raw.SetReadDeadline(time.Now().Add(opt.IOTimeout))
			m, err := io.ReadFull(raw, buf[:k])
			if m > 0 {
				if werr := q.writeAt(w, i, buf[:m], off+got); werr != nil {
					return werr
				}
				got += int64(m)
			}
			if err != nil {
				return err
			}
		}
		q.finish(i)
	}
}
