package data

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/skein-ml/skein/internal/atomicfile"
)

// Packed datasets (skein data pack): documents from text, JSONL, Parquet
// and llm.c files, run through a tokenizer once, written as token shards
// (tokshard.go) in a directory with an index, dataset.json, that names the
// tokenizer and lists the shards of each split in stream order. A run
// trains on the concatenation of its train shards' tokens; every member
// evaluates on the validation shards.
//
// Documents go to the validation split by a hash of their bytes (FNV-1a,
// 64-bit): the same document lands in the same split wherever it appears
// and whatever the inputs are called, so exact duplicates never straddle the
// split. With the gpt2 tokenizer <|endoftext|> precedes every document, as
// in llm.c's data; with byte, documents are simply concatenated.

// Input formats of PackConfig.Format and of each input's extension.
const (
	FormatText    = "text"
	FormatJSONL   = "jsonl"
	FormatParquet = "parquet"
	FormatLLMC    = "llmc"
)

// DatasetIndexName is the index file of a packed dataset directory.
const DatasetIndexName = "dataset.json"

// DatasetFormat names the version of dataset.json.
const DatasetFormat = "skein-dataset-1"

// maxIndexBytes bounds dataset.json.
const maxIndexBytes = 64 << 20

// ErrBadRecord is wrapped (with ErrDataFormat) by a document that cannot
// be packed: a JSONL line that is not an object with a string field, a null
// Parquet value, text that is not UTF-8 for a BPE tokenizer, a document
// past MaxDocumentBytes.
var ErrBadRecord = errors.New("data: bad record")

// PackFormats lists the input formats.
func PackFormats() []string { return []string{FormatText, FormatJSONL, FormatParquet, FormatLLMC} }

// FormatOf is the format an input file is read as when none is named: by
// its extension, text for anything unknown.
func FormatOf(path string) string {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".jsonl":
		return FormatJSONL
	case ".parquet":
		return FormatParquet
	case ".bin":
		return FormatLLMC
	}
	return FormatText
}

// PackConfig configures PackDataset.
type PackConfig struct {
	// Tokenizer encodes the documents; it must be Named.
	Tokenizer Tokenizer
	// Format forces every input's format; empty picks each file's by its
	// extension (FormatOf), directories' files included.
	Format string
	// Field is the JSONL key or Parquet column of the text (default
	// "text").
	Field string
	// SkipBad skips bad records (counted in the summary) instead of
	// stopping at the first.
	SkipBad bool
	// ValFraction is the share of documents held out for validation, in
	// [0, 0.5) (default 0.01; NoValidation for none).
	ValFraction float64
	// NoValidation packs no validation split.
	NoValidation bool
	// ShardTokens is the tokens per shard (default DefaultShardTokens, at
	// most MaxPackShardTokens); ChunkTokens the tokens per chunk (default
	// DefaultChunkTokens, at most MaxChunkTokens).
	ShardTokens int64
	ChunkTokens int
	// Workers tokenize in parallel (default GOMAXPROCS).
	Workers int
	// Progress, if set, is called now and then with the input bytes read so
	// far, their total and the tokens written.
	Progress func(done, total, tokens int64)
}

// MaxPackShardTokens bounds PackConfig.ShardTokens: a shard is assembled in
// memory (512 MiB at 2 bytes a token).
const MaxPackShardTokens = 1 << 28

// DatasetShard is one shard of a packed dataset, as dataset.json and a run
// manifest list it.
type DatasetShard struct {
	Name      string `json:"name"`      // SHA-256 of the shard's header, lowercase hex
	Bytes     int64  `json:"bytes"`     // the shard's size
	Tokens    int64  `json:"tokens"`    // tokens in the shard
	Documents int64  `json:"documents"` // documents starting in it
}

// Validate reports whether s can describe a token shard at all.
func (s DatasetShard) Validate() error {
	switch {
	case !validHash(s.Name):
		return fmt.Errorf("data: token shard name %q is not 64 lowercase hex digits: %w", s.Name, ErrShardFormat)
	case s.Tokens < 1 || s.Tokens > MaxShardTokens:
		return fmt.Errorf("data: token shard %s: %d tokens out of range [1, %d]: %w", s.Name, s.Tokens, int64(MaxShardTokens), ErrShardFormat)
	case s.Bytes < tokenHeaderFixed+32+2*s.Tokens || s.Bytes > MaxShardBytes:
		return fmt.Errorf("data: token shard %s: %d bytes cannot hold %d tokens: %w", s.Name, s.Bytes, s.Tokens, ErrShardFormat)
	case s.Documents < 0 || s.Documents > s.Tokens:
		return fmt.Errorf("data: token shard %s: %d documents in %d tokens: %w", s.Name, s.Documents, s.Tokens, ErrShardFormat)
	}
	return nil
}

