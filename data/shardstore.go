package data

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/skein-ml/skein/internal/atomicfile"
)

// File name extensions inside a ShardStore directory.
const (
	shardExt  = ".shard" // an installed, complete shard
	partExt   = ".part"  // a download in progress
	recordExt = ".have"  // the confirmed prefix of a .part file

	partMagic  = "SKPART1\n"
	recordSize = len(partMagic) + 8 + 8 // magic, shard size, confirmed prefix
)

// ShardStore keeps shards in one directory (by convention a volunteer's
// data directory + "/shards"):
//
//	<hash>.shard  an installed shard, exactly the bytes named by <hash>
//	<hash>.part   a download in progress, written at the shard's offsets
//	<hash>.have   the part's confirmed prefix (see PartialShard)
//	.*.tmp        temporary files, removed when the store is opened
//
// A store directory belongs to one process at a time. A ShardStore is safe
// for concurrent use.
//
// Hashing policy: a shard's SHA-256 is checked the first time this process
// uses it (Has, Open, OpenShards, Download) and again whenever its size or
// modification time changes; Verify always hashes. A shard that fails is
// deleted (Has reports false, the others ErrShardCorrupt), so corrupt bytes
// are never used or served and the next Download fetches them again. For the
// default corpus (about 90 MB) the first check costs well under a second.
type ShardStore struct {
	dir string

	mu       sync.Mutex
	verified map[string]fileStamp // hash -> stamp of the file when it hashed right
	busy     map[string]bool      // hashes with an open PartialShard
}

// fileStamp identifies one version of a file cheaply.
type fileStamp struct {
	size int64
	mod  time.Time
}

func stampOf(fi fs.FileInfo) fileStamp { return fileStamp{fi.Size(), fi.ModTime()} }

// OpenShardStore opens the store in dir, creating the directory if needed
// and removing temporary files a crash left behind.
func OpenShardStore(dir string) (*ShardStore, error) {
	if dir == "" {
		return nil, fmt.Errorf("data: OpenShardStore with an empty directory: %w", ErrInvalidConfig)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data: shard store: %w", err)
	}
	if _, err := atomicfile.RemoveStale(dir, atomicfile.ProcessStart()); err != nil {
		return nil, fmt.Errorf("data: shard store: %w", err)
	}
	return &ShardStore{dir: dir, verified: make(map[string]fileStamp), busy: make(map[string]bool)}, nil
}

// Dir returns the store's directory.
func (s *ShardStore) Dir() string { return s.dir }

// Path returns where the shard with this hash is installed, or "" if hash is
// not 64 lowercase hex digits.
func (s *ShardStore) Path(hash string) string {
	if !validHash(hash) {
		return ""
	}
	return filepath.Join(s.dir, hash+shardExt)
}

// Has reports whether the shard is installed, info.Bytes long and hashing to
// info.Hash; see the store's hashing policy. A corrupt copy is deleted.
func (s *ShardStore) Has(info ShardInfo) bool {
	return s.verifyOnce(info) == nil
}

// Verify hashes the installed shard. It returns an error wrapping
// ErrShardMissing if the shard is not installed, one wrapping ErrShardCorrupt,
// after deleting the file, if its bytes do not hash to info.Hash, and one
// wrapping ErrShardFormat if they do but info.Bytes is not their size.
func (s *ShardStore) Verify(info ShardInfo) error {
	if err := info.Validate(); err != nil {
		return err
	}
	return s.verify(info, true)
}

// verifyOnce is Verify, skipped when this process already hashed the same
// version of the file.
func (s *ShardStore) verifyOnce(info ShardInfo) error {
	if err := info.Validate(); err != nil {
		return err
	}
	return s.verify(info, false)
}

