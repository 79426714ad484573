package data

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// Errors returned (wrapped) by this package; test them with errors.Is.
var (
	// ErrEmptyCorpus means the corpus paths and filter select no non-empty file.
	ErrEmptyCorpus = errors.New("data: empty corpus")
	// ErrCorpusTooSmall means a split holds fewer than T+1 tokens, so not even
	// one window fits.
	ErrCorpusTooSmall = errors.New("data: split too small for one window")
	// ErrInvalidConfig means a CorpusConfig or LoaderConfig field is out of range.
	ErrInvalidConfig = errors.New("data: invalid config")
	// ErrCorpusChanged means a file is shorter than when the corpus was opened.
	ErrCorpusChanged = errors.New("data: corpus file changed since it was indexed")
	// ErrDataFormat means a dataset file breaks its format (a JSONL line
	// without a string "text", an llm.c file whose header does not match
	// its size); the error names the file and line.
	ErrDataFormat = errors.New("data: bad dataset file")
)

// Defaults for CorpusConfig.
const (
	DefaultValFraction  = 0.02
	DefaultMaxOpenFiles = 64
)

// Split names one of the two disjoint parts of a corpus.
type Split uint8

const (
	// Train is the training split, about 1-ValFraction of the files.
	Train Split = iota
	// Validation is the held-out split, about ValFraction of the files.
	Validation
)

// String returns "train" or "validation".
func (s Split) String() string {
	switch s {
	case Train:
		return "train"
	case Validation:
		return "validation"
	}
	return fmt.Sprintf("Split(%d)", uint8(s))
}

// Filter decides which entries of a corpus directory are kept. rel is the
// slash-separated path relative to the corpus root; isDir says whether it is
// a directory, and returning false for a directory skips all of it. Files
// named directly in CorpusConfig.Paths bypass the filter.
type Filter func(rel string, isDir bool) bool

// GoSources keeps .go files and skips every directory named testdata: the
// filter of the default corpus.
func GoSources(rel string, isDir bool) bool {
	if isDir {
		return pathBase(rel) != "testdata"
	}
	return strings.HasSuffix(rel, ".go")
}

// VisibleFiles keeps every file and directory whose name does not start with
// a dot: the filter of user corpora when CorpusConfig.Filter is nil.
func VisibleFiles(rel string, isDir bool) bool {
	return !strings.HasPrefix(pathBase(rel), ".")
}

func pathBase(rel string) string {
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		return rel[i+1:]
	}
	return rel
}

// CorpusConfig describes a corpus. Only Paths is required.
type CorpusConfig struct {
	// Paths are files and directories; directories are walked recursively
	// (symbolic links inside them are not followed). Only regular, non-empty
	// files are kept.
	Paths []string
	// Filter selects entries inside directories; nil means VisibleFiles.
	Filter Filter
	// ValFraction is the fraction of files held out for validation, in
	// [0, 1); 0 means DefaultValFraction. With two or more files each split
	// gets at least one.
	ValFraction float64
	// MaxOpenFiles bounds the file descriptors the corpus keeps open; 0 means
	// DefaultMaxOpenFiles.
	MaxOpenFiles int
}

// File describes one file of a corpus.
type File struct {
	Path string // path on disk: the file itself, or the shard that holds it
	Rel  string // slash-separated path relative to its root; the split key
	Size int64  // bytes
	// Offset is where the file's bytes start inside Path: 0 for a file of a
	// directory corpus, the position inside its shard for OpenShards.
	Offset int64
}

// SplitStats counts one split. With ByteTokenizer, Bytes is also the number
// of tokens.
type SplitStats struct {
	Files int
	Bytes int64
}

// Stats counts both splits of a corpus.
type Stats struct {
	Train, Validation SplitStats
}

// Corpus is an index over the files of a corpus, partitioned into Train and
// Validation. Each split is the concatenation of its files in order of Rel.
// A Corpus is safe for concurrent use; Close releases its open files.
type Corpus struct {
	files  []File
	splits [2]splitIndex
	cache  fileCache
}