// Dataset is a packed dataset's index (dataset.json).
type Dataset struct {
	Format        string         `json:"format"`
	Tokenizer     string         `json:"tokenizer"`
	TokenizerHash string         `json:"tokenizer_hash"`
	Vocab         int            `json:"vocab"`
	Documents     int64          `json:"documents"`
	Tokens        int64          `json:"tokens"`
	Skipped       int64          `json:"skipped_records,omitempty"`
	Train         []DatasetShard `json:"train"`
	Validation    []DatasetShard `json:"validation"`
}

// SplitTokens is the tokens of split s.
func (d *Dataset) SplitTokens(s Split) int64 {
	var n int64
	for _, sh := range d.Shards(s) {
		n += sh.Tokens
	}
	return n
}

// Shards lists split s's shards.
func (d *Dataset) Shards(s Split) []DatasetShard {
	if s == Validation {
		return d.Validation
	}
	return d.Train
}

// AllShards lists every shard, the train split's first.
func (d *Dataset) AllShards() []DatasetShard {
	return append(append([]DatasetShard(nil), d.Train...), d.Validation...)
}

// Check validates the index on its own: names, counts, the tokenizer.
func (d *Dataset) Check() error {
	if d.Format != DatasetFormat {
		return fmt.Errorf("data: dataset format %q, want %q: %w", d.Format, DatasetFormat, ErrDataFormat)
	}
	tok, err := NewTokenizer(d.Tokenizer)
	if err != nil {
		return fmt.Errorf("data: dataset: %w", err)
	}
	if n := tok.(Named); n.VocabHash() != d.TokenizerHash || tok.VocabSize() != d.Vocab {
		return fmt.Errorf("data: dataset packed with a %s tokenizer of hash %.12s and %d ids; this one has %.12s and %d: %w",
			d.Tokenizer, d.TokenizerHash, d.Vocab, n.VocabHash(), tok.VocabSize(), ErrDataFormat)
	}
	if len(d.Train) == 0 {
		return fmt.Errorf("data: dataset has no train shards: %w", ErrDataFormat)
	}
	seen := map[string]bool{}
	var tokens int64
	for _, sh := range d.AllShards() {
		if err := sh.Validate(); err != nil {
			return err
		}
		if seen[sh.Name] {
			return fmt.Errorf("data: dataset lists shard %s twice: %w", sh.Name, ErrDataFormat)
		}
		seen[sh.Name] = true
		tokens += sh.Tokens
	}
	if tokens != d.Tokens {
		return fmt.Errorf("data: dataset says %d tokens, its shards hold %d: %w", d.Tokens, tokens, ErrDataFormat)
	}
	return nil
}

// ReadDataset reads and checks dir's dataset.json and the header of every
// shard it lists (present, of its size, hashing to its name; the tokens
// themselves are checked chunk by chunk when they are read or served).
func ReadDataset(dir string) (*Dataset, error) {
	b, err := readBounded(filepath.Join(dir, DatasetIndexName), maxIndexBytes)
	if err != nil {
		return nil, err
	}
	d, err := ParseDataset(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, DatasetIndexName), err)
	}
	for _, sh := range d.AllShards() {
		if err := checkShardFile(dir, sh, d); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// ParseDataset decodes and checks a dataset.json.
func ParseDataset(b []byte) (*Dataset, error) {
	if len(b) > maxIndexBytes {
		return nil, fmt.Errorf("data: dataset index of %d bytes exceeds %d: %w", len(b), maxIndexBytes, ErrDataFormat)
	}
	var d Dataset
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("data: dataset index: %v: %w", err, ErrDataFormat)
	}
	if err := d.Check(); err != nil {
		return nil, err
	}
	return &d, nil
}

// TokenShardPath is where a packed dataset keeps the shard called name.
func TokenShardPath(dir, name string) string { return filepath.Join(dir, name+".tokens") }

