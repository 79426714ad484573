package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/transport"
)

// The shared state as members serve it to joiners (bulk key stateKey for
// the latest, stateKeyAt(r) for round r exactly), little-endian:
//
//	0   4   magic "SKSI"
//	4   4   version (3)
//	8   8   round: the next round to run
//	16  8   n: parameters
//	24  4   chunk size in bytes (optimizer.StateChunkBytes)
//	28  4   k: chunks (optimizer.StateChunks(n))
//	32  32  SHA-256 of the tail, or zeros for none
//	64  32k SHA-256 of each chunk of the body
//	..  8n  body: phi then the outer momentum (fp32)
//	..      tail: the rest of the state, at most maxTailBytes (a run over a
//	        packed dataset: its data.Ledger); absent when the hash is zero
//
// The index (everything before the body) names the state: its root
// (optimizer.StateRootWith, the tail's hash as its extra) is the hash
// members gossip, signed. A joiner checks
// the index against the hash a quorum announces, then every chunk of the
// body against the index, so a chunk that arrives corrupt, or forged by a
// member, is taken again from another member instead of failing the whole
// download. The local checkpoint keeps its own format (encodeState).
const (
	servedMagic   = "SKSI"
	servedVersion = 3
	servedHeader  = 64
	// maxTailBytes bounds a served state's tail (a data.Ledger at its
	// bounds is about 2.1 MB).
	maxTailBytes = 4 << 20
)

// servedIndexSize is the size of the index of a state of n parameters.
func servedIndexSize(n int) int64 {
	return servedHeader + sha256.Size*int64(optimizer.StateChunks(n))
}

// servedSize is the size of a served state of n parameters.
func servedSize(n int) int64 { return servedIndexSize(n) + 8*int64(n) }

// stateKeyAt is the bulk key of the state of round r exactly: the chunks of
// one download must all come from the same state, and a member that has
// moved on to another round refuses it instead of serving other bytes.
func stateKeyAt(r uint64) string { return stateKey + "@" + strconv.FormatUint(r, 10) }

// parseStateKey returns the round a bulk key names: (0, true, true) for
// stateKey (the latest), (r, false, true) for stateKeyAt(r).
func parseStateKey(key string) (round uint64, latest, ok bool) {
	if key == stateKey {
		return 0, true, true
	}
	rest, found := strings.CutPrefix(key, stateKey+"@")
	if !found {
		return 0, false, false
	}
	r, err := strconv.ParseUint(rest, 10, 64)
	if err != nil {
		return 0, false, false
	}
	return r, false, true
}

// encodeServed encodes a state for serving and returns it with its root,
// the state hash.
func encodeServed(round uint64, phi, mom []float32) ([]byte, uint64) {
	return encodeServedWith(round, phi, mom, nil)
}

// tailHash is the index's hash of a tail: zeros for none.
func tailHash(tail []byte) [sha256.Size]byte {
	if tail == nil {
		return [sha256.Size]byte{}
	}
	return sha256.Sum256(tail)
}

// encodeServedWith is encodeServed for a state with a tail.
func encodeServedWith(round uint64, phi, mom []float32, tail []byte) ([]byte, uint64) {
	return encodeServedInto(nil, round, phi, mom, optimizer.StateChunkHashes(phi, mom), tail)
}

// encodeServedInto is encodeServedWith given the state's chunk hashes
// (optimizer.StateChunkHashes(phi, mom), which DiLoCo keeps per state),
// into dst's memory when it has the room (its contents are overwritten),
// else into a new buffer.
func encodeServedInto(dst []byte, round uint64, phi, mom []float32, chunks [][sha256.Size]byte, tail []byte) ([]byte, uint64) {
	extra := tailHash(tail)
	size := servedSize(len(phi)) + int64(len(tail))
	b := dst[:0]
	if int64(cap(b)) < size {
		b = make([]byte, 0, size)
	}
	b = append(b, servedMagic...)
	b = binary.LittleEndian.AppendUint32(b, servedVersion)
	b = binary.LittleEndian.AppendUint64(b, round)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(phi)))
	b = binary.LittleEndian.AppendUint32(b, optimizer.StateChunkBytes)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(chunks)))
	b = append(b, extra[:]...)
	for _, c := range chunks {
		b = append(b, c[:]...)
	}
	b = optimizer.AppendFloats(optimizer.AppendFloats(b, phi), mom)
	b = append(b, tail...)
	return b, optimizer.StateRootWith(round, len(phi), chunks, extra)
}

