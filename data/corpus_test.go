package data

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// writeCorpus creates files (slash-separated relative path -> contents) under
// a new temporary directory and returns it.
func writeCorpus(t testing.TB, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for rel, b := range files {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// randomFiles returns n files named f000.txt... in nested directories, with
// random sizes in [1, maxSize] and random contents drawn from seed.
func randomFiles(n, maxSize int, seed uint64) map[string][]byte {
	r := rand.New(rand.NewPCG(seed, 0))
	files := make(map[string][]byte, n)
	for i := range n {
		b := make([]byte, 1+r.IntN(maxSize))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		files[fmt.Sprintf("d%d/f%03d.txt", i%4, i)] = b
	}
	return files
}

func openCorpus(t testing.TB, cfg CorpusConfig) *Corpus {
	t.Helper()
	c, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// streamOf concatenates the contents of a split's files as listed by Files.
func streamOf(t testing.TB, c *Corpus, s Split) []byte {
	t.Helper()
	var buf bytes.Buffer
	for _, f := range c.Files(s) {
		b, err := os.ReadFile(f.Path)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(b)
	}
	return buf.Bytes()
}

func TestAssignSplitsFraction(t *testing.T) {
	keys := make([]string, 20000)
	for i := range keys {
		keys[i] = fmt.Sprintf("pkg%d/file_%d.go", i%97, i)
	}
	for _, frac := range []float64{0.01, 0.02, 0.1, 0.5, 0.9} {
		t.Run(fmt.Sprint(frac), func(t *testing.T) {
			val := assignSplits(keys, frac)
			n := 0
			for _, v := range val {
				if v {
					n++
				}
			}
			want := frac * float64(len(keys))
			sd := math.Sqrt(want * (1 - frac))
			if math.Abs(float64(n)-want) > 5*sd {
				t.Fatalf("%d of %d keys in validation, want about %.0f (sd %.1f)", n, len(keys), want, sd)
			}
			if again := assignSplits(keys, frac); !slices.Equal(val, again) {
				t.Fatal("assignSplits is not deterministic")
			}
		})
	}
}

func TestAssignSplitsAtLeastOneEach(t *testing.T) {
	tests := []struct {
		keys []string
		frac float64
	}{
		{[]string{"a", "b"}, 1e-9},
		{[]string{"a", "b"}, 1 - 1e-9},
		{[]string{"a", "b", "c"}, 1e-9},
		{[]string{"a", "b", "c"}, 1 - 1e-9},
	}
	for _, tt := range tests {
		val := assignSplits(tt.keys, tt.frac)
		n := 0
		for _, v := range val {
			if v {
				n++
			}
		}
		if n == 0 || n == len(tt.keys) {
			t.Errorf("keys %q frac %g: %d in validation, want each split non-empty", tt.keys, tt.frac, n)
		}
	}
	if val := assignSplits([]string{"only"}, 0.5); len(val) != 1 {
		t.Fatalf("single key: %v", val)
	}
}

func TestCorpusSplitDeterministicAndDisjoint(t *testing.T) {
	files := randomFiles(200, 300, 1)
	dirA, dirB := writeCorpus(t, files), writeCorpus(t, files)
	cfg := CorpusConfig{Paths: []string{dirA}, ValFraction: 0.2}
	a1, a2 := openCorpus(t, cfg), openCorpus(t, cfg)
	b := openCorpus(t, CorpusConfig{Paths: []string{dirB}, ValFraction: 0.2})

	rels := func(c *Corpus, s Split) []string {
		var out []string
		for _, f := range c.Files(s) {
			out = append(out, f.Rel)
		}
		return out
	}
	for _, s := range []Split{Train, Validation} {
		if !slices.Equal(rels(a1, s), rels(a2, s)) {
			t.Errorf("%v: two opens of the same directory differ", s)
		}
		if !slices.Equal(rels(a1, s), rels(b, s)) {
			t.Errorf("%v: the same files in another directory split differently", s)
		}
		if !slices.IsSorted(rels(a1, s)) {
			t.Errorf("%v: files not sorted by path", s)
		}
	}
	if a1.Fingerprint() != b.Fingerprint() {
		t.Error("fingerprints differ for identical corpora in different places")
	}

	train, val := rels(a1, Train), rels(a1, Validation)
	if len(train)+len(val) != len(files) {
		t.Fatalf("train %d + validation %d != %d files", len(train), len(val), len(files))
	}
	for _, r := range val {
		if _, found := slices.BinarySearch(train, r); found {
			t.Fatalf("%s is in both splits", r)
		}
	}
	if len(val) < 20 || len(val) > 65 { // 0.2*200 = 40, sd about 5.7
		t.Errorf("%d of 200 files in validation, want about 40", len(val))
	}

	st := a1.Stats()
	if st.Train.Files != len(train) || st.Validation.Files != len(val) {
		t.Errorf("Stats files = %+v, want %d/%d", st, len(train), len(val))
	}
	var total int64
	for _, b := range files {
		total += int64(len(b))
	}
	if st.Train.Bytes+st.Validation.Bytes != total || st.Train.Bytes != a1.Size(Train) {
		t.Errorf("Stats bytes = %+v, want total %d", st, total)
	}

	other := writeCorpus(t, randomFiles(201, 300, 1))
	if openCorpus(t, CorpusConfig{Paths: []string{other}, ValFraction: 0.2}).Fingerprint() == a1.Fingerprint() {
		t.Error("fingerprint unchanged by an extra file")
	}
}

func TestCorpusReadAtCrossesFiles(t *testing.T) {
	dir := writeCorpus(t, randomFiles(40, 50, 2))
	for _, maxOpen := range []int{1, 3, 100} {
		t.Run(fmt.Sprint("maxOpen=", maxOpen), func(t *testing.T) {
			c := openCorpus(t, CorpusConfig{Paths: []string{dir}, ValFraction: 0.3, MaxOpenFiles: maxOpen})
			for _, s := range []Split{Train, Validation} {
				want := streamOf(t, c, s)
				if int64(len(want)) != c.Size(s) {
					t.Fatalf("%v: Size = %d, stream has %d bytes", s, c.Size(s), len(want))
				}
				r := rand.New(rand.NewPCG(3, uint64(s)))
				for range 300 {
					off := r.IntN(len(want))
					n := r.IntN(len(want)-off) + 1
					got := make([]byte, n)
					if m, err := c.ReadAt(s, got, int64(off)); err != nil || m != n {
						t.Fatalf("%v: ReadAt(%d bytes, %d) = %d, %v", s, n, off, m, err)
					}
					if !bytes.Equal(got, want[off:off+n]) {
						t.Fatalf("%v: ReadAt(%d bytes, %d) returned wrong bytes", s, n, off)
					}
				}
				got := make([]byte, 10)
				if m, err := c.ReadAt(s, got, int64(len(want)-5)); m != 5 || err != io.EOF {
					t.Fatalf("%v: read past end = %d, %v; want 5, io.EOF", s, m, err)
				}
				if c.cache.max != maxOpen || len(c.cache.open) > maxOpen {
					t.Fatalf("%d files open, limit %d", len(c.cache.open), maxOpen)
				}
			}
		})
	}
}

func TestCorpusFilters(t *testing.T) {
	dir := writeCorpus(t, map[string][]byte{
		"a.go":                 []byte("package a"),
		"a_test.go":            []byte("package a"),
		"README":               []byte("readme"),
		"empty.go":             nil,
		".hidden.go":           []byte("x"),
		".git/config":          []byte("x"),
		"sub/b.go":             []byte("package b"),
		"sub/testdata/x.go":    []byte("package x"),
		"testdata/y.go":        []byte("package y"),
		"sub/testdatafile.go":  []byte("package z"),
		"sub/deep/notes.txt":   []byte("notes"),
		"sub/deep/testdata.go": []byte("package w"),
	})
	tests := []struct {
		name   string
		filter Filter
		want   []string
	}{
		{"GoSources", GoSources, []string{".hidden.go", "a.go", "a_test.go", "sub/b.go", "sub/deep/testdata.go", "sub/testdatafile.go"}},
		{"nil is VisibleFiles", nil, []string{"README", "a.go", "a_test.go", "sub/b.go", "sub/deep/notes.txt", "sub/deep/testdata.go", "sub/testdata/x.go", "sub/testdatafile.go", "testdata/y.go"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := openCorpus(t, CorpusConfig{Paths: []string{dir}, Filter: tt.filter})
			var got []string
			for _, s := range []Split{Train, Validation} {
				for _, f := range c.Files(s) {
					got = append(got, f.Rel)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("files = %q\nwant    %q", got, tt.want)
			}
		})
	}
}

func TestCorpusPathList(t *testing.T) {
	dir := writeCorpus(t, map[string][]byte{"x/a.txt": []byte("aaa"), "y/b.txt": []byte("bb"), "z.txt": []byte("z")})
	c := openCorpus(t, CorpusConfig{Paths: []string{
		filepath.Join(dir, "x"), filepath.Join(dir, "y"), filepath.Join(dir, "z.txt"),
		filepath.Join(dir, "x", "a.txt"), // also reached through x: counted once
	}})
	st := c.Stats()
	if got := st.Train.Files + st.Validation.Files; got != 3 {
		t.Fatalf("%d files, want 3", got)
	}
	if got := st.Train.Bytes + st.Validation.Bytes; got != 6 {
		t.Fatalf("%d bytes, want 6", got)
	}
}

func TestCorpusErrors(t *testing.T) {
	empty := t.TempDir()
	onlyEmpty := writeCorpus(t, map[string][]byte{"a": nil, "b/c": nil, ".hidden": []byte("x")})
	full := writeCorpus(t, map[string][]byte{"a": []byte("abc")})
	tests := []struct {
		name string
		cfg  CorpusConfig
		want error
		msg  string
	}{
		{"no paths", CorpusConfig{}, ErrInvalidConfig, "Paths"},
		{"empty dir", CorpusConfig{Paths: []string{empty}}, ErrEmptyCorpus, empty},
		{"only empty files", CorpusConfig{Paths: []string{onlyEmpty}}, ErrEmptyCorpus, ""},
		{"missing path", CorpusConfig{Paths: []string{filepath.Join(empty, "nope")}}, fs.ErrNotExist, "nope"},
		{"ValFraction 1", CorpusConfig{Paths: []string{full}, ValFraction: 1}, ErrInvalidConfig, "ValFraction"},
		{"ValFraction negative", CorpusConfig{Paths: []string{full}, ValFraction: -0.1}, ErrInvalidConfig, "ValFraction"},
		{"ValFraction NaN", CorpusConfig{Paths: []string{full}, ValFraction: math.NaN()}, ErrInvalidConfig, "ValFraction"},
		{"MaxOpenFiles negative", CorpusConfig{Paths: []string{full}, MaxOpenFiles: -1}, ErrInvalidConfig, "MaxOpenFiles"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Open(tt.cfg)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Open error = %v, want %v", err, tt.want)
			}
			if c != nil {
				t.Fatal("Open returned a corpus with an error")
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("error %q does not mention %q", err, tt.msg)
			}
		})
	}
}

func TestCorpusChangedAndClosed(t *testing.T) {
	dir := writeCorpus(t, map[string][]byte{"a": bytes.Repeat([]byte("a"), 100)})
	c := openCorpus(t, CorpusConfig{Paths: []string{dir}})
	if err := os.Truncate(filepath.Join(dir, "a"), 10); err != nil {
		t.Fatal(err)
	}
	s := Train
	if c.Size(Train) == 0 {
		s = Validation
	}
	buf := make([]byte, 50)
	if _, err := c.ReadAt(s, buf, 0); !errors.Is(err, ErrCorpusChanged) {
		t.Fatalf("read of truncated file: %v, want ErrCorpusChanged", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadAt(s, buf[:5], 0); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("read after Close: %v, want os.ErrClosed", err)
	}
}

func TestDefaultCorpus(t *testing.T) {
	paths, err := DefaultCorpusPaths()
	if err != nil {
		t.Skipf("no Go sources: %v", err)
	}
	c, err := OpenDefault()
	if err != nil {
		t.Fatalf("OpenDefault (paths %q): %v", paths, err)
	}
	defer c.Close()
	st := c.Stats()
	t.Logf("default corpus %q: %+v", paths, st)
	if st.Train.Files < 100 || st.Validation.Files < 1 || st.Train.Bytes < 1<<20 {
		t.Fatalf("default corpus too small: %+v", st)
	}
	frac := float64(st.Validation.Files) / float64(st.Train.Files+st.Validation.Files)
	if frac < DefaultValFraction/2 || frac > DefaultValFraction*2 {
		t.Errorf("validation fraction %.4f, want about %v", frac, DefaultValFraction)
	}
	for _, s := range []Split{Train, Validation} {
		for _, f := range c.Files(s) {
			if !strings.HasSuffix(f.Rel, ".go") {
				t.Fatalf("non-.go file %s in default corpus", f.Path)
			}
			if slices.Contains(strings.Split(f.Rel, "/"), "testdata") {
				t.Fatalf("testdata file %s in default corpus", f.Path)
			}
		}
	}
	// The stream starts with the first file's contents.
	first := c.Files(Train)[0]
	want, err := os.ReadFile(first.Path)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, min(len(want), 64))
	if _, err := c.ReadAt(Train, got, 0); err != nil || !bytes.Equal(got, want[:len(got)]) {
		t.Fatalf("ReadAt(Train, 0) = %q, %v; want %q", got, err, want[:len(got)])
	}
}

// Resplit gives the corpus Open gives with that fraction, without walking
// the paths again.
func TestCorpusResplit(t *testing.T) {
	dir := writeCorpus(t, randomFiles(100, 200, 3))
	c := openCorpus(t, CorpusConfig{Paths: []string{dir}})
	r, err := c.Resplit(0.3)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	want := openCorpus(t, CorpusConfig{Paths: []string{dir}, ValFraction: 0.3})
	if r.Fingerprint() != want.Fingerprint() || r.Stats() != want.Stats() {
		t.Fatalf("resplit %+v, opened with the fraction %+v", r.Stats(), want.Stats())
	}
	if !bytes.Equal(streamOf(t, r, Validation), streamOf(t, want, Validation)) {
		t.Fatal("validation streams differ")
	}
	if _, err := c.Resplit(1.5); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("fraction 1.5: %v", err)
	}
}