func checkShardFile(dir string, sh DatasetShard, d *Dataset) error {
	f, err := os.Open(TokenShardPath(dir, sh.Name))
	if err != nil {
		return fmt.Errorf("data: dataset shard: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("data: dataset shard: %w", err)
	}
	if fi.Size() != sh.Bytes {
		return fmt.Errorf("data: dataset shard %s has %d bytes, the index says %d: %w", f.Name(), fi.Size(), sh.Bytes, ErrShardCorrupt)
	}
	h, err := ReadTokenShardHeader(f, fi.Size(), sh.Name)
	if err != nil {
		return fmt.Errorf("%s: %w", f.Name(), err)
	}
	if h.Tokens != sh.Tokens || h.Vocab != d.Vocab || hex.EncodeToString(h.VocabHash[:]) != d.TokenizerHash {
		return fmt.Errorf("data: dataset shard %s disagrees with the index (tokens %d vs %d, vocabulary %d vs %d): %w",
			f.Name(), h.Tokens, sh.Tokens, h.Vocab, d.Vocab, ErrShardFormat)
	}
	return nil
}

func readBounded(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("data: %s is larger than %d bytes: %w", path, max, ErrDataFormat)
	}
	return b, nil
}

// packInput is one file to read, with its format.
type packInput struct {
	path, name, format string
	size               int64
}

