package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/manifest"
	"github.com/skein-ml/skein/p2p"
)

// shardFetchers is how many shards a volunteer downloads at once.
const shardFetchers = 4

// fetchShards makes every shard installed in store, downloading the missing
// ones over bulk transfer from the run's members (each shard from a
// different member first, to spread the load; bootstraps are asked too). A
// download resumes where an earlier one stopped; a shard whose hash does
// not match is deleted and fetched again from the next member, never used.
// progress shows bytes done and the rate.
func fetchShards(ctx context.Context, n *p2p.Node, store *data.ShardStore, shards []data.ShardInfo,
	progress io.Writer, log *slog.Logger) error {
	var missing []data.ShardInfo
	var total int64
	for _, s := range shards {
		if !store.Has(s) {
			missing = append(missing, s)
			total += s.Bytes
		}
	}
	if len(missing) == 0 {
		return nil
	}
	say(progress, "fetching the run's corpus: %d of %d shards, %.1f MB", len(missing), len(shards), float64(total)/1e6)
	tr := startTransfer(progress, "the corpus", total)
	ok := false
	defer func() { tr.finish(ok) }()
	// A few shards at a time, each from a different member first.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	jobs := make(chan int)
	errs := make(chan error, len(missing))
	var wg sync.WaitGroup
	for w := 0; w < min(shardFetchers, len(missing)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if err := fetchShard(ctx, n, store, missing[i], i, tr, log); err != nil {
					errs <- err
					cancel()
				}
			}
		}()
	}
feed:
	for i := range missing {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	ok = true
	return nil
}

// fetchShard downloads one shard, trying members in turn (starting at
// member i mod n) until one serves bytes that match the hash.
func fetchShard(ctx context.Context, n *p2p.Node, store *data.ShardStore, s data.ShardInfo, i int,
	tr *transfer, log *slog.Logger) error {
	var lastErr error
	for attempt := 0; attempt < 8; attempt++ {
		boots, vols := memberSources(n)
		srcs := append(boots, vols...)
		if len(srcs) == 0 {
			lastErr = fmt.Errorf("node: no member to fetch shard %s from", s.Hash)
		}
		for j := range srcs {
			id := srcs[(i+j)%len(srcs)]
			fetch := func(ctx context.Context, key string, w io.WriterAt, off, length int64) (int64, error) {
				fctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
				defer cancel()
				got, err := n.Fetch(fctx, id, key, tr.writerAt(w), p2p.FetchOptions{Offset: off, Length: length, Streams: 2})
				return got, err
			}
			err := store.Download(ctx, s, fetch)
			if err == nil {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, data.ErrShardCorrupt) {
				log.Warn("shard failed its hash check; fetching it again from another member", "shard", s.Hash[:12], "peer", id)
			} else {
				log.Debug("shard fetch", "shard", s.Hash[:12], "peer", id, "err", err)
			}
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * time.Second):
		}
	}
	return fmt.Errorf("node: fetching shard %s: %w", s.Hash, lastErr)
}

// shardInfos converts the manifest's shard list.
func shardInfos(shards []manifest.Shard) []data.ShardInfo {
	out := make([]data.ShardInfo, len(shards))
	for i, s := range shards {
		out[i] = data.ShardInfo{Hash: s.Hash, Bytes: s.Bytes, Files: s.Files}
	}
	return out
}
