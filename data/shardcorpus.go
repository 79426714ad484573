package data

import (
	"fmt"
	"os"
)

// ShardCorpusConfig shapes a corpus opened from shards. Its fields mean what
// they mean in CorpusConfig; the shards take the place of Paths and Filter.
type ShardCorpusConfig struct {
	// ValFraction is the fraction of files held out for validation, in
	// [0, 1); 0 means DefaultValFraction. Use the run's value: the split
	// equals that of the packed corpus opened with the same ValFraction.
	ValFraction float64
	// MaxOpenFiles bounds the shards the corpus keeps open; 0 means
	// DefaultMaxOpenFiles.
	MaxOpenFiles int
}

// OpenShards opens the corpus made of the files inside shards, in the order
// PackShards returned them (a run manifest's order), all installed in store.
// Each shard is hashed the first time this process opens it (see
// ShardStore), and its index must list info.Files files.
//
// The result trains exactly like the corpus that was packed, opened with the
// same ValFraction: the same files under the same keys in the same order,
// hence the same Train/Validation split, the same split streams byte for
// byte, the same Fingerprint (it covers keys, sizes and splits, not paths)
// and the same Loader batches. Only File.Path (the shard) and File.Offset
// differ.
//
// It fails with ErrShardMissing or ErrShardCorrupt (the shard is deleted) for
// a shard to fetch again, with ErrShardFormat if a shard is malformed, its
// file count differs from info.Files, a shard is listed twice or the keys
// are out of order across shards, with ErrEmptyCorpus for no shards and
// ErrInvalidConfig for a bad cfg.
func OpenShards(store *ShardStore, shards []ShardInfo, cfg ShardCorpusConfig) (*Corpus, error) {
	if store == nil {
		return nil, fmt.Errorf("data: OpenShards with a nil store: %w", ErrInvalidConfig)
	}
	valFraction, maxOpen, err := indexOptions("ShardCorpusConfig", cfg.ValFraction, cfg.MaxOpenFiles)
	if err != nil {
		return nil, err
	}
	if len(shards) == 0 {
		return nil, fmt.Errorf("data: OpenShards with no shards: %w", ErrEmptyCorpus)
	}
	seen := make(map[string]bool, len(shards))
	var files []File
	prev := ""
	for i, info := range shards {
		if err := info.Validate(); err != nil {
			return nil, fmt.Errorf("data: shard %d of %d: %w", i, len(shards), err)
		}
		if seen[info.Hash] {
			return nil, fmt.Errorf("data: shard %s is listed twice: %w", info.Hash, ErrShardFormat)
		}
		seen[info.Hash] = true
		idx, err := store.shardIndex(info)
		if err != nil {
			return nil, err
		}
		path := store.Path(info.Hash)
		for _, sf := range idx.Files {
			if sf.Key < prev {
				return nil, fmt.Errorf("data: shard %s (number %d): key %q sorts before the previous shard's %q; list shards in packing order: %w", info.Hash, i, sf.Key, prev, ErrShardFormat)
			}
			prev = sf.Key
			files = append(files, File{Path: path, Rel: sf.Key, Size: sf.Size, Offset: sf.Offset})
		}
	}
	return newCorpus(files, valFraction, maxOpen), nil
}

// shardIndex verifies the installed shard (once per process) and reads its
// index, which must list info.Files files.
func (s *ShardStore) shardIndex(info ShardInfo) (ShardIndex, error) {
	if err := s.verifyOnce(info); err != nil {
		return ShardIndex{}, err
	}
	f, err := os.Open(s.Path(info.Hash))
	if err != nil {
		return ShardIndex{}, fmt.Errorf("data: shard %s: %w", info.Hash, err)
	}
	defer f.Close()
	idx, err := ReadShardIndex(f, info.Bytes)
	if err != nil {
		return ShardIndex{}, fmt.Errorf("data: shard %s: %w", info.Hash, err)
	}
	if len(idx.Files) != info.Files {
		return ShardIndex{}, fmt.Errorf("data: shard %s holds %d files, its ShardInfo says %d: %w", info.Hash, len(idx.Files), info.Files, ErrShardFormat)
	}
	return idx, nil
}