// parseServedIndex checks the index of a served state of exactly n
// parameters (the caller's model: nothing is sized from the sender's word)
// and returns its round and chunk hashes.
func parseServedIndex(b []byte, n int) (round uint64, chunks [][sha256.Size]byte, err error) {
	round, chunks, _, err = parseServedIndexExtra(b, n)
	return round, chunks, err
}

// parseServedIndexExtra is parseServedIndex that also returns the tail's
// hash (zeros for none).
func parseServedIndexExtra(b []byte, n int) (round uint64, chunks [][sha256.Size]byte, extra [sha256.Size]byte, err error) {
	k := optimizer.StateChunks(n)
	if int64(len(b)) != servedIndexSize(n) {
		return 0, nil, extra, fmt.Errorf("%w: index of %d bytes, a state of %d parameters has %d", ErrBadState, len(b), n, servedIndexSize(n))
	}
	switch {
	case string(b[:4]) != servedMagic:
		return 0, nil, extra, fmt.Errorf("%w: bad magic %q", ErrBadState, b[:4])
	case binary.LittleEndian.Uint32(b[4:]) != servedVersion:
		return 0, nil, extra, fmt.Errorf("%w: version %d, want %d", ErrBadState, binary.LittleEndian.Uint32(b[4:]), servedVersion)
	case binary.LittleEndian.Uint64(b[16:]) != uint64(n):
		return 0, nil, extra, fmt.Errorf("%w: %d parameters, want %d", ErrBadState, binary.LittleEndian.Uint64(b[16:]), n)
	case binary.LittleEndian.Uint32(b[24:]) != optimizer.StateChunkBytes:
		return 0, nil, extra, fmt.Errorf("%w: chunks of %d bytes, want %d", ErrBadState, binary.LittleEndian.Uint32(b[24:]), optimizer.StateChunkBytes)
	case binary.LittleEndian.Uint32(b[28:]) != uint32(k):
		return 0, nil, extra, fmt.Errorf("%w: %d chunks, want %d", ErrBadState, binary.LittleEndian.Uint32(b[28:]), k)
	}
	chunks = make([][sha256.Size]byte, k)
	for i := range chunks {
		copy(chunks[i][:], b[servedHeader+sha256.Size*i:])
	}
	copy(extra[:], b[32:64])
	return binary.LittleEndian.Uint64(b[8:]), chunks, extra, nil
}

// decodeBody decodes a verified body of n parameters and refuses
// non-finite values.
func decodeBody(body []byte, n int) (phi, mom []float32, err error) {
	phi, mom = make([]float32, n), make([]float32, n)
	for i := range phi {
		phi[i] = math.Float32frombits(binary.LittleEndian.Uint32(body[4*i:]))
		mom[i] = math.Float32frombits(binary.LittleEndian.Uint32(body[4*(n+i):]))
		if f := float64(phi[i]) + float64(mom[i]); math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, nil, fmt.Errorf("%w: non-finite value at %d", ErrBadState, i)
		}
	}
	return phi, mom, nil
}

// servedState is what a volunteer serves to joiners: its encoded state and
// the round it holds.
type servedState struct {
	blob  []byte
	round uint64
}

// open returns the served state for a bulk key (parseStateKey).
func (s servedState) open(key string) (io.ReaderAt, int64, error) {
	r, latest, ok := parseStateKey(key)
	switch {
	case !ok:
		return nil, 0, fmt.Errorf("node: no bulk key %q", key)
	case s.blob == nil:
		return nil, 0, errors.New("node: no state to serve yet")
	case !latest && r != s.round:
		return nil, 0, fmt.Errorf("node: serving the state of round %d, not %d", s.round, r)
	}
	return bytes.NewReader(s.blob), int64(len(s.blob)), nil
}

// servedBlob is a served state with the count of its open downloads: a
// blob being read is never reused for the next state.
type servedBlob struct {
	servedState
	readers *atomic.Int32
}

