package data

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// packDir packs c into a new temporary directory.
func packDir(t testing.TB, c *Corpus, target int64) (string, []ShardInfo) {
	t.Helper()
	dir := t.TempDir()
	shards, err := PackShards(c, dir, target)
	if err != nil {
		t.Fatal(err)
	}
	return dir, shards
}

func TestPackShardsDeterministic(t *testing.T) {
	files := randomFiles(60, 3000, 7)
	files["big/huge.bin"] = bytes.Repeat([]byte("0123456789"), 2000) // larger than the target
	c := openCorpus(t, CorpusConfig{Paths: []string{writeCorpus(t, files)}})
	const target = 8 << 10
	dir1, s1 := packDir(t, c, target)
	// The same files elsewhere, another time: the same shards.
	c2 := openCorpus(t, CorpusConfig{Paths: []string{writeCorpus(t, files)}, ValFraction: 0.3})
	dir2, s2 := packDir(t, c2, target)
	if !slices.Equal(s1, s2) {
		t.Fatalf("packing the same corpus twice gave\n%v\n%v", s1, s2)
	}
	if len(s1) < 5 {
		t.Fatalf("%d shards for %d files with an 8 KiB target", len(s1), len(files))
	}
	entries, _ := os.ReadDir(dir1)
	if len(entries) != len(s1) {
		t.Errorf("%d entries in %s, want %d shards and nothing else", len(entries), dir1, len(s1))
	}

	var allKeys []string
	nfiles := 0
	for _, info := range s1 {
		if err := info.Validate(); err != nil {
			t.Fatal(err)
		}
		b1, err := os.ReadFile(filepath.Join(dir1, info.Hash+".shard"))
		if err != nil {
			t.Fatal(err)
		}
		b2, _ := os.ReadFile(filepath.Join(dir2, info.Hash+".shard"))
		if !bytes.Equal(b1, b2) {
			t.Fatalf("shard %s differs between packings", info.Hash)
		}
		if sum := sha256.Sum256(b1); hashString(sum[:]) != info.Hash || int64(len(b1)) != info.Bytes {
			t.Fatalf("shard %s: %d bytes hashing to %x, info %+v", info.Hash, len(b1), sum, info)
		}
		idx, err := ReadShardIndex(bytes.NewReader(b1), int64(len(b1)))
		if err != nil {
			t.Fatal(err)
		}
		if len(idx.Files) != info.Files {
			t.Fatalf("shard %s holds %d files, info says %d", info.Hash, len(idx.Files), info.Files)
		}
		if info.Bytes > target && info.Files != 1 {
			t.Errorf("shard %s: %d bytes over the %d target with %d files", info.Hash, info.Bytes, target, info.Files)
		}
		for _, sf := range idx.Files {
			want := files[sf.Key]
			if got := b1[sf.Offset : sf.Offset+sf.Size]; !bytes.Equal(got, want) {
				t.Fatalf("file %q in shard %s: %d bytes differ from its %d", sf.Key, info.Hash, len(got), len(want))
			}
			allKeys = append(allKeys, sf.Key)
		}
		nfiles += info.Files
	}
	if nfiles != len(files) || !slices.IsSorted(allKeys) {
		t.Errorf("shards hold %d files (sorted: %v), corpus has %d", nfiles, slices.IsSorted(allKeys), len(files))
	}
	// Greedy filling: no shard could have taken the next shard's first file.
	for i := 0; i+1 < len(s1); i++ {
		b, _ := os.ReadFile(filepath.Join(dir1, s1[i+1].Hash+".shard"))
		idx, _ := ReadShardIndex(bytes.NewReader(b), int64(len(b)))
		first := idx.Files[0]
		if s1[i].Bytes+int64(shardEntryFixed+len(first.Key))+first.Size <= target {
			t.Errorf("shard %d (%d bytes) had room for %q (%d bytes)", i, s1[i].Bytes, first.Key, first.Size)
		}
	}

	// Packing a corpus opened from shards gives the same shards again.
	store, err := OpenShardStore(dir1)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := OpenShards(store, s1, ShardCorpusConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if _, s3 := packDir(t, sc, target); !slices.Equal(s1, s3) {
		t.Fatalf("repacking the shard corpus gave\n%v\nwant\n%v", s3, s1)
	}
}

func TestPackShardsOneShard(t *testing.T) {
	c := openCorpus(t, CorpusConfig{Paths: []string{writeCorpus(t, randomFiles(10, 100, 1))}})
	_, shards := packDir(t, c, 0)
	if len(shards) != 1 || shards[0].Files != 10 {
		t.Fatalf("default target: %+v, want one shard of 10 files", shards)
	}
	// A target of one byte: every file alone.
	_, shards = packDir(t, c, 1)
	if len(shards) != 10 {
		t.Fatalf("target 1: %d shards, want 10", len(shards))
	}
}

func TestPackShardsErrors(t *testing.T) {
	dir := writeCorpus(t, map[string][]byte{"a.txt": []byte("hello"), "b.txt": []byte("world")})
	c := openCorpus(t, CorpusConfig{Paths: []string{dir}})
	for _, target := range []int64{-1, MaxShardBytes + 1} {
		if _, err := PackShards(c, t.TempDir(), target); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("target %d: %v, want ErrInvalidConfig", target, err)
		}
	}
	// A file that shrank since the corpus was opened.
	if err := os.WriteFile(filepath.Join(dir, "b.txt"), []byte("w"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	_, err := PackShards(c, out, 0)
	if !errors.Is(err, ErrCorpusChanged) || !strings.Contains(err.Error(), "b.txt") {
		t.Fatalf("shrunk file: %v, want ErrCorpusChanged naming b.txt", err)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 0 {
		t.Errorf("failed packing left %d files in %s", len(entries), out)
	}
	// A file name that is not UTF-8 cannot be a key.
	bad := writeCorpus(t, map[string][]byte{"ok.txt": []byte("x"), "bad\xff.txt": []byte("y")})
	c2 := openCorpus(t, CorpusConfig{Paths: []string{bad}})
	if _, err := PackShards(c2, t.TempDir(), 0); !errors.Is(err, ErrShardFormat) || !strings.Contains(err.Error(), `"bad\xff.txt"`) {
		t.Fatalf("non-UTF-8 name: %v, want ErrShardFormat naming the key", err)
	}
}
