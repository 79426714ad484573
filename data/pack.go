package data

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/skein-ml/skein/internal/atomicfile"
)

// PackShards writes every file of c (both splits) into shards in dir and
// returns them in order, the list a run manifest carries. dir is created if
// needed; each shard is written atomically as dir/<hash>.shard, so dir can
// serve as a ShardStore. targetBytes is the size a shard is filled up to,
// header included: 0 means DefaultShardBytes, at most MaxShardBytes.
//
// The result is a pure function of the corpus's keys, sizes and contents and
// of targetBytes: files go in corpus order (sorted by key), each shard takes
// files while its size stays within targetBytes or it has MaxShardFiles, a
// file is never split, and a file larger than the target gets a shard of its
// own. Packing the same corpus on any machine gives the same hashes.
//
// It fails with ErrShardFormat naming the file if a key is not ValidKey or a
// file cannot fit in MaxShardBytes, and with ErrCorpusChanged if a file is
// shorter than when c indexed it.
func PackShards(c *Corpus, dir string, targetBytes int64) ([]ShardInfo, error) {
	if c == nil {
		return nil, fmt.Errorf("data: PackShards with a nil corpus: %w", ErrInvalidConfig)
	}
	if targetBytes == 0 {
		targetBytes = DefaultShardBytes
	}
	if targetBytes < 0 || targetBytes > MaxShardBytes {
		return nil, fmt.Errorf("data: PackShards target %d bytes out of range [1, %d]: %w", targetBytes, MaxShardBytes, ErrInvalidConfig)
	}
	for _, f := range c.files {
		if !ValidKey(f.Rel) {
			return nil, fmt.Errorf("data: file %s: key %q cannot name a file in a shard: %w", f.Path, f.Rel, ErrShardFormat)
		}
		if n := int64(shardFixedHeader+shardEntryFixed+len(f.Rel)) + f.Size; n > MaxShardBytes {
			return nil, fmt.Errorf("data: file %s: %d bytes, a shard holding it would exceed %d: %w", f.Path, f.Size, int64(MaxShardBytes), ErrShardFormat)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data: shard directory: %w", err)
	}
	p := packer{dir: dir}
	var shards []ShardInfo
	start, size := 0, int64(shardFixedHeader)
	for i, f := range c.files {
		need := int64(shardEntryFixed+len(f.Rel)) + f.Size
		if i > start && (size+need > targetBytes || i-start == MaxShardFiles) {
			info, err := p.write(c.files[start:i])
			if err != nil {
				return nil, err
			}
			shards = append(shards, info)
			start, size = i, int64(shardFixedHeader)
		}
		size += need
	}
	info, err := p.write(c.files[start:])
	if err != nil {
		return nil, err
	}
	return append(shards, info), nil
}

// packer writes shards into dir.
type packer struct {
	dir string
}

// write packs files, whose keys and sizes are checked, into one shard.
func (p *packer) write(files []File) (ShardInfo, error) {
	keys := make([]string, len(files))
	sizes := make([]int64, len(files))
	var total int64
	for i, f := range files {
		keys[i], sizes[i] = f.Rel, f.Size
		total += f.Size
	}
	total += shardHeaderSize(keys)

	a, err := atomicfile.Create(p.dir, "pack-")
	if err != nil {
		return ShardInfo{}, err
	}
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(a, h), 1<<20)
	if _, err := w.Write(appendShardHeader(nil, keys, sizes)); err != nil {
		a.Discard()
		return ShardInfo{}, fmt.Errorf("data: writing shard header in %s: %w", p.dir, err)
	}
	for _, f := range files {
		if err := p.copyFile(w, f); err != nil {
			a.Discard()
			return ShardInfo{}, err
		}
	}
	if err := w.Flush(); err != nil {
		a.Discard()
		return ShardInfo{}, fmt.Errorf("data: writing shard in %s: %w", p.dir, err)
	}
	info := ShardInfo{Hash: hashString(h.Sum(nil)), Bytes: total, Files: len(files)}
	if err := a.Install(info.Hash+shardExt, 0o644); err != nil {
		return ShardInfo{}, err
	}
	return info, nil
}

// copyFile appends exactly f.Size bytes of f to w.
func (p *packer) copyFile(w io.Writer, f File) error {
	src, err := os.Open(f.Path)
	if err != nil {
		return fmt.Errorf("data: packing %s: %w", f.Path, err)
	}
	defer src.Close()
	n, err := io.Copy(w, io.NewSectionReader(src, f.Offset, f.Size))
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("data: packing %s: %w", f.Path, err)
	}
	if n != f.Size {
		return fmt.Errorf("data: packing %s: read %d of its indexed %d bytes at offset %d: %w", f.Path, n, f.Size, f.Offset, ErrCorpusChanged)
	}
	return nil
}