// open is servedState.open, the reader counted among the blob's readers
// until the bulk server closes it.
func (s servedBlob) open(key string) (io.ReaderAt, int64, error) {
	r, n, err := s.servedState.open(key)
	if err != nil {
		return nil, 0, err
	}
	return newCountedReader(r, s.readers), n, nil
}

// countedReader is a served blob's reader that counts itself among the
// blob's open readers until the bulk server closes it.
type countedReader struct {
	io.ReaderAt
	n    *atomic.Int32
	once sync.Once
}

func newCountedReader(r io.ReaderAt, n *atomic.Int32) *countedReader {
	n.Add(1)
	return &countedReader{ReaderAt: r, n: n}
}

// Close ends this reader's count; the bulk server calls it once the
// request is served.
func (c *countedReader) Close() error {
	c.once.Do(func() { c.n.Add(-1) })
	return nil
}

// Bounds of a state download: at most maxStateSources members serve parts
// of the body at once (more adds little over a joiner's downlink), and each
// fetch may take two minutes plus the time its bytes take at 1 Mbit/s, so a
// large model on a slow link never times out while a stalled transfer still
// fails after the bulk protocol's idle timeout.
const maxStateSources = 4

func fetchTimeout(bytes int64) time.Duration {
	return 2*time.Minute + time.Duration(bytes*8/1e6)*time.Second
}

// stateDownload is one download of the shared state (fetchVerifiedState).
type stateDownload struct {
	pn   *p2p.Node
	log  *slog.Logger
	n    int
	blob memWriterAt
	tr   *transfer
	// round and chunks come from the index the download follows.
	round  uint64
	chunks [][sha256.Size]byte
	extra  [sha256.Size]byte // the tail's hash
	ok     []bool            // chunks of the body that match the index
	tail   []byte            // the tail, once fetched and checked
}

// fetchVerifiedState downloads the shared state of n parameters from the
// members ids, in order of preference, and returns its round, phi and
// momentum and who served the index.
//
// With a certified hash (want != 0, DiLoCo: every member at a round holds
// the same state) the index comes from the first member that serves one at
// round minRound exactly whose root is want (a root commits to its round,
// so a vote for round r naming a state of another round, a sybil's, names
// nothing anyone may take for round r), then the body is spread over
// up to maxStateSources members, every chunk checked against the index and
// a bad one taken again from the next member. A member whose chunk does not
// match the index it serves is logged as the offender.
//
// Without one (want is 0, NoLoCo: each member holds its own state) only the
// member whose index was taken can serve the body; one that moves on to its
// next round mid-download refuses the rest, and the next member's state is
// taken whole instead.
func fetchVerifiedState(ctx context.Context, pn *p2p.Node, log *slog.Logger, n int, minRound, want uint64,
	ids []transport.PeerID, progress io.Writer) (round uint64, phi, mom []float32, from transport.PeerID, err error) {
	round, phi, mom, _, from, err = fetchVerifiedStateTail(ctx, pn, log, n, minRound, want, ids, progress)
	return round, phi, mom, from, err
}

// fetchVerifiedStateTail is fetchVerifiedState that also returns the
// state's tail (nil for none), checked against the index's hash of it.
func fetchVerifiedStateTail(ctx context.Context, pn *p2p.Node, log *slog.Logger, n int, minRound, want uint64,
	ids []transport.PeerID, progress io.Writer) (round uint64, phi, mom []float32, tail []byte, from transport.PeerID, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	peers := make([]peer.ID, 0, len(ids))
	for _, m := range ids {
		id, err := peer.Decode(string(m))
		if err != nil {
			return 0, nil, nil, nil, "", fmt.Errorf("node: bad peer ID %q: %w", m, err)
		}
		peers = append(peers, id)
	}
	if want != 0 {
		d := &stateDownload{pn: pn, log: log, n: n, blob: make(memWriterAt, servedSize(n))}
		first, err := d.fetch(ctx, peers, minRound, want, true, progress)
		if err != nil {
			return 0, nil, nil, nil, "", err
		}
		phi, mom, err = decodeBody(d.blob[servedIndexSize(n):], n)
		return d.round, phi, mom, d.tail, ids[first], err
	}
	blob := make(memWriterAt, servedSize(n))
	for start := 0; ; {
		d := &stateDownload{pn: pn, log: log, n: n, blob: blob}
		first, err := d.fetch(ctx, peers[start:], minRound, 0, false, progress)
		if err == nil {
			phi, mom, err = decodeBody(d.blob[servedIndexSize(n):], n)
			return d.round, phi, mom, d.tail, ids[start+first], err
		}
		if first < 0 || ctx.Err() != nil || start+first+1 >= len(peers) {
			return 0, nil, nil, nil, "", err
		}
		log.Debug("a member's state could not be fetched whole; trying the next member", "peer", peers[start+first], "err", err)
		start += first + 1
	}
}

