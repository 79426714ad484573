package data

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// openShardCorpus packs c with target into a fresh store and opens the
// shards with valFraction.
func openShardCorpus(t testing.TB, c *Corpus, target int64, valFraction float64) (*Corpus, *ShardStore, []ShardInfo) {
	t.Helper()
	dir, shards := packDir(t, c, target)
	store, err := OpenShardStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := OpenShards(store, shards, ShardCorpusConfig{ValFraction: valFraction, MaxOpenFiles: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	return sc, store, shards
}

// sameCorpus checks that got trains exactly like want: the same stats,
// fingerprint, files, split streams and loader batches.
func sameCorpus(t *testing.T, want, got *Corpus) {
	t.Helper()
	if want.Stats() != got.Stats() {
		t.Fatalf("stats %+v, want %+v", got.Stats(), want.Stats())
	}
	if want.Fingerprint() != got.Fingerprint() {
		t.Fatalf("fingerprint %x, want %x", got.Fingerprint(), want.Fingerprint())
	}
	for _, s := range []Split{Train, Validation} {
		wf, gf := want.Files(s), got.Files(s)
		if len(wf) != len(gf) {
			t.Fatalf("%v: %d files, want %d", s, len(gf), len(wf))
		}
		for i := range wf {
			if wf[i].Rel != gf[i].Rel || wf[i].Size != gf[i].Size {
				t.Fatalf("%v file %d: %q %d bytes, want %q %d", s, i, gf[i].Rel, gf[i].Size, wf[i].Rel, wf[i].Size)
			}
		}
		// The whole stream, in odd-sized reads that cross file boundaries.
		n := want.Size(s)
		for off := int64(0); off < n; off += 7919 {
			a, b := make([]byte, 7919), make([]byte, 7919)
			na, ea := want.ReadAt(s, a, off)
			nb, eb := got.ReadAt(s, b, off)
			if na != nb || (ea == nil) != (eb == nil) || !bytes.Equal(a[:na], b[:nb]) {
				t.Fatalf("%v ReadAt(%d): %d bytes, %v; want %d, %v (equal %v)", s, off, nb, eb, na, ea, bytes.Equal(a[:na], b[:nb]))
			}
		}
	}
	for _, cfg := range []LoaderConfig{
		{Seed: 1, Workers: 1, B: 4, T: 64},
		{Seed: 99, Workers: 3, Worker: 2, B: 2, T: 200},
	} {
		lw, err := NewLoader(want, Train, cfg)
		if err != nil {
			t.Fatal(err)
		}
		lg, err := NewLoader(got, Train, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for step := range 20 {
			wi, wt := batch(t, lw, step)
			gi, gt := batch(t, lg, step)
			if !slices.Equal(wi, gi) || !slices.Equal(wt, gt) {
				t.Fatalf("loader %+v step %d: batches differ", cfg, step)
			}
		}
	}
	vw, err := NewValidationLoader(want, 2, 16)
	if err != nil {
		t.Fatal(err)
	}
	vg, err := NewValidationLoader(got, 2, 16)
	if err != nil {
		t.Fatal(err)
	}
	for step := range 5 {
		wi, _ := batch(t, vw, step)
		gi, _ := batch(t, vg, step)
		if !slices.Equal(wi, gi) {
			t.Fatalf("validation step %d: batches differ", step)
		}
	}
}

func TestOpenShardsTrainsLikeTheDirectory(t *testing.T) {
	files := randomFiles(120, 4000, 11)
	files["big.bin"] = bytes.Repeat([]byte("big"), 10_000)
	dir := writeCorpus(t, files)
	for _, vf := range []float64{0, 0.2} {
		c := openCorpus(t, CorpusConfig{Paths: []string{dir}, ValFraction: vf})
		targets := []int64{16 << 10, 0}
		if vf == 0 {
			targets = append(targets, 1) // a shard per file
		}
		for _, target := range targets {
			sc, _, shards := openShardCorpus(t, c, target, vf)
			t.Logf("ValFraction %v, target %d: %d shards, %+v", vf, target, len(shards), sc.Stats())
			sameCorpus(t, c, sc)
		}
	}
}

func TestOpenShardsGoSources(t *testing.T) {
	root, err := GoRoot()
	if err != nil {
		t.Skip(err)
	}
	var paths []string
	for _, p := range []string{"src/strings", "src/bytes", "src/sort"} {
		paths = append(paths, filepath.Join(root, p))
	}
	if _, err := os.Stat(paths[0]); err != nil {
		t.Skip(err)
	}
	cfg := CorpusConfig{Paths: paths, Filter: GoSources}
	c := openCorpus(t, cfg)
	sc, _, shards := openShardCorpus(t, c, 256<<10, 0)
	t.Logf("%d Go files in %d shards: %+v", c.Stats().Train.Files+c.Stats().Validation.Files, len(shards), c.Stats())
	sameCorpus(t, c, sc)
}

func TestOpenShardsErrors(t *testing.T) {
	c := openCorpus(t, CorpusConfig{Paths: []string{writeCorpus(t, randomFiles(30, 2000, 3))}})
	dir, shards := packDir(t, c, 8<<10)
	if len(shards) < 3 {
		t.Fatalf("%d shards", len(shards))
	}
	store, err := OpenShardStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	open := func(list []ShardInfo, cfg ShardCorpusConfig) error {
		sc, err := OpenShards(store, list, cfg)
		if err == nil {
			sc.Close()
		}
		return err
	}
	fewer := slices.Clone(shards)
	fewer[1].Files--
	swapped := slices.Clone(shards)
	swapped[0], swapped[1] = swapped[1], swapped[0]
	for _, tc := range []struct {
		name string
		list []ShardInfo
		cfg  ShardCorpusConfig
		want error
	}{
		{"none", nil, ShardCorpusConfig{}, ErrEmptyCorpus},
		{"ValFraction", shards, ShardCorpusConfig{ValFraction: 1}, ErrInvalidConfig},
		{"MaxOpenFiles", shards, ShardCorpusConfig{MaxOpenFiles: -1}, ErrInvalidConfig},
		{"twice", append(slices.Clone(shards), shards[0]), ShardCorpusConfig{}, ErrShardFormat},
		{"out of order", swapped, ShardCorpusConfig{}, ErrShardFormat},
		{"file count", fewer, ShardCorpusConfig{}, ErrShardFormat},
		{"bad hash", []ShardInfo{{Hash: "x", Bytes: 100, Files: 1}}, ShardCorpusConfig{}, ErrShardFormat},
	} {
		if err := open(tc.list, tc.cfg); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := OpenShards(nil, shards, ShardCorpusConfig{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil store: %v", err)
	}

	// A shard corrupted on disk after this process verified it is caught
	// by a new process (a fresh store), deleted, and fetched again.
	p := store.Path(shards[2].Hash)
	good, _ := os.ReadFile(p)
	bad := bytes.Clone(good)
	bad[len(bad)/2] ^= 0xff
	os.WriteFile(p, bad, 0o644)
	fresh, _ := OpenShardStore(dir)
	if err := open2(fresh, shards); !errors.Is(err, ErrShardCorrupt) {
		t.Fatalf("corrupt shard: %v, want ErrShardCorrupt", err)
	}
	if err := open2(fresh, shards); !errors.Is(err, ErrShardMissing) {
		t.Fatalf("after deletion: %v, want ErrShardMissing", err)
	}
	src := &memSource{shards: map[string][]byte{shards[2].Hash: good}, limit: -1, flip: -1}
	if err := fresh.Download(context.Background(), shards[2], src.fetch); err != nil {
		t.Fatal(err)
	}
	sc, err := OpenShards(fresh, shards, ShardCorpusConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	sameCorpus(t, c, sc)
}

func open2(s *ShardStore, shards []ShardInfo) error {
	sc, err := OpenShards(s, shards, ShardCorpusConfig{})
	if err == nil {
		sc.Close()
	}
	return err
}

// TestPackDefaultCorpus packs the Go standard library with the default
// target and checks that the shards open to the same corpus.
func TestPackDefaultCorpus(t *testing.T) {
	if testing.Short() {
		t.Skip("packs about 100 MB")
	}
	c, err := OpenDefault()
	if err != nil {
		t.Skip(err)
	}
	defer c.Close()
	sc, _, shards := openShardCorpus(t, c, 0, 0)
	var bytes int64
	for _, s := range shards {
		bytes += s.Bytes
	}
	t.Logf("default corpus: %d shards, %d bytes", len(shards), bytes)
	if c.Fingerprint() != sc.Fingerprint() || c.Stats() != sc.Stats() {
		t.Fatalf("shards: %+v %x, directory: %+v %x", sc.Stats(), sc.Fingerprint(), c.Stats(), c.Fingerprint())
	}
	in1, tg1 := make([]int32, 8*256), make([]int32, 8*256)
	in2, tg2 := make([]int32, 8*256), make([]int32, 8*256)
	l1, _ := NewLoader(c, Train, LoaderConfig{Seed: 3, Workers: 1, B: 8, T: 256})
	l2, _ := NewLoader(sc, Train, LoaderConfig{Seed: 3, Workers: 1, B: 8, T: 256})
	for step := range 10 {
		if err := l1.Batch(step, in1, tg1); err != nil {
			t.Fatal(err)
		}
		if err := l2.Batch(step, in2, tg2); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(in1, in2) || !slices.Equal(tg1, tg2) {
			t.Fatalf("step %d differs", step)
		}
	}
}