func (s *ShardStore) verify(info ShardInfo, always bool) error {
	path := s.Path(info.Hash)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("data: shard %s: %w", info.Hash, ErrShardMissing)
	}
	if err != nil {
		return fmt.Errorf("data: shard %s: %w", info.Hash, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("data: shard %s: %w", info.Hash, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("data: shard %s: %s is not a regular file: %w", info.Hash, path, ErrShardMissing)
	}
	stamp := stampOf(fi)
	s.mu.Lock()
	known, ok := s.verified[info.Hash]
	s.mu.Unlock()
	if !always && ok && known == stamp && stamp.size == info.Bytes {
		return nil
	}
	if err := checkShard(f, info); err != nil {
		s.forget(info.Hash)
		if errors.Is(err, ErrShardCorrupt) {
			os.Remove(path)
		}
		return err
	}
	s.remember(info.Hash, stamp)
	return nil
}

func (s *ShardStore) remember(hash string, st fileStamp) {
	s.mu.Lock()
	s.verified[hash] = st
	s.mu.Unlock()
}

func (s *ShardStore) forget(hash string) {
	s.mu.Lock()
	delete(s.verified, hash)
	s.mu.Unlock()
}

// checkShard hashes all of f. It reports an error wrapping ErrShardCorrupt
// if the bytes do not hash to info.Hash (or exceed MaxShardBytes), and one
// wrapping ErrShardFormat if they do but their size is not info.Bytes: then
// the file is sound and info is wrong.
func checkShard(f *os.File, info ShardInfo) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("data: shard %s: %w", info.Hash, err)
	}
	size := fi.Size()
	if size > MaxShardBytes {
		return fmt.Errorf("data: shard %s: %d bytes on disk, limit %d: %w", info.Hash, size, int64(MaxShardBytes), ErrShardCorrupt)
	}
	h := sha256.New()
	n, err := io.Copy(h, io.NewSectionReader(f, 0, size))
	if err != nil {
		return fmt.Errorf("data: hashing shard %s: %w", info.Hash, err)
	}
	if got := hashString(h.Sum(nil)); n != size || got != info.Hash {
		return fmt.Errorf("data: shard %s: its %d bytes hash to %s: %w", info.Hash, n, got, ErrShardCorrupt)
	}
	if size != info.Bytes {
		return fmt.Errorf("data: shard %s is %d bytes, its ShardInfo says %d: %w", info.Hash, size, info.Bytes, ErrShardFormat)
	}
	return nil
}

// Open opens the installed shard with this hash for serving (the
// bulk-transfer source for ShardKey(hash)) and returns it with its size. It
// hashes the shard the first time this process serves or reads that
// version of it, so a corrupt copy is deleted rather than served.
func (s *ShardStore) Open(hash string) (*os.File, int64, error) {
	if !validHash(hash) {
		return nil, 0, fmt.Errorf("data: shard hash %q is not 64 lowercase hex digits: %w", hash, ErrShardFormat)
	}
	fi, err := os.Stat(s.Path(hash))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, fmt.Errorf("data: shard %s: %w", hash, ErrShardMissing)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("data: shard %s: %w", hash, err)
	}
	// The file count is not known here; 1 passes Validate for any size a
	// shard can have.
	if err := s.verifyOnce(ShardInfo{Hash: hash, Bytes: fi.Size(), Files: 1}); err != nil {
		return nil, 0, err
	}
	f, err := os.Open(s.Path(hash))
	if err != nil {
		return nil, 0, fmt.Errorf("data: shard %s: %w", hash, err)
	}
	return f, fi.Size(), nil
}

// PartialShard is a resumable download of one shard into the store, as
// <hash>.part. The fetcher writes the shard's bytes at their offsets with
// WriteAt, in any order and from several goroutines at once (disjoint
// ranges), then calls Confirm with the length of the contiguous prefix it
// knows is complete. Have is only ever what Confirm recorded: Confirm
// fsyncs the part file and then atomically rewrites <hash>.have, so after a
// crash or restart Partial resumes at a prefix whose bytes are durable, and
// bytes written past it (an out-of-order chunk, a hole) are simply fetched
// again. Commit hashes the whole file, so garbage anywhere, confirmed or not,
// is caught before the shard is installed.
//
// WriteAt may run concurrently with other WriteAt calls only; Confirm,
// Commit, Discard and Close must not overlap any other call.
type PartialShard struct {
	s    *ShardStore
	info ShardInfo
	f    *os.File
	have int64
	done bool // committed, discarded or closed
}