// collectInputs expands the inputs (files and directories: their visible
// files, sorted by path) in the order given.
func collectInputs(paths []string, format string) ([]packInput, error) {
	if len(paths) == 0 {
		return nil, fmt.Errorf("data: nothing to pack: %w", ErrInvalidConfig)
	}
	var out []packInput
	add := func(p, name string, size int64) {
		f := format
		if f == "" {
			f = FormatOf(p)
		}
		out = append(out, packInput{path: p, name: name, format: f, size: size})
	}
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		if !fi.IsDir() {
			if !fi.Mode().IsRegular() {
				return nil, fmt.Errorf("data: %s is not a regular file: %w", p, ErrInvalidConfig)
			}
			add(p, p, fi.Size())
			continue
		}
		var files []packInput
		err = filepath.WalkDir(p, func(path string, de fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(p, path)
			rel = filepath.ToSlash(rel)
			if rel != "." && !VisibleFiles(rel, de.IsDir()) {
				if de.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if de.IsDir() || !de.Type().IsRegular() {
				return nil
			}
			fi, err := de.Info()
			if err != nil {
				return err
			}
			files = append(files, packInput{path: path, name: path, size: fi.Size()})
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("data: %w", err)
		}
		sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
		for _, f := range files {
			add(f.path, f.name, f.size)
		}
	}
	for _, in := range out {
		switch in.format {
		case FormatText, FormatJSONL, FormatParquet, FormatLLMC:
		default:
			return nil, fmt.Errorf("data: format %q for %s (known: %s): %w", in.format, in.path, strings.Join(PackFormats(), ", "), ErrInvalidConfig)
		}
	}
	return out, nil
}

// PackSummary is what PackDataset did.
type PackSummary struct {
	Dataset   *Dataset
	Inputs    int
	Bytes     int64 // input bytes read
	Documents [2]int64
	Tokens    [2]int64
	Skipped   int64
	Elapsed   time.Duration
}

// document is one document on its way through the packer: text to encode,
// or tokens taken as they are (llm.c files).
type document struct {
	text   []byte
	tokens []int32
	split  Split
}

// docBatch is documents tokenized together, in order.
type docBatch struct {
	seq  int
	docs []document
	done chan struct{}
}

// PackDataset packs the documents of inputs into out (created if needed;
// an existing dataset.json there is replaced, shards already present are
// reused as they are content-addressed). It is deterministic: the same
// inputs, tokenizer and configuration give the same shards on every
// machine, whatever Workers is.
func PackDataset(ctx context.Context, out string, inputs []string, cfg PackConfig) (*PackSummary, error) {
	start := time.Now()
	named, ok := cfg.Tokenizer.(Named)
	if !ok {
		return nil, fmt.Errorf("data: PackDataset needs a named tokenizer: %w", ErrInvalidConfig)
	}
	if cfg.Field == "" {
		cfg.Field = JSONLField
	}
	if cfg.ValFraction == 0 && !cfg.NoValidation {
		cfg.ValFraction = 0.01
	}
	if cfg.NoValidation {
		cfg.ValFraction = 0
	}
	if cfg.ShardTokens == 0 {
		cfg.ShardTokens = DefaultShardTokens
	}
	if cfg.ChunkTokens == 0 {
		cfg.ChunkTokens = DefaultChunkTokens
	}
	if cfg.Workers <= 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	switch {
	case cfg.ValFraction < 0 || cfg.ValFraction >= 0.5 || math.IsNaN(cfg.ValFraction):
		return nil, fmt.Errorf("data: validation fraction %v out of [0, 0.5): %w", cfg.ValFraction, ErrInvalidConfig)
	case cfg.ShardTokens < 1 || cfg.ShardTokens > MaxPackShardTokens:
		return nil, fmt.Errorf("data: %d tokens a shard, out of [1, %d]: %w", cfg.ShardTokens, MaxPackShardTokens, ErrInvalidConfig)
	case cfg.ChunkTokens < 1 || cfg.ChunkTokens > MaxChunkTokens:
		return nil, fmt.Errorf("data: %d tokens a chunk, out of [1, %d]: %w", cfg.ChunkTokens, MaxChunkTokens, ErrInvalidConfig)
	case cfg.Tokenizer.VocabSize() > MaxTokenVocab:
		return nil, fmt.Errorf("data: a vocabulary of %d exceeds %d: %w", cfg.Tokenizer.VocabSize(), MaxTokenVocab, ErrInvalidConfig)
	}
	ins, err := collectInputs(inputs, cfg.Format)
	if err != nil {
		return nil, err
	}
	for _, in := range ins {
		if in.format == FormatLLMC && named.Name() != "gpt2" {
			return nil, fmt.Errorf("data: %s holds llm.c's GPT-2 tokens; pack it with --tokenizer gpt2: %w", in.path, ErrInvalidConfig)
		}
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	var vh [32]byte
	if _, err := hex.Decode(vh[:], []byte(named.VocabHash())); err != nil {
		return nil, fmt.Errorf("data: tokenizer hash: %w", err)
	}
	p := &packRun{cfg: cfg, named: named, eot: -1}
	if named.Name() == "gpt2" {
		p.eot = GPT2EndOfText
	}
	for s := range p.w {
		p.w[s] = &shardWriter{dir: out, vocab: cfg.Tokenizer.VocabSize(), vocabHash: vh, shardTokens: cfg.ShardTokens, chunkTokens: cfg.ChunkTokens}
	}
	var total int64
	for _, in := range ins {
		total += in.size
	}
	p.total = total
	if err := p.run(ctx, ins); err != nil {
		return nil, err
	}
	for _, w := range p.w {
		if err := w.flush(); err != nil {
			return nil, err
		}
	}
	d := &Dataset{Format: DatasetFormat, Tokenizer: named.Name(), TokenizerHash: named.VocabHash(), Vocab: cfg.Tokenizer.VocabSize(),
		Documents: p.docs[Train] + p.docs[Validation], Train: p.w[Train].shards, Validation: p.w[Validation].shards, Skipped: p.skipped}
	d.Tokens = d.SplitTokens(Train) + d.SplitTokens(Validation)
	if d.Train == nil {
		return nil, fmt.Errorf("data: the inputs hold no training tokens (%d documents, %d skipped): %w", d.Documents, p.skipped, ErrCorpusTooSmall)
	}
	if d.Validation == nil {
		d.Validation = []DatasetShard{}
	}
	b, err := json.MarshalIndent(d, "", " ")
	if err != nil {
		return nil, err
	}
	if err := atomicfile.WriteFile(filepath.Join(out, DatasetIndexName), append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	return &PackSummary{Dataset: d, Inputs: len(ins), Bytes: p.done, Documents: p.docs, Tokens: [2]int64{d.SplitTokens(Train), d.SplitTokens(Validation)},
		Skipped: p.skipped, Elapsed: time.Since(start)}, nil
}

// packRun is one PackDataset: readers feed batches of documents to
// tokenizing workers; the writer takes them back in order.
type packRun struct {
	cfg     PackConfig
	named   Named
	eot     int32
	w       [2]*shardWriter
	docs    [2]int64
	skipped int64
	total   int64

	mu   sync.Mutex // guards done and skipped (the reader and the writer)
	done int64      // input bytes read
}

// batchBytes is about how much text one batch carries.
const batchBytes = 1 << 20

func (p *packRun) run(ctx context.Context, ins []packInput) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan *docBatch, 2*p.cfg.Workers)
	order := make(chan *docBatch, 2*p.cfg.Workers)
	var wg sync.WaitGroup
	for range p.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range work {
				p.encode(b)
				close(b.done)
			}
		}()
	}
	// The reader: documents into batches, in input order.
	readErr := make(chan error, 1)
	go func() {
		defer close(order)
		defer close(work)
		cur := &docBatch{done: make(chan struct{})}
		var size int
		send := func() bool {
			select {
			case work <- cur:
			case <-ctx.Done():
				return false
			}
			select {
			case order <- cur:
			case <-ctx.Done():
				return false
			}
			cur, size = &docBatch{seq: cur.seq + 1, done: make(chan struct{})}, 0
			return true
		}
		emit := func(d document) error {
			cur.docs = append(cur.docs, d)
			size += len(d.text) + 2*len(d.tokens)
			if size >= batchBytes && !send() {
				return context.Cause(ctx)
			}
			return nil
		}
		for _, in := range ins {
			if err := p.read(ctx, in, emit); err != nil {
				readErr <- err
				return
			}
		}
		if len(cur.docs) > 0 {
			send()
		}
		readErr <- nil
	}()
	// The writer: batches in order.
	var werr error
	last := time.Now()
	for b := range order {
		<-b.done
		if werr != nil {
			continue
		}
		for _, d := range b.docs {
			if err := p.w[d.split].add(d.tokens); err != nil {
				werr = err
				cancel(err)
				break
			}
			p.docs[d.split]++
		}
		if p.cfg.Progress != nil && time.Since(last) > 200*time.Millisecond {
			last = time.Now()
			p.cfg.Progress(p.readBytes(), p.total, p.w[Train].tokens+p.w[Validation].tokens)
		}
	}
	wg.Wait()
	rerr := <-readErr
	if werr != nil {
		return werr
	}
	if rerr != nil {
		return rerr
	}
	if p.cfg.Progress != nil {
		p.cfg.Progress(p.total, p.total, p.w[Train].tokens+p.w[Validation].tokens)
	}
	return ctx.Err()
}

