package data

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/skein-ml/skein/internal/atomicfile"
)

// ChunkFetcher fetches bytes [off, off+n) of the token shard called name
// from wherever the shards are served (a run's members). check says
// whether bytes are the right ones: a fetcher should pass bytes that fail
// it over and try another server, so that one lying member cannot stall
// the reader. The caller checks what it returns again.
type ChunkFetcher func(ctx context.Context, name string, off, n int64, check func([]byte) error) ([]byte, error)

// PackedSource is a packed dataset as a TokenSource: each split is the
// concatenation of its shards' tokens in the dataset's order. Tokens are
// read chunk by chunk; every chunk is checked against its shard's header
// (its SHA-256 and its vocabulary) before it is used, and the header
// against the shard's name.
//
// Chunks come from a local dataset directory (OpenPackedDir: the
// operator's, or skein train's), or from a cache directory filled on
// demand by a ChunkFetcher (OpenPackedCache: a volunteer fetches only the
// chunks it reads, and Prefetch fetches ahead). A PackedSource is safe for
// concurrent use.
type PackedSource struct {
	ds     *Dataset
	splits [2][]packedShard
	dir    string // the dataset or cache directory
	local  bool   // dir holds whole shards (a packed dataset)
	fetch  ChunkFetcher
	ctx    context.Context

	mu      sync.Mutex
	headers map[string]*TokenShardHeader
	hot     map[chunkID][]byte // recently used chunks, verified
	order   []chunkID          // hot's insertion order, for eviction
	pending map[chunkID]*sync.WaitGroup
	fetched int64 // bytes fetched over the network
}

type packedShard struct {
	DatasetShard
	first int64 // the shard's first token in its split
}

type chunkID struct {
	name string
	k    int
}

// hotChunks bounds the verified chunks kept in memory.
const hotChunks = 64

// OpenPackedDir opens the packed dataset in dir (ReadDataset) as a source.
func OpenPackedDir(dir string) (*PackedSource, error) {
	ds, err := ReadDataset(dir)
	if err != nil {
		return nil, err
	}
	s := newPacked(ds, dir)
	s.local = true
	return s, nil
}

// OpenPackedCache returns a source over ds whose chunks are kept in the
// cache directory dir (created if needed) and fetched with fetch when
// missing. ctx bounds every fetch.
func OpenPackedCache(ctx context.Context, ds *Dataset, dir string, fetch ChunkFetcher) (*PackedSource, error) {
	if err := ds.Check(); err != nil {
		return nil, err
	}
	if fetch == nil {
		return nil, fmt.Errorf("data: OpenPackedCache without a fetcher: %w", ErrInvalidConfig)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data: chunk cache: %w", err)
	}
	if _, err := atomicfile.RemoveStale(dir, atomicfile.ProcessStart()); err != nil {
		return nil, fmt.Errorf("data: chunk cache: %w", err)
	}
	s := newPacked(ds, dir)
	s.fetch, s.ctx = fetch, ctx
	return s, nil
}

func newPacked(ds *Dataset, dir string) *PackedSource {
	s := &PackedSource{ds: ds, dir: dir, ctx: context.Background(), headers: map[string]*TokenShardHeader{},
		hot: map[chunkID][]byte{}, pending: map[chunkID]*sync.WaitGroup{}}
	for _, sp := range []Split{Train, Validation} {
		var first int64
		for _, sh := range ds.Shards(sp) {
			s.splits[sp] = append(s.splits[sp], packedShard{DatasetShard: sh, first: first})
			first += sh.Tokens
		}
	}
	return s
}

// Dataset is the source's index.
func (s *PackedSource) Dataset() *Dataset { return s.ds }

// Tokens is the length of split sp's stream.
func (s *PackedSource) Tokens(sp Split) int64 {
	if sp != Train && sp != Validation {
		return 0
	}
	return s.ds.SplitTokens(sp)
}

// FetchedBytes is how many bytes the source has fetched over the network.
func (s *PackedSource) FetchedBytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetched
}