// Partial opens (creating it if needed) the download of the shard info
// describes. It fails with ErrShardFormat for an invalid info (before
// creating any file, so a Bytes beyond MaxShardBytes is refused) and with
// ErrShardBusy if a PartialShard of the same shard is already open in this
// store. Close or Commit it when done.
func (s *ShardStore) Partial(info ShardInfo) (*PartialShard, error) {
	if err := info.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.busy[info.Hash] {
		s.mu.Unlock()
		return nil, fmt.Errorf("data: shard %s: %w", info.Hash, ErrShardBusy)
	}
	s.busy[info.Hash] = true
	s.mu.Unlock()

	p := &PartialShard{s: s, info: info}
	f, err := os.OpenFile(p.path(partExt), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		p.release()
		return nil, fmt.Errorf("data: shard %s: opening download: %w", info.Hash, err)
	}
	p.f = f
	fi, err := f.Stat()
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("data: shard %s: %w", info.Hash, err)
	}
	if fi.Size() > info.Bytes {
		// Not written by a PartialShard of this size: start over.
		if err := f.Truncate(0); err != nil {
			p.Close()
			return nil, fmt.Errorf("data: shard %s: truncating download: %w", info.Hash, err)
		}
		os.Remove(p.path(recordExt))
		fi = nil
	}
	if fi != nil {
		p.have = min(readPartRecord(p.path(recordExt), info.Bytes), fi.Size())
	}
	return p, nil
}

func (p *PartialShard) path(ext string) string {
	return filepath.Join(p.s.dir, p.info.Hash+ext)
}

// readPartRecord returns the confirmed prefix in the record at path, or 0 if
// there is none or it does not belong to a shard of size bytes.
func readPartRecord(path string, size int64) int64 {
	b, err := os.ReadFile(path)
	if err != nil || len(b) != recordSize || string(b[:len(partMagic)]) != partMagic {
		return 0
	}
	recSize := int64(binary.LittleEndian.Uint64(b[len(partMagic):]))
	have := int64(binary.LittleEndian.Uint64(b[len(partMagic)+8:]))
	if recSize != size || have < 0 || have > size {
		return 0
	}
	return have
}

// Info returns the shard being downloaded.
func (p *PartialShard) Info() ShardInfo { return p.info }

// Have returns the length of the confirmed prefix: fetch from this offset.
func (p *PartialShard) Have() int64 { return p.have }

// WriteAt writes b at offset off of the shard. Writing outside [0,
// info.Bytes) is an error.
func (p *PartialShard) WriteAt(b []byte, off int64) (int, error) {
	if off < 0 || off > p.info.Bytes || int64(len(b)) > p.info.Bytes-off {
		return 0, fmt.Errorf("data: shard %s: write of %d bytes at offset %d outside its %d bytes", p.info.Hash, len(b), off, p.info.Bytes)
	}
	return p.f.WriteAt(b, off)
}

// Confirm records that bytes [0, prefix) of the shard are written. It
// fsyncs the part file before recording, so a recorded prefix survives a
// crash. A prefix at or below Have is a no-op; one beyond the shard's size
// is an error.
func (p *PartialShard) Confirm(prefix int64) error {
	if p.done {
		return fmt.Errorf("data: shard %s: Confirm after Commit or Close: %w", p.info.Hash, os.ErrClosed)
	}
	if prefix < 0 || prefix > p.info.Bytes {
		return fmt.Errorf("data: shard %s: confirmed prefix %d out of range [0, %d]", p.info.Hash, prefix, p.info.Bytes)
	}
	if prefix <= p.have {
		return nil
	}
	if err := p.f.Sync(); err != nil {
		return fmt.Errorf("data: shard %s: syncing download: %w", p.info.Hash, err)
	}
	rec := make([]byte, 0, recordSize)
	rec = append(rec, partMagic...)
	rec = binary.LittleEndian.AppendUint64(rec, uint64(p.info.Bytes))
	rec = binary.LittleEndian.AppendUint64(rec, uint64(prefix))
	if err := atomicfile.WriteFile(filepath.Join(p.s.dir, p.info.Hash+recordExt), rec, 0o644); err != nil {
		return err
	}
	p.have = prefix
	return nil
}