// fetch takes the index from the first of peers that serves an acceptable
// one, then the body: from that member alone, or, when the state is shared
// (every member at the round holds the same bytes), spread over up to
// maxStateSources members and repaired from any of them. It returns the
// index server's position among peers (-1 when none served an index).
func (d *stateDownload) fetch(ctx context.Context, peers []peer.ID, minRound, want uint64, shared bool, progress io.Writer) (int, error) {
	first, err := d.index(ctx, peers, minRound, want)
	if err != nil {
		return -1, err
	}
	// The member that served the index first, then the others.
	from, spread := []peer.ID{peers[first]}, 1
	if shared {
		from = slices.Concat(from, peers[:first], peers[first+1:])
		spread = min(len(from), maxStateSources)
	}
	w := progress
	if len(d.blob) < 4<<20 {
		w = nil // a small state arrives before a progress line could
	}
	d.tr = startTransfer(w, fmt.Sprintf("the run's state (round %d) from %d member(s)", d.round, spread), 8*int64(d.n))
	d.spread(ctx, from[:spread])
	for _, src := range from {
		if d.missing() == 0 {
			break
		}
		d.repair(ctx, src)
	}
	bad := d.missing()
	d.tr.finish(bad == 0)
	if bad == 0 {
		if err := d.fetchTail(ctx, from); err != nil {
			return first, err
		}
		return first, nil
	}
	if err := ctx.Err(); err != nil {
		return first, err
	}
	return first, fmt.Errorf("%w: %d of %d chunks of round %d's state could not be fetched intact from any of %d member(s)",
		ErrBadState, bad, len(d.chunks), d.round, len(from))
}

// index takes the index from the first of peers that serves an acceptable
// one and returns that peer's position.
func (d *stateDownload) index(ctx context.Context, peers []peer.ID, minRound, want uint64) (int, error) {
	var lastErr error = errors.New("node: no peer to take the state from")
	size := servedIndexSize(d.n)
	for i, id := range peers {
		buf := make(memWriterAt, size)
		fctx, cancel := context.WithTimeout(ctx, fetchTimeout(size))
		_, err := d.pn.Fetch(fctx, id, stateKey, buf, p2p.FetchOptions{Length: size})
		cancel()
		if err != nil {
			lastErr = err
			if ctx.Err() != nil {
				return 0, err
			}
			continue
		}
		round, chunks, extra, err := parseServedIndexExtra(buf, d.n)
		if err == nil && round < minRound {
			err = fmt.Errorf("node: %s serves round %d, want %d or later", shortPeer(id), round, minRound)
		}
		if err == nil && want != 0 && round != minRound {
			err = fmt.Errorf("%w: %s serves round %d for a certificate of round %d", ErrBadState, shortPeer(id), round, minRound)
		}
		if err == nil && want != 0 {
			if got := optimizer.StateRootWith(round, d.n, chunks, extra); got != want {
				err = fmt.Errorf("%w: %s serves a state (round %d) with hash %016x, the run announces %016x", ErrBadState, shortPeer(id), round, got, want)
			}
		}
		if err != nil {
			lastErr = err
			continue
		}
		copy(d.blob, buf)
		d.round, d.chunks, d.extra, d.ok = round, chunks, extra, make([]bool, len(chunks))
		return i, nil
	}
	return 0, lastErr
}