// ReadTokens fills dst with split sp's tokens from off on, fetching the
// chunks it needs that are not cached.
func (s *PackedSource) ReadTokens(sp Split, dst []int32, off int64) error {
	if sp != Train && sp != Validation || off < 0 || off+int64(len(dst)) > s.Tokens(sp) {
		return fmt.Errorf("data: %d tokens at %d of the %v split's %d: %w", len(dst), off, sp, s.Tokens(sp), ErrInvalidConfig)
	}
	for len(dst) > 0 {
		sh, h, k, at, err := s.locate(sp, off)
		if err != nil {
			return err
		}
		b, err := s.chunk(sh, h, k)
		if err != nil {
			return err
		}
		first, cnt := h.Chunk(k)
		n := min(len(dst), cnt-int(at-first))
		decodeTokens(dst[:n], b[int(at-first)*h.Width:], h.Width)
		dst, off = dst[n:], off+int64(n)
	}
	return nil
}

// locate finds the shard, its header, the chunk and the token within the
// shard of split position off.
func (s *PackedSource) locate(sp Split, off int64) (packedShard, *TokenShardHeader, int, int64, error) {
	shards := s.splits[sp]
	i := sort.Search(len(shards), func(i int) bool { return shards[i].first+shards[i].Tokens > off })
	sh := shards[i]
	h, err := s.header(sh.DatasetShard)
	if err != nil {
		return sh, nil, 0, 0, err
	}
	at := off - sh.first
	return sh, h, int(at / int64(h.ChunkTokens)), at, nil
}

// chunksOf returns the chunks of split sp that hold tokens [off, off+n), as
// (shard name, chunk) pairs, for Prefetch.
func (s *PackedSource) chunksOf(sp Split, off, n int64) ([]chunkID, error) {
	var out []chunkID
	end := min(off+n, s.Tokens(sp))
	for off < end {
		sh, h, k, _, err := s.locate(sp, off)
		if err != nil {
			return nil, err
		}
		out = append(out, chunkID{sh.Name, k})
		first, cnt := h.Chunk(k)
		off = sh.first + first + int64(cnt)
	}
	return out, nil
}

// Prefetch makes the chunks holding split sp's tokens [off, off+n) local
// (fetching those that are missing), without keeping them in memory.
func (s *PackedSource) Prefetch(sp Split, off, n int64) error {
	ids, err := s.chunksOf(sp, off, n)
	if err != nil {
		return err
	}
	for _, id := range ids {
		sh := s.shardNamed(sp, id.name)
		h, err := s.header(sh)
		if err != nil {
			return err
		}
		if _, err := s.load(sh, h, id.k, false); err != nil {
			return err
		}
	}
	return nil
}

func (s *PackedSource) shardNamed(sp Split, name string) DatasetShard {
	for _, sh := range s.splits[sp] {
		if sh.Name == name {
			return sh.DatasetShard
		}
	}
	return DatasetShard{}
}

// header returns the checked header of shard sh.
func (s *PackedSource) header(sh DatasetShard) (*TokenShardHeader, error) {
	s.mu.Lock()
	h, ok := s.headers[sh.Name]
	s.mu.Unlock()
	if ok {
		return h, nil
	}
	var err error
	if s.local {
		h, err = s.localHeader(sh)
	} else {
		h, err = s.cachedHeader(sh)
	}
	if err != nil {
		return nil, err
	}
	if h.Tokens != sh.Tokens || h.ShardBytes() != sh.Bytes || h.Vocab != s.ds.Vocab || hex.EncodeToString(h.VocabHash[:]) != s.ds.TokenizerHash {
		return nil, fmt.Errorf("data: token shard %s disagrees with the dataset's index: %w", sh.Name, ErrShardFormat)
	}
	s.mu.Lock()
	s.headers[sh.Name] = h
	s.mu.Unlock()
	return h, nil
}

func (s *PackedSource) localHeader(sh DatasetShard) (*TokenShardHeader, error) {
	f, err := os.Open(TokenShardPath(s.dir, sh.Name))
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	return ReadTokenShardHeader(f, sh.Bytes, sh.Name)
}