func (p *packRun) readBytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

func (p *packRun) addRead(n int64) {
	p.mu.Lock()
	p.done += n
	p.mu.Unlock()
}

// encode tokenizes a batch's texts in place, into one buffer, and picks
// each document's split.
func (p *packRun) encode(b *docBatch) {
	app, _ := p.cfg.Tokenizer.(Appender)
	n := 0
	for _, d := range b.docs {
		n += len(d.text)/3 + 2
	}
	buf := make([]int32, 0, n)
	for i := range b.docs {
		d := &b.docs[i]
		d.split = p.split(d)
		if d.tokens != nil {
			continue
		}
		start := len(buf)
		if p.eot >= 0 {
			buf = append(buf, p.eot)
		}
		if app != nil {
			buf = app.AppendEncode(buf, d.text)
		} else {
			buf = append(buf, p.cfg.Tokenizer.Encode(d.text)...)
		}
		d.tokens, d.text = buf[start:len(buf):len(buf)], nil
	}
}

// split is the document's split, by the hash of its bytes.
func (p *packRun) split(d *document) Split {
	if p.cfg.ValFraction == 0 {
		return Train
	}
	h := fnv.New64a()
	if d.tokens != nil {
		var b [4]byte
		for _, t := range d.tokens {
			binary.LittleEndian.PutUint32(b[:], uint32(t))
			h.Write(b[:])
		}
	} else {
		h.Write(d.text)
	}
	if float64(h.Sum64()>>11)/float64(1<<53) < p.cfg.ValFraction {
		return Validation
	}
	return Train
}

// bad handles a bad record: an error, or a count with SkipBad.
func (p *packRun) bad(err error) error {
	if !p.cfg.SkipBad {
		return err
	}
	p.mu.Lock()
	p.skipped++
	p.mu.Unlock()
	return nil
}