// splitIndex is one split: its files and their cumulative offsets.
type splitIndex struct {
	files   []int   // indices into Corpus.files, in stream order
	offsets []int64 // offsets[i] is the stream offset of files[i]; len(files)+1 entries
}

func (s *splitIndex) size() int64 { return s.offsets[len(s.offsets)-1] }

// Open indexes the corpus described by cfg. It stats every file but reads
// none.
func Open(cfg CorpusConfig) (*Corpus, error) {
	if len(cfg.Paths) == 0 {
		return nil, fmt.Errorf("data: CorpusConfig.Paths is empty: %w", ErrInvalidConfig)
	}
	var err error
	if cfg.ValFraction, cfg.MaxOpenFiles, err = indexOptions("CorpusConfig", cfg.ValFraction, cfg.MaxOpenFiles); err != nil {
		return nil, err
	}
	if cfg.Filter == nil {
		cfg.Filter = VisibleFiles
	}

	files, err := collect(cfg.Paths, cfg.Filter)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("data: no non-empty files under %q: %w", cfg.Paths, ErrEmptyCorpus)
	}
	return newCorpus(files, cfg.ValFraction, cfg.MaxOpenFiles), nil
}

// indexOptions checks the ValFraction and MaxOpenFiles fields of the config
// type named typ and returns them with their defaults applied.
func indexOptions(typ string, valFraction float64, maxOpen int) (float64, int, error) {
	if valFraction < 0 || valFraction >= 1 || valFraction != valFraction {
		return 0, 0, fmt.Errorf("data: %s.ValFraction = %v out of range [0, 1): %w", typ, valFraction, ErrInvalidConfig)
	}
	if maxOpen < 0 {
		return 0, 0, fmt.Errorf("data: %s.MaxOpenFiles = %d, must be >= 0: %w", typ, maxOpen, ErrInvalidConfig)
	}
	if valFraction == 0 {
		valFraction = DefaultValFraction
	}
	if maxOpen == 0 {
		maxOpen = DefaultMaxOpenFiles
	}
	return valFraction, maxOpen, nil
}

// newCorpus indexes files, already in stream order (sorted by Rel), with the
// normalized valFraction and maxOpen. Open and OpenShards share it, so a
// corpus and its shards split and concatenate their files alike.
func newCorpus(files []File, valFraction float64, maxOpen int) *Corpus {
	c := &Corpus{files: files}
	c.cache.init(maxOpen)
	keys := make([]string, len(files))
	for i, f := range files {
		keys[i] = f.Rel
	}
	val := assignSplits(keys, valFraction)
	for i, f := range files {
		s := &c.splits[Train]
		if val[i] {
			s = &c.splits[Validation]
		}
		if len(s.offsets) == 0 {
			s.offsets = append(s.offsets, 0)
		}
		s.files = append(s.files, i)
		s.offsets = append(s.offsets, s.offsets[len(s.offsets)-1]+f.Size)
	}
	for i := range c.splits {
		if len(c.splits[i].offsets) == 0 {
			c.splits[i].offsets = []int64{0}
		}
	}
	return c
}

