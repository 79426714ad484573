package data

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// testShard returns a valid shard of about n bytes and its info.
func testShard(n int, seed uint64) ([]byte, ShardInfo) {
	r := rand.New(rand.NewPCG(seed, 1))
	var keys []string
	var contents [][]byte
	for i := 0; n > 0; i++ {
		c := make([]byte, min(n, 1+r.IntN(5000)))
		for j := range c {
			c[j] = byte(r.Uint32())
		}
		keys = append(keys, fmt.Sprintf("f%04d", i))
		contents = append(contents, c)
		n -= len(c)
	}
	b := shardBytes(keys, contents)
	return b, infoOf(b, len(keys))
}

func openStore(t testing.TB) *ShardStore {
	t.Helper()
	s, err := OpenShardStore(filepath.Join(t.TempDir(), "shards"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// memSource serves shards from memory like a member would, optionally
// failing after limit bytes, corrupting byte flip, or writing its chunks in
// reverse order.
type memSource struct {
	shards  map[string][]byte
	limit   int64 // fail once this many bytes are written; < 0 = never
	flip    int64 // offset of a byte to corrupt; < 0 = none
	reverse bool
	chunk   int64
	calls   []int64 // offsets requested
}

func (m *memSource) fetch(ctx context.Context, key string, w io.WriterAt, off, n int64) (int64, error) {
	m.calls = append(m.calls, off)
	hash, ok := ParseShardKey(key)
	if !ok {
		return 0, fmt.Errorf("bad key %q", key)
	}
	b := m.shards[hash]
	if b == nil || off+n > int64(len(b)) {
		return 0, fmt.Errorf("no shard %s range [%d, +%d)", hash, off, n)
	}
	chunk := m.chunk
	if chunk <= 0 {
		chunk = 1000
	}
	var starts []int64
	for o := off; o < off+n; o += chunk {
		starts = append(starts, o)
	}
	if m.reverse {
		slices.Reverse(starts)
	}
	done := make(map[int64]bool)
	var written int64
	var err error
	for _, o := range starts {
		p := bytes.Clone(b[o:min(o+chunk, off+n)])
		if m.flip >= o && m.flip < o+int64(len(p)) {
			p[m.flip-o] ^= 0x55
		}
		if m.limit >= 0 && written+int64(len(p)) > m.limit {
			err = errors.New("connection reset")
			break
		}
		if _, werr := w.WriteAt(p, o); werr != nil {
			return 0, werr
		}
		written += int64(len(p))
		done[o] = true
	}
	prefix := int64(0)
	for o := off; o < off+n && done[o]; o += chunk {
		prefix = min(o+chunk, off+n) - off
	}
	return prefix, err
}

func TestShardStoreDownloadResume(t *testing.T) {
	b, info := testShard(50_000, 1)
	src := &memSource{shards: map[string][]byte{info.Hash: b}, limit: 20_500, flip: -1}
	s := openStore(t)
	if s.Has(info) {
		t.Fatal("empty store has the shard")
	}
	err := s.Download(context.Background(), info, src.fetch)
	if err == nil || errors.Is(err, ErrShardCorrupt) {
		t.Fatalf("Download with a failing member = %v, want its error", err)
	}
	// A new process resumes from the recorded prefix.
	s2, err := OpenShardStore(s.Dir())
	if err != nil {
		t.Fatal(err)
	}
	p, err := s2.Partial(info)
	if err != nil {
		t.Fatal(err)
	}
	if p.Have() != 20_000 {
		t.Fatalf("resumed at %d, want 20000", p.Have())
	}
	p.Close()
	src.limit = -1
	if err := s2.Download(context.Background(), info, src.fetch); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(src.calls, []int64{0, 20_000}) {
		t.Errorf("fetched from offsets %v, want [0 20000]", src.calls)
	}
	if !s2.Has(info) {
		t.Fatal("shard not installed")
	}
	got, err := os.ReadFile(s2.Path(info.Hash))
	if err != nil || !bytes.Equal(got, b) {
		t.Fatalf("installed shard differs (%v)", err)
	}
	entries, _ := os.ReadDir(s2.Dir())
	if len(entries) != 1 {
		t.Errorf("store holds %v, want only the shard", entries)
	}
	if err := s2.Verify(info); err != nil {
		t.Fatal(err)
	}
	// Installed: no fetch at all.
	if err := s2.Download(context.Background(), info, src.fetch); err != nil || len(src.calls) != 2 {
		t.Fatalf("Download of an installed shard: %v, %d calls", err, len(src.calls))
	}
}

func TestShardStoreOutOfOrderWrites(t *testing.T) {
	b, info := testShard(10_000, 2)
	s := openStore(t)
	// Chunks arrive in reverse and the transfer fails before the first:
	// nothing is a confirmed prefix.
	src := &memSource{shards: map[string][]byte{info.Hash: b}, limit: 9_000, flip: -1, reverse: true}
	if err := s.Download(context.Background(), info, src.fetch); err == nil {
		t.Fatal("Download succeeded")
	}
	p, err := s.Partial(info)
	if err != nil {
		t.Fatal(err)
	}
	if p.Have() != 0 {
		t.Fatalf("Have = %d after out-of-order writes without a prefix, want 0", p.Have())
	}
	// Unconfirmed bytes are still there (all but the first two chunks);
	// writing the rest and confirming everything commits.
	if _, err := p.WriteAt(b[:2000], 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); !errors.Is(err, ErrShardIncomplete) {
		t.Fatalf("Commit before Confirm = %v, want ErrShardIncomplete", err)
	}
	if err := p.Confirm(info.Bytes); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(info); err != nil {
		t.Fatal(err)
	}
}

func TestShardStoreConcurrentStripes(t *testing.T) {
	b, info := testShard(300_000, 3)
	s := openStore(t)
	fetch := func(ctx context.Context, key string, w io.WriterAt, off, n int64) (int64, error) {
		var wg sync.WaitGroup
		for stripe := range 4 {
			wg.Go(func() {
				for o := off + int64(stripe)*4096; o < off+n; o += 4 * 4096 {
					if _, err := w.WriteAt(b[o:min(o+4096, off+n)], o); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		return n, nil
	}
	if err := s.Download(context.Background(), info, fetch); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(info); err != nil {
		t.Fatal(err)
	}
}

func TestShardStoreCorruptDownload(t *testing.T) {
	b, info := testShard(30_000, 4)
	s := openStore(t)
	evil := &memSource{shards: map[string][]byte{info.Hash: b}, limit: -1, flip: 12_345}
	err := s.Download(context.Background(), info, evil.fetch)
	if !errors.Is(err, ErrShardCorrupt) || !strings.Contains(err.Error(), info.Hash) {
		t.Fatalf("Download of a corrupt shard = %v, want ErrShardCorrupt naming it", err)
	}
	if entries, _ := os.ReadDir(s.Dir()); len(entries) != 0 {
		t.Fatalf("corrupt download left %v", entries)
	}
	// Garbage in the part file before the confirmed prefix is also caught.
	honest := &memSource{shards: map[string][]byte{info.Hash: b}, limit: 10_000, flip: 5}
	if err := s.Download(context.Background(), info, honest.fetch); err == nil {
		t.Fatal("partial Download succeeded")
	}
	honest.limit, honest.flip = -1, -1
	if err := s.Download(context.Background(), info, honest.fetch); !errors.Is(err, ErrShardCorrupt) {
		t.Fatalf("resumed onto garbage: %v, want ErrShardCorrupt", err)
	}
	// Another member, from scratch.
	if err := s.Download(context.Background(), info, honest.fetch); err != nil {
		t.Fatal(err)
	}
	if !s.Has(info) {
		t.Fatal("not installed")
	}
}

func TestShardStoreVerifyAndServe(t *testing.T) {
	b, info := testShard(20_000, 5)
	s := openStore(t)
	if err := s.Verify(info); !errors.Is(err, ErrShardMissing) {
		t.Fatalf("Verify of a missing shard = %v", err)
	}
	if _, _, err := s.Open(info.Hash); !errors.Is(err, ErrShardMissing) {
		t.Fatalf("Open of a missing shard = %v", err)
	}
	install := func() {
		t.Helper()
		if err := os.WriteFile(s.Path(info.Hash), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	install()
	f, size, err := s.Open(info.Hash)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(io.NewSectionReader(f, 0, size))
	f.Close()
	if !bytes.Equal(got, b) {
		t.Fatal("served bytes differ")
	}
	// A wrong size in the info: the file is sound, the info is not.
	wrong := info
	wrong.Bytes--
	if s.Has(wrong) {
		t.Error("Has with the wrong size")
	}
	if err := s.Verify(wrong); !errors.Is(err, ErrShardFormat) || !s.Has(info) {
		t.Fatalf("Verify with a wrong size = %v (installed: %v), want ErrShardFormat and the shard kept", err, s.Has(info))
	}
	// On-disk corruption of the same size: Verify always hashes, and
	// deletes it.
	bad := bytes.Clone(b)
	bad[len(bad)-1] ^= 1
	if err := os.WriteFile(s.Path(info.Hash), bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(info); !errors.Is(err, ErrShardCorrupt) {
		t.Fatalf("Verify of a corrupt shard = %v", err)
	}
	if s.Has(info) {
		t.Fatal("corrupt shard not deleted")
	}
	// A new process hashes before the first use: it will not serve the
	// corrupt bytes, and Has deletes them.
	for _, use := range []func(s *ShardStore) error{
		func(s *ShardStore) error { _, _, err := s.Open(info.Hash); return err },
		func(s *ShardStore) error {
			if s.Has(info) {
				return nil
			}
			return ErrShardCorrupt
		},
	} {
		if err := os.WriteFile(s.Path(info.Hash), bad, 0o644); err != nil {
			t.Fatal(err)
		}
		s2, _ := OpenShardStore(s.Dir())
		if err := use(s2); !errors.Is(err, ErrShardCorrupt) {
			t.Fatalf("using a corrupt shard = %v", err)
		}
		if _, err := os.Stat(s.Path(info.Hash)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("corrupt shard kept: %v", err)
		}
	}
	s2, _ := OpenShardStore(s.Dir())
	if _, _, err := s2.Open("../../etc/passwd"); !errors.Is(err, ErrShardFormat) {
		t.Fatalf("Open of a bad hash = %v", err)
	}
	if s2.Path("../x") != "" {
		t.Fatal("Path accepted a bad hash")
	}
}

func TestShardStorePartialLimits(t *testing.T) {
	b, info := testShard(5_000, 6)
	s := openStore(t)
	huge := info
	huge.Bytes = MaxShardBytes + 1
	if _, err := s.Partial(huge); !errors.Is(err, ErrShardFormat) {
		t.Fatalf("Partial of %d bytes = %v", huge.Bytes, err)
	}
	if entries, _ := os.ReadDir(s.Dir()); len(entries) != 0 {
		t.Fatalf("refused Partial created %v", entries)
	}
	p, err := s.Partial(info)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Partial(info); !errors.Is(err, ErrShardBusy) {
		t.Fatalf("second Partial = %v, want ErrShardBusy", err)
	}
	for _, w := range []struct{ off, n int64 }{{-1, 1}, {info.Bytes, 1}, {info.Bytes - 1, 2}, {1 << 62, 10}} {
		if _, err := p.WriteAt(make([]byte, w.n), w.off); err == nil {
			t.Errorf("WriteAt(%d bytes, %d) outside %d bytes succeeded", w.n, w.off, info.Bytes)
		}
	}
	if err := p.Confirm(info.Bytes + 1); err == nil {
		t.Error("Confirm beyond the shard succeeded")
	}
	if _, err := p.WriteAt(b[:100], 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Confirm(100); err != nil {
		t.Fatal(err)
	}
	if err := p.Confirm(50); err != nil || p.Have() != 100 {
		t.Fatalf("Confirm(50) after 100: %v, Have %d", err, p.Have())
	}
	p.Close()
	if err := p.Confirm(200); err == nil {
		t.Error("Confirm after Close succeeded")
	}

	// The record never claims more than the part file holds.
	if err := os.Truncate(filepath.Join(s.Dir(), info.Hash+".part"), 60); err != nil {
		t.Fatal(err)
	}
	p, err = s.Partial(info)
	if err != nil {
		t.Fatal(err)
	}
	if p.Have() != 60 {
		t.Fatalf("Have = %d with a 60-byte part file, want 60", p.Have())
	}
	p.Close()
	// A record for another size is ignored.
	other := info
	other.Bytes += 1000
	rec := filepath.Join(s.Dir(), info.Hash+".have")
	os.Truncate(filepath.Join(s.Dir(), info.Hash+".part"), 0)
	p, _ = s.Partial(other)
	if p.Have() != 0 {
		t.Fatalf("Have = %d from a record of another size", p.Have())
	}
	p.Discard()
	if _, err := os.Stat(rec); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Discard left the record: %v", err)
	}

	// Stale temporary files go when the store is opened.
	tmp := filepath.Join(s.Dir(), ".pack-123.tmp")
	os.WriteFile(tmp, []byte("x"), 0o644)
	old := time.Now().Add(-time.Hour) // left by an earlier process
	os.Chtimes(tmp, old, old)
	if _, err := OpenShardStore(s.Dir()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale temporary file kept: %v", err)
	}
}