// read emits the documents of one input.
func (p *packRun) read(ctx context.Context, in packInput, emit func(document) error) error {
	f, err := os.Open(in.path)
	if err != nil {
		return fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	needUTF8 := p.named.Name() != "byte"
	// checkText says whether text is a good document; a bad one is an
	// error, or skipped (false, nil) with SkipBad.
	checkText := func(where string, text []byte) (bool, error) {
		if len(text) > MaxDocumentBytes {
			return false, p.bad(fmt.Errorf("data: %s%s: a document of %d bytes, more than %d: %w: %w", in.name, where, len(text), MaxDocumentBytes, ErrBadRecord, ErrDataFormat))
		}
		if needUTF8 {
			if err := CheckUTF8(text); err != nil {
				return false, p.bad(fmt.Errorf("data: %s%s: %w: %w: %w", in.name, where, err, ErrBadRecord, ErrDataFormat))
			}
		}
		return true, nil
	}
	switch in.format {
	case FormatText:
		if in.size > MaxDocumentBytes {
			return p.bad(fmt.Errorf("data: %s: a text file of %d bytes is one document, more than %d: %w: %w", in.name, in.size, MaxDocumentBytes, ErrBadRecord, ErrDataFormat))
		}
		b := make([]byte, in.size)
		if _, err := io.ReadFull(f, b); err != nil {
			return fmt.Errorf("data: %s: %w (did it change while packing?)", in.name, err)
		}
		p.addRead(int64(len(b)))
		if ok, err := checkText("", b); !ok || len(b) == 0 {
			return err
		}
		return emit(document{text: b})
	case FormatJSONL:
		r := bufio.NewReaderSize(f, 1<<20)
		for line := 1; ; line++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			l, err := readLine(r, MaxDocumentBytes*2)
			p.addRead(int64(len(l)))
			if errors.Is(err, errLineTooLong) {
				if err := p.bad(fmt.Errorf("data: %s line %d: longer than %d bytes: %w: %w", in.name, line, MaxDocumentBytes*2, ErrBadRecord, ErrDataFormat)); err != nil {
					return err
				}
				continue
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("data: %s: %w", in.name, err)
			}
			if len(l) > 0 && len(strings.TrimSpace(string(l))) > 0 {
				text, perr := jsonlText(l, p.cfg.Field)
				if perr != nil {
					if err := p.bad(fmt.Errorf("data: %s line %d: %v: %w: %w", in.name, line, perr, ErrBadRecord, ErrDataFormat)); err != nil {
						return err
					}
				} else if ok, cerr := checkText(fmt.Sprintf(" line %d", line), text); cerr != nil {
					return cerr
				} else if ok {
					if err := emit(document{text: text}); err != nil {
						return err
					}
				}
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
		}
	case FormatParquet:
		fi, err := f.Stat()
		if err != nil {
			return fmt.Errorf("data: %w", err)
		}
		var prev int64
		skipped, err := ParquetDocuments(ctx, f, fi.Size(), in.name, p.cfg.Field, p.cfg.SkipBad, func(row int64, text []byte) error {
			p.addRead(int64(len(text)))
			if ok, cerr := checkText(fmt.Sprintf(" row %d", row), text); !ok {
				return cerr
			}
			prev += int64(len(text))
			return emit(document{text: append([]byte(nil), text...)})
		})
		p.addRead(max(0, fi.Size()-prev))
		p.mu.Lock()
		p.skipped += skipped
		p.mu.Unlock()
		return err
	case FormatLLMC:
		return p.readLLMC(ctx, f, in, emit)
	}
	return fmt.Errorf("data: format %q: %w", in.format, ErrInvalidConfig)
}

var errLineTooLong = errors.New("line too long")

// readLine reads one line (without its newline) of at most max bytes; a
// longer line is consumed and errLineTooLong returned.
func readLine(r *bufio.Reader, max int) ([]byte, error) {
	var out []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(out)+len(frag) > max {
			out = nil
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = r.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			return nil, errLineTooLong
		}
		out = append(out, frag...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if n := len(out); n > 0 && out[n-1] == '\n' {
			out = out[:n-1]
		}
		return out, err
	}
}

// jsonlText returns the string field of one JSONL record.
func jsonlText(l []byte, field string) ([]byte, error) {
	var rec map[string]json.RawMessage
	if err := json.Unmarshal(l, &rec); err != nil {
		return nil, err
	}
	raw, ok := rec[field]
	if !ok {
		return nil, fmt.Errorf("no field %q", field)
	}
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		return nil, fmt.Errorf("field %q is not a string", field)
	}
	return []byte(text), nil
}