// Commit checks the downloaded shard and installs it as <hash>.shard. It
// fails with ErrShardIncomplete, keeping the download, if Have is below the
// shard's size. If the bytes do not hash to the shard's name it deletes the
// download and fails with ErrShardCorrupt: fetch the shard again, preferably
// from another member. The PartialShard is finished either way, except after
// ErrShardIncomplete.
func (p *PartialShard) Commit() error {
	if p.done {
		return fmt.Errorf("data: shard %s: Commit after Commit or Close: %w", p.info.Hash, os.ErrClosed)
	}
	if p.have < p.info.Bytes {
		return fmt.Errorf("data: shard %s: %d of %d bytes confirmed: %w", p.info.Hash, p.have, p.info.Bytes, ErrShardIncomplete)
	}
	if err := checkShard(p.f, p.info); err != nil {
		if errors.Is(err, ErrShardCorrupt) || errors.Is(err, ErrShardFormat) {
			p.Discard()
		}
		return err
	}
	err := p.f.Sync()
	if cerr := p.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(p.path(partExt), p.path(shardExt))
	}
	if err == nil {
		err = atomicfile.SyncDir(p.s.dir)
	}
	if err != nil {
		p.done = true
		p.release()
		return fmt.Errorf("data: shard %s: installing: %w", p.info.Hash, err)
	}
	os.Remove(p.path(recordExt))
	if fi, err := os.Stat(p.path(shardExt)); err == nil {
		p.s.remember(p.info.Hash, stampOf(fi))
	}
	p.done = true
	p.release()
	return nil
}

// Discard deletes the download and finishes the PartialShard.
func (p *PartialShard) Discard() error {
	if !p.done {
		p.f.Close()
	}
	err := os.Remove(p.path(partExt))
	os.Remove(p.path(recordExt))
	if !p.done {
		p.done = true
		p.release()
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("data: shard %s: deleting download: %w", p.info.Hash, err)
	}
	return nil
}

// Close finishes the PartialShard and keeps the download for a later
// Partial to resume from Have. It is a no-op after Commit or Discard.
func (p *PartialShard) Close() error {
	if p.done {
		return nil
	}
	p.done = true
	defer p.release()
	if err := p.f.Close(); err != nil {
		return fmt.Errorf("data: shard %s: closing download: %w", p.info.Hash, err)
	}
	return nil
}

func (p *PartialShard) release() {
	p.s.mu.Lock()
	delete(p.s.busy, p.info.Hash)
	p.s.mu.Unlock()
}

// ShardFetcher fetches bytes [off, off+n) of the bulk-transfer key into w at
// the same offsets, possibly out of order, and returns the length of the
// contiguous prefix written from off, also on error (the contract of
// p2p.Node.Fetch with FetchOptions{Offset: off, Length: n}).
type ShardFetcher func(ctx context.Context, key string, w io.WriterAt, off, n int64) (int64, error)

// Download makes the shard info describes installed, fetching what is
// missing with one call of fetch: it returns at once if the shard is
// installed (Has), else resumes the download at Have, confirms
// the prefix fetch reports and commits. A failed fetch keeps the confirmed
// prefix for the next attempt (from any member); ErrShardCorrupt means the
// download was deleted and must restart from another member. Download does
// not retry: the caller picks members and owns retries.
func (s *ShardStore) Download(ctx context.Context, info ShardInfo, fetch ShardFetcher) error {
	if s.Has(info) {
		return nil
	}
	p, err := s.Partial(info)
	if err != nil {
		return err
	}
	defer p.Close()
	if s.Has(info) { // installed by another download meanwhile
		return p.Discard()
	}
	if have := p.Have(); have < info.Bytes {
		n, ferr := fetch(ctx, ShardKey(info.Hash), p, have, info.Bytes-have)
		n = max(0, min(n, info.Bytes-have))
		if err := p.Confirm(have + n); err != nil {
			return err
		}
		if ferr != nil {
			return fmt.Errorf("data: shard %s: fetched %d of %d bytes: %w", info.Hash, have+n, info.Bytes, ferr)
		}
		if have+n < info.Bytes {
			return fmt.Errorf("data: shard %s: fetch stopped at %d of %d bytes: %w", info.Hash, have+n, info.Bytes, io.ErrUnexpectedEOF)
		}
	}
	return p.Commit()
}
