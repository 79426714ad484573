package data

import (
	"testing"
)

// BenchmarkPackDefaultCorpus packs the Go standard library (about 90 MB in
// 6,500 files) into DefaultShardBytes shards, fsyncs included.
func BenchmarkPackDefaultCorpus(b *testing.B) {
	c, err := OpenDefault()
	if err != nil {
		b.Skip(err)
	}
	defer c.Close()
	var bytes int64
	for b.Loop() {
		shards, err := PackShards(c, b.TempDir(), 0)
		if err != nil {
			b.Fatal(err)
		}
		bytes = 0
		for _, s := range shards {
			bytes += s.Bytes
		}
	}
	b.ReportMetric(float64(bytes)*float64(b.N)/1e6/b.Elapsed().Seconds(), "MB/s")
}

// BenchmarkOpenShardsDefaultCorpus opens the packed standard library in a
// fresh store each time, so every shard is hashed.
func BenchmarkOpenShardsDefaultCorpus(b *testing.B) {
	c, err := OpenDefault()
	if err != nil {
		b.Skip(err)
	}
	defer c.Close()
	dir := b.TempDir()
	shards, err := PackShards(c, dir, 0)
	if err != nil {
		b.Fatal(err)
	}
	var bytes int64
	for _, s := range shards {
		bytes += s.Bytes
	}
	for b.Loop() {
		store, err := OpenShardStore(dir)
		if err != nil {
			b.Fatal(err)
		}
		sc, err := OpenShards(store, shards, ShardCorpusConfig{})
		if err != nil {
			b.Fatal(err)
		}
		sc.Close()
	}
	b.ReportMetric(float64(bytes)*float64(b.N)/1e6/b.Elapsed().Seconds(), "MB/s")
}