// readLLMC emits the documents of an llm.c .bin file: its tokens cut
// before each <|endoftext|>.
func (p *packRun) readLLMC(ctx context.Context, f *os.File, in packInput, emit func(document) error) error {
	hdr := make([]byte, llmcHeader)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return fmt.Errorf("data: %s: %d bytes, shorter than llm.c's %d-byte header: %w", in.name, in.size, llmcHeader, ErrDataFormat)
	}
	n, err := llmcCount(in.name, hdr, in.size)
	if err != nil {
		return err
	}
	p.addRead(llmcHeader)
	r := bufio.NewReaderSize(f, 1<<20)
	var doc []int32
	buf := make([]byte, 1<<16)
	vocab := int32(p.cfg.Tokenizer.VocabSize())
	var i int64
	for i < n {
		if err := ctx.Err(); err != nil {
			return err
		}
		m := min(int64(len(buf)), 2*(n-i))
		if _, err := io.ReadFull(r, buf[:m]); err != nil {
			return fmt.Errorf("data: %s: %w", in.name, err)
		}
		p.addRead(m)
		for j := int64(0); j < m; j += 2 {
			id := int32(binary.LittleEndian.Uint16(buf[j:]))
			if id >= vocab {
				return fmt.Errorf("data: %s: token %d is %d, outside the vocabulary of %d: %w", in.name, i, id, vocab, ErrDataFormat)
			}
			if id == p.eot && len(doc) > 0 {
				if err := emit(document{tokens: doc}); err != nil {
					return err
				}
				doc = nil
			}
			doc = append(doc, id)
			i++
		}
	}
	if len(doc) > 0 {
		return emit(document{tokens: doc})
	}
	return nil
}

// shardWriter cuts one split's token stream into shards.
type shardWriter struct {
	dir         string
	vocab       int
	vocabHash   [32]byte
	shardTokens int64
	chunkTokens int
	body        []byte // the shard's tokens, encoded
	n           int    // tokens in body
	docs        int64  // documents starting in body
	tokens      int64  // written and buffered
	shards      []DatasetShard
}

// add appends one document's tokens.
func (w *shardWriter) add(ids []int32) error {
	w.docs++
	width := tokenWidth(w.vocab)
	if w.body == nil {
		w.body = make([]byte, 0, min(w.shardTokens*int64(width), 1<<20)) // grows as needed
	}
	for len(ids) > 0 {
		room := int(w.shardTokens) - w.n
		n := min(room, len(ids))
		if width == 2 {
			for _, t := range ids[:n] {
				w.body = binary.LittleEndian.AppendUint16(w.body, uint16(t))
			}
		} else {
			for _, t := range ids[:n] {
				w.body = binary.LittleEndian.AppendUint32(w.body, uint32(t))
			}
		}
		w.n += n
		w.tokens += int64(n)
		ids = ids[n:]
		if w.n == int(w.shardTokens) {
			if err := w.flush(); err != nil {
				return err
			}
		}
	}
	return nil
}

// flush writes the buffered tokens as a shard.
func (w *shardWriter) flush() error {
	if w.n == 0 {
		return nil
	}
	width := tokenWidth(w.vocab)
	body := w.body
	h := TokenShardHeader{Width: width, Vocab: w.vocab, VocabHash: w.vocabHash, Tokens: int64(w.n),
		Documents: w.docs, ChunkTokens: w.chunkTokens}
	for k := 0; k*w.chunkTokens < w.n; k++ {
		lo, hi := k*w.chunkTokens*width, min((k+1)*w.chunkTokens, w.n)*width
		h.Chunks = append(h.Chunks, sha256.Sum256(body[lo:hi]))
	}
	hdr := h.Marshal()
	name := h.Name()
	err := atomicfile.Write(TokenShardPath(w.dir, name), 0o644, func(f io.Writer) error {
		if _, err := f.Write(hdr); err != nil {
			return err
		}
		_, err := f.Write(body)
		return err
	})
	if err != nil {
		return fmt.Errorf("data: writing shard %s: %w", name, err)
	}
	w.shards = append(w.shards, DatasetShard{Name: name, Bytes: int64(len(hdr) + len(body)), Tokens: int64(w.n), Documents: w.docs})
	w.body, w.n, w.docs = w.body[:0], 0, 0
	return nil
}