// fetchTail takes the state's tail, when its index names one, from the
// first of from that serves bytes matching the index's hash of it.
func (d *stateDownload) fetchTail(ctx context.Context, from []peer.ID) error {
	if d.extra == ([sha256.Size]byte{}) {
		return nil
	}
	lastErr := errors.New("node: no member to take the state's tail from")
	for _, src := range from {
		buf := make(memWriterAt, maxTailBytes)
		fctx, cancel := context.WithTimeout(ctx, fetchTimeout(maxTailBytes))
		got, err := d.pn.Fetch(fctx, src, stateKeyAt(d.round), shifted{buf, servedSize(d.n)}, p2p.FetchOptions{Offset: servedSize(d.n), Length: -1, MaxLength: maxTailBytes})
		cancel()
		if err == nil && sha256.Sum256(buf[:got]) != d.extra {
			err = fmt.Errorf("%w: %s serves a tail that does not match the state's index", ErrBadState, shortPeer(src))
			d.log.Warn("a member served a state tail that does not match its hash", "offender", src, "round", d.round)
		}
		if err == nil {
			d.tail = slices.Clone(buf[:got])
			return nil
		}
		lastErr = err
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return fmt.Errorf("node: round %d's state tail: %w", d.round, lastErr)
}

// spread fetches the body in contiguous spans of chunks, one per source,
// at once, and checks what arrived.
func (d *stateDownload) spread(ctx context.Context, sources []peer.ID) {
	k := len(d.chunks)
	if k == 0 {
		return
	}
	spans := min(len(sources), k)
	errs := make([]error, spans)
	var wg sync.WaitGroup
	for s := range spans {
		wg.Go(func() { errs[s] = d.fetchChunks(ctx, sources[s], s*k/spans, (s+1)*k/spans) })
	}
	wg.Wait()
	for s := range spans {
		d.checkRange(sources[s], s*k/spans, (s+1)*k/spans, errs[s])
	}
}

// repair takes every chunk still missing or bad from src, one run of
// consecutive chunks at a time, and checks them. A chunk src delivered in
// full that does not match the index is src's doing: it is logged with
// src's peer ID.
func (d *stateDownload) repair(ctx context.Context, src peer.ID) {
	for c := 0; c < len(d.chunks); {
		if d.ok[c] {
			c++
			continue
		}
		lo := c
		for c < len(d.chunks) && !d.ok[c] {
			c++
		}
		d.checkRange(src, lo, c, d.fetchChunks(ctx, src, lo, c))
		if ctx.Err() != nil {
			return
		}
	}
}

// checkRange checks chunks [lo, hi) just fetched from src. What arrived of
// a fetch that failed is kept where it matches; a chunk src delivered in
// full (err nil) that does not match is src's fault.
func (d *stateDownload) checkRange(src peer.ID, lo, hi int, err error) {
	blame := src
	if err != nil {
		d.log.Debug("state chunks not fetched", "peer", src, "chunks", fmt.Sprintf("%d-%d", lo, hi-1), "err", err)
		blame = ""
	}
	for c := lo; c < hi; c++ {
		d.check(c, blame)
	}
}

// fetchChunks fetches chunks [lo, hi) of the body from src.
func (d *stateDownload) fetchChunks(ctx context.Context, src peer.ID, lo, hi int) error {
	body := servedIndexSize(d.n)
	off := body + int64(lo)*optimizer.StateChunkBytes
	end := min(body+int64(hi)*optimizer.StateChunkBytes, int64(len(d.blob)))
	fctx, cancel := context.WithTimeout(ctx, fetchTimeout(end-off))
	defer cancel()
	_, err := d.pn.Fetch(fctx, src, stateKeyAt(d.round), d.tr.writerAt(d.blob),
		p2p.FetchOptions{Offset: off, Length: end - off, Streams: stateStreams, Conns: stateConns})
	return err
}

// check marks chunk c good if it matches the index. from, when set, is the
// member that has just delivered it in full: a mismatch is its fault.
func (d *stateDownload) check(c int, from peer.ID) {
	if d.ok[c] {
		return
	}
	body := servedIndexSize(d.n)
	lo := body + int64(c)*optimizer.StateChunkBytes
	hi := min(lo+optimizer.StateChunkBytes, int64(len(d.blob)))
	if sha256.Sum256(d.blob[lo:hi]) == d.chunks[c] {
		d.ok[c] = true
		return
	}
	if from != "" {
		d.log.Warn("a member served a chunk of the run's state that does not match its hash; taking it from another member",
			"offender", from, "round", d.round, "chunk", c)
	}
}

// missing counts the chunks not yet fetched intact.
func (d *stateDownload) missing() int {
	bad := 0
	for _, ok := range d.ok {
		if !ok {
			bad++
		}
	}
	return bad
}