// cachedHeader reads the header from the cache, or fetches it.
func (s *PackedSource) cachedHeader(sh DatasetShard) (*TokenShardHeader, error) {
	path := filepath.Join(s.dir, sh.Name+".header")
	if b, err := readBounded(path, MaxShardBytes); err == nil {
		if h, err := parseNamedHeader(b, sh); err == nil {
			return h, nil
		}
		os.Remove(path)
	}
	// The header's length follows from the index: the shard's bytes less
	// its tokens'. Nothing about it is taken from a server.
	n := sh.Bytes - int64(tokenWidth(s.ds.Vocab))*sh.Tokens
	if n < tokenHeaderFixed {
		return nil, fmt.Errorf("data: token shard %s: %d bytes cannot hold %d tokens and a header: %w", sh.Name, sh.Bytes, sh.Tokens, ErrShardFormat)
	}
	b, err := s.fetch(s.ctx, sh.Name, 0, n, func(b []byte) error { _, err := parseNamedHeader(b, sh); return err })
	if err != nil {
		return nil, fmt.Errorf("data: fetching the header of shard %s: %w", sh.Name, err)
	}
	h, err := parseNamedHeader(b, sh)
	if err != nil {
		return nil, err
	}
	s.addFetched(int64(len(b)))
	if err := atomicfile.WriteFile(path, b, 0o644); err != nil {
		return nil, err
	}
	return h, nil
}

// parseNamedHeader parses b as the whole header of shard sh, which must
// hash to its name.
func parseNamedHeader(b []byte, sh DatasetShard) (*TokenShardHeader, error) {
	n, err := TokenHeaderSize(b)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != n {
		return nil, fmt.Errorf("data: header of shard %s: %d bytes, want %d: %w", sh.Name, len(b), n, ErrShardCorrupt)
	}
	sum := sha256.Sum256(b)
	if hex.EncodeToString(sum[:]) != sh.Name {
		return nil, fmt.Errorf("data: header of shard %s does not hash to its name: %w", sh.Name, ErrShardCorrupt)
	}
	return ParseTokenShardHeader(b)
}

func (s *PackedSource) addFetched(n int64) {
	s.mu.Lock()
	s.fetched += n
	s.mu.Unlock()
}

// chunk returns chunk k of shard sh, verified, from memory, disk or the
// network.
func (s *PackedSource) chunk(sh packedShard, h *TokenShardHeader, k int) ([]byte, error) {
	return s.load(sh.DatasetShard, h, k, true)
}

// load makes chunk k of sh available; keep puts it among the hot chunks
// (and returns it).
func (s *PackedSource) load(sh DatasetShard, h *TokenShardHeader, k int, keep bool) ([]byte, error) {
	id := chunkID{sh.Name, k}
	for {
		s.mu.Lock()
		if b, ok := s.hot[id]; ok {
			s.mu.Unlock()
			return b, nil
		}
		wg, busy := s.pending[id]
		if !busy {
			wg = &sync.WaitGroup{}
			wg.Add(1)
			s.pending[id] = wg
			s.mu.Unlock()
			break
		}
		s.mu.Unlock()
		wg.Wait() // another reader is loading it
		if !keep {
			return nil, nil
		}
	}
	b, err := s.loadSlow(sh, h, k)
	s.mu.Lock()
	wg := s.pending[id]
	delete(s.pending, id)
	if err == nil && keep {
		if len(s.order) >= hotChunks {
			delete(s.hot, s.order[0])
			s.order = s.order[1:]
		}
		s.hot[id] = b
		s.order = append(s.order, id)
	}
	s.mu.Unlock()
	wg.Done()
	return b, err
}