// collect walks paths and returns the kept files sorted by (Rel, Path), with
// duplicates (the same absolute path reached twice) removed.
func collect(paths []string, keep Filter) ([]File, error) {
	var files []File
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("data: corpus path %q: %w", p, err)
		}
		if !info.IsDir() {
			if !info.Mode().IsRegular() {
				return nil, fmt.Errorf("data: corpus path %q is not a regular file or directory: %w", p, ErrInvalidConfig)
			}
			if info.Size() > 0 {
				abs, err := filepath.Abs(p)
				if err != nil {
					return nil, fmt.Errorf("data: corpus path %q: %w", p, err)
				}
				files = append(files, File{Path: abs, Rel: filepath.Base(p), Size: info.Size()})
			}
			continue
		}
		root, err := filepath.EvalSymlinks(p)
		if err == nil {
			root, err = filepath.Abs(root)
		}
		if err != nil {
			return nil, fmt.Errorf("data: corpus path %q: %w", p, err)
		}
		err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if path == root {
				return nil
			}
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				if !keep(rel, true) {
					return filepath.SkipDir
				}
				return nil
			}
			if !d.Type().IsRegular() || !keep(rel, false) {
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if fi.Size() > 0 {
				files = append(files, File{Path: path, Rel: rel, Size: fi.Size()})
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("data: walking corpus path %q: %w", p, err)
		}
	}
	slices.SortFunc(files, func(a, b File) int {
		return cmp.Or(strings.Compare(a.Rel, b.Rel), strings.Compare(a.Path, b.Path))
	})
	seen := make(map[string]bool, len(files))
	files = slices.DeleteFunc(files, func(f File) bool {
		dup := seen[f.Path]
		seen[f.Path] = true
		return dup
	})
	return files, nil
}

// splitPoint maps a file's key to a uniform number in [0, 1): FNV-1a 64 of
// the key, finalized with the splitmix64 mixer, top 53 bits.
func splitPoint(key string) float64 {
	h := fnv.New64a()
	io.WriteString(h, key)
	return float64(mix64(h.Sum64())>>11) / (1 << 53)
}

// assignSplits reports for each key whether it belongs to Validation: those
// whose splitPoint is below frac. With two or more keys, each split gets at
// least one: the key with the lowest point moves to Validation if it is empty,
// the one with the highest moves to Train if that is empty.
func assignSplits(keys []string, frac float64) []bool {
	val := make([]bool, len(keys))
	nval := 0
	lo, hi := -1, -1
	var plo, phi float64
	for i, k := range keys {
		u := splitPoint(k)
		if u < frac {
			val[i] = true
			nval++
		}
		if lo < 0 || u < plo {
			lo, plo = i, u
		}
		if hi < 0 || u > phi {
			hi, phi = i, u
		}
	}
	if len(keys) >= 2 {
		if nval == 0 {
			val[lo] = true
		}
		if nval == len(keys) {
			val[hi] = false
		}
	}
	return val
}

// Stats returns the number of files and bytes of each split.
func (c *Corpus) Stats() Stats {
	return Stats{
		Train:      SplitStats{Files: len(c.splits[Train].files), Bytes: c.splits[Train].size()},
		Validation: SplitStats{Files: len(c.splits[Validation].files), Bytes: c.splits[Validation].size()},
	}
}

// Size returns the length in bytes of split s's stream.
func (c *Corpus) Size(s Split) int64 {
	if int(s) >= len(c.splits) {
		return 0
	}
	return c.splits[s].size()
}

// Files returns a copy of the files of split s, in stream order.
func (c *Corpus) Files(s Split) []File {
	if int(s) >= len(c.splits) {
		return nil
	}
	out := make([]File, len(c.splits[s].files))
	for i, fi := range c.splits[s].files {
		out[i] = c.files[fi]
	}
	return out
}

// Fingerprint is a hash of every file's Rel, Size and split. Nodes that
// compare fingerprints can tell whether they index the same corpus (it does
// not read file contents).
func (c *Corpus) Fingerprint() uint64 {
	h := fnv.New64a()
	for s := range c.splits {
		fmt.Fprintf(h, "split %d\n", s)
		for _, fi := range c.splits[s].files {
			fmt.Fprintf(h, "%q %d\n", c.files[fi].Rel, c.files[fi].Size)
		}
	}
	return h.Sum64()
}