// loadSlow reads chunk k from the dataset or the cache, or fetches it, and
// checks it.
func (s *PackedSource) loadSlow(sh DatasetShard, h *TokenShardHeader, k int) ([]byte, error) {
	off, n := h.ChunkRange(k)
	if s.local {
		f, err := os.Open(TokenShardPath(s.dir, sh.Name))
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		defer f.Close()
		b := make([]byte, n)
		if _, err := f.ReadAt(b, off); err != nil {
			return nil, shardReadErr("token chunk", err)
		}
		if err := h.CheckChunk(k, b); err != nil {
			return nil, fmt.Errorf("data: %s: %w", f.Name(), err)
		}
		return b, nil
	}
	path := s.chunkPath(sh.Name, k)
	if b, err := readBounded(path, n); err == nil {
		if h.CheckChunk(k, b) == nil {
			return b, nil
		}
		os.Remove(path) // corrupt on disk: fetch it again
	}
	var lastErr error
	for try := 0; try < 3; try++ {
		b, err := s.fetch(s.ctx, sh.Name, off, n, func(b []byte) error { return h.CheckChunk(k, b) })
		if err != nil {
			lastErr = err
			if s.ctx.Err() != nil {
				return nil, s.ctx.Err()
			}
			continue
		}
		s.addFetched(int64(len(b)))
		if err := h.CheckChunk(k, b); err != nil {
			lastErr = err
			continue
		}
		if err := atomicfile.WriteFile(path, b, 0o644); err != nil {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("data: fetching chunk %d of shard %s: %w", k, sh.Name, lastErr)
}

// ReaderAt serves the token shard called name as a run member does: the
// whole shard from a packed dataset, or, from a cache, the header and the
// chunks this member holds (a read touching a missing chunk fails, so the
// asker tries another member). It returns the shard's size.
func (s *PackedSource) ReaderAt(name string) (io.ReaderAt, int64, error) {
	var sh DatasetShard
	for _, sp := range []Split{Train, Validation} {
		if x := s.shardNamed(sp, name); x.Name != "" {
			sh = x
		}
	}
	if sh.Name == "" {
		return nil, 0, fmt.Errorf("data: no token shard %s in this dataset: %w", name, ErrShardMissing)
	}
	h, err := s.header(sh)
	if err != nil {
		return nil, 0, err
	}
	return &shardReader{s: s, sh: sh, h: h, hdr: h.Marshal()}, sh.Bytes, nil
}

type shardReader struct {
	s   *PackedSource
	sh  DatasetShard
	h   *TokenShardHeader
	hdr []byte
}

func (r *shardReader) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for len(p) > 0 {
		if off >= r.sh.Bytes {
			return n, io.EOF
		}
		var src []byte
		var base int64
		if off < int64(len(r.hdr)) {
			src, base = r.hdr, 0
		} else {
			k := int((off - int64(len(r.hdr))) / int64(r.h.Width) / int64(r.h.ChunkTokens))
			b, err := r.s.served(r.sh, r.h, k)
			if err != nil {
				return n, err
			}
			src, base = b, int64(len(r.hdr))+int64(k)*int64(r.h.ChunkTokens)*int64(r.h.Width)
		}
		c := copy(p, src[off-base:])
		p, off, n = p[c:], off+int64(c), n+c
	}
	return n, nil
}

// served returns chunk k for serving: read and checked, never fetched.
// A served chunk is kept among the hot ones, so a transfer that reads it
// in pieces reads and hashes it once.
func (s *PackedSource) served(sh DatasetShard, h *TokenShardHeader, k int) ([]byte, error) {
	if !s.local {
		_, n := h.ChunkRange(k)
		if fi, err := os.Stat(s.chunkPath(sh.Name, k)); err != nil || fi.Size() != n {
			return nil, fmt.Errorf("data: chunk %d of shard %s is not here: %w", k, sh.Name, ErrShardMissing)
		}
	}
	return s.load(sh, h, k, true) // from memory or disk (fetched only to replace a chunk corrupt on disk)
}

// chunkPath is where the cache keeps chunk k of the shard called name.
func (s *PackedSource) chunkPath(name string, k int) string {
	return filepath.Join(s.dir, fmt.Sprintf("%s.%d", name, k))
}

// Verify reads and checks every chunk of every shard the source can reach
// (for a cache: fetching the missing ones).
func (s *PackedSource) Verify(ctx context.Context) error {
	for _, sp := range []Split{Train, Validation} {
		for _, sh := range s.splits[sp] {
			h, err := s.header(sh.DatasetShard)
			if err != nil {
				return err
			}
			for k := range h.Chunks {
				if err := ctx.Err(); err != nil {
					return err
				}
				if _, err := s.loadSlow(sh.DatasetShard, h, k); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