// ReadAt reads len(p) bytes of split s's stream starting at off, crossing
// file boundaries as needed, with the semantics of io.ReaderAt.
func (c *Corpus) ReadAt(s Split, p []byte, off int64) (int, error) {
	if int(s) >= len(c.splits) {
		return 0, fmt.Errorf("data: %v is not a split: %w", s, ErrInvalidConfig)
	}
	if off < 0 {
		return 0, fmt.Errorf("data: ReadAt negative offset %d", off)
	}
	sp := &c.splits[s]
	n := 0
	for n < len(p) {
		pos := off + int64(n)
		if pos >= sp.size() {
			return n, io.EOF
		}
		// The file holding pos: the last i with offsets[i] <= pos.
		i, found := slices.BinarySearch(sp.offsets, pos)
		if !found {
			i--
		}
		for i+1 < len(sp.files) && sp.offsets[i+1] == pos {
			i++ // not reached while every file is non-empty; kept for safety
		}
		fi := sp.files[i]
		within := pos - sp.offsets[i]
		want := min(int64(len(p)-n), c.files[fi].Size-within)
		f := &c.files[fi]
		m, err := c.cache.readAt(f.Path, p[n:n+int(want)], f.Offset+within)
		n += m
		if err != nil {
			if errors.Is(err, io.EOF) {
				return n, fmt.Errorf("data: %s is shorter than its indexed %d bytes at offset %d: %w", f.Path, f.Size, f.Offset, ErrCorpusChanged)
			}
			return n, err
		}
	}
	return n, nil
}

// Resplit returns a corpus over the same files split with another
// validation fraction (0: DefaultValFraction), without walking the paths
// again: a volunteer opens its corpus before it learns the run's fraction.
// c stays usable; the new corpus has its own open files.
func (c *Corpus) Resplit(valFraction float64) (*Corpus, error) {
	valFraction, maxOpen, err := indexOptions("Resplit", valFraction, c.cache.max)
	if err != nil {
		return nil, err
	}
	return newCorpus(slices.Clone(c.files), valFraction, maxOpen), nil
}

// Close closes the corpus's open files. Reads after Close fail.
func (c *Corpus) Close() error {
	return c.cache.close()
}

// fileCache keeps at most max files open, keyed by path (the files of one
// shard share a descriptor), evicting the least recently used. Its mutex is
// held across reads so a file is never closed mid-read.
type fileCache struct {
	mu     sync.Mutex
	max    int
	tick   uint64
	open   map[string]*openFile
	closed bool
}

type openFile struct {
	f    *os.File
	used uint64
}

func (fc *fileCache) init(max int) {
	fc.max = max
	fc.open = make(map[string]*openFile, max)
}

func (fc *fileCache) readAt(path string, p []byte, off int64) (int, error) {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.closed {
		return 0, fmt.Errorf("data: read from closed corpus: %w", os.ErrClosed)
	}
	fc.tick++
	of := fc.open[path]
	if of == nil {
		if len(fc.open) >= fc.max {
			fc.evict()
		}
		f, err := os.Open(path)
		if err != nil {
			return 0, fmt.Errorf("data: opening corpus file: %w", err)
		}
		of = &openFile{f: f}
		fc.open[path] = of
	}
	of.used = fc.tick
	n, err := of.f.ReadAt(p, off)
	if err != nil && !(errors.Is(err, io.EOF) && n == len(p)) {
		if errors.Is(err, io.EOF) {
			return n, err
		}
		return n, fmt.Errorf("data: reading %s at %d: %w", path, off, err)
	}
	return n, nil
}

// evict closes the least recently used file. Called with mu held.
func (fc *fileCache) evict() {
	victim, oldest := "", ^uint64(0)
	for path, of := range fc.open {
		if of.used < oldest {
			victim, oldest = path, of.used
		}
	}
	if oldest != ^uint64(0) {
		fc.open[victim].f.Close()
		delete(fc.open, victim)
	}
}

func (fc *fileCache) close() error {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.closed = true
	var errs []error
	for path, of := range fc.open {
		errs = append(errs, of.f.Close())
		delete(fc.open, path)
	}
	return errors.Join(errs...)
}
