package compression

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/klauspost/compress/zstd"
)

// Decoder reads frames written by an Encoder with any Config. It checks every
// declared size against its limits before allocating, verifies every
// checksum, and never panics on malformed input. It keeps its zstd decoder and
// buffers between calls. A Decoder is not safe for concurrent use.
type Decoder struct {
	maxElems int64
	zdec     *zstd.Decoder
	workers  []*decWorker
	hdr      [headerLen]byte
	br       bytes.Reader
}

type decWorker struct {
	in  []byte // chunk header + stored payload
	raw []byte // decompressed body
	err error
}

// NewDecoder returns a Decoder that accepts tensors of up to cfg.MaxElements
// elements and decodes with up to cfg.Workers goroutines. Codec, BlockSize,
// ChunkElems and ZstdLevel are read from each frame and ignored here.
func NewDecoder(cfg Config) (*Decoder, error) {
	if cfg.Workers < 0 {
		return nil, fmt.Errorf("%w: workers %d is negative", ErrConfig, cfg.Workers)
	}
	if cfg.MaxElements < 0 {
		return nil, fmt.Errorf("%w: max elements %d is negative", ErrConfig, cfg.MaxElements)
	}
	nw := cfg.workers()
	maxRaw := uint64(bodyLen(FP32, MaxChunkElems, MinBlockSize))
	z, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(nw),
		zstd.WithDecoderMaxMemory(maxRaw),
		zstd.WithDecoderMaxWindow(maxRaw),
		zstd.WithDecodeAllCapLimit(true),
		zstd.IgnoreChecksum(true),
	)
	if err != nil {
		return nil, fmt.Errorf("compression: zstd decoder: %w", err)
	}
	d := &Decoder{maxElems: cfg.MaxElements, zdec: z, workers: make([]*decWorker, nw)}
	for i := range d.workers {
		d.workers[i] = &decWorker{}
	}
	return d, nil
}

// Close releases the zstd decoder. The Decoder must not be used after.
func (d *Decoder) Close() { d.zdec.Close() }

// ReadHeader reads and validates a frame header.
func (d *Decoder) ReadHeader(r io.Reader) (Header, error) {
	if err := readFull(r, d.hdr[:], "header", -1, 0); err != nil {
		return Header{}, err
	}
	return parseHeader(&d.hdr, d.maxElems)
}

// Decode reads one frame from r and returns the tensor in dst[:n], reusing
// dst when its capacity suffices and allocating otherwise (only after the
// declared size passed the limit). It reads exactly the frame's bytes, so
// frames can follow each other on one stream. Chunks are decoded in parallel.
func (d *Decoder) Decode(r io.Reader, dst []float32) ([]float32, error) {
	h, err := d.ReadHeader(r)
	if err != nil {
		return dst[:0], err
	}
	if int64(cap(dst)) < h.Count {
		dst = make([]float32, h.Count)
	}
	dst = dst[:h.Count]
	nc := h.Chunks()
	for start := 0; start < nc; start += len(d.workers) {
		k := min(len(d.workers), nc-start)
		for j := range k {
			if err := d.readChunk(r, h, d.workers[j], start+j); err != nil {
				return dst, err
			}
		}
		if k == 1 {
			wk := d.workers[0]
			wk.err = d.decodeChunk(h, wk, start, d.span(h, dst, start))
		} else {
			d.decodeParallel(h, dst, start, k)
		}
		for j := range k {
			if err := d.workers[j].err; err != nil {
				return dst, err
			}
		}
	}
	return dst, nil
}

// decodeParallel decodes chunks start..start+k-1, already read by workers 0..k-1.
func (d *Decoder) decodeParallel(h Header, dst []float32, start, k int) {
	var wg sync.WaitGroup
	for j := range k {
		wg.Add(1)
		go func(wk *decWorker, ci int) {
			defer wg.Done()
			wk.err = d.decodeChunk(h, wk, ci, d.span(h, dst, ci))
		}(d.workers[j], start+j)
	}
	wg.Wait()
}

// DecodeBytes decodes the single frame in src; trailing bytes are an error.
func (d *Decoder) DecodeBytes(src []byte, dst []float32) ([]float32, error) {
	d.br.Reset(src)
	out, err := d.Decode(&d.br, dst)
	if err == nil && d.br.Len() != 0 {
		err = fmt.Errorf("%w: %d bytes after the frame", ErrCorrupt, d.br.Len())
	}
	d.br.Reset(nil)
	return out, err
}

func (d *Decoder) span(h Header, dst []float32, ci int) []float32 {
	lo := ci * h.ChunkElems
	return dst[lo : lo+h.chunkLen(ci)]
}

// readChunk reads chunk ci's header and stored payload into wk.in, checking
// the declared length against the chunk's exact raw size before reading.
func (d *Decoder) readChunk(r io.Reader, h Header, wk *decWorker, ci int) error {
	nc := h.Chunks()
	rawLen := bodyLen(h.Codec, h.chunkLen(ci), h.BlockSize)
	wk.in = grow(wk.in, chunkHeaderLen)
	if err := readFull(r, wk.in, "header", ci, nc); err != nil {
		return err
	}
	in := wk.in
	idx := binary.LittleEndian.Uint32(in[8:])
	flags := in[12]
	stored := int64(binary.LittleEndian.Uint32(in[16:]))
	switch {
	case idx != uint32(ci):
		return fmt.Errorf("%w: chunk %d of %d has index %d", ErrCorrupt, ci, nc, idx)
	case flags&^flagZstd != 0 || in[13] != 0 || in[14] != 0 || in[15] != 0:
		return fmt.Errorf("%w: chunk %d of %d has flags %#02x reserved % x", ErrCorrupt, ci, nc, flags, in[13:16])
	case flags == 0 && stored != int64(rawLen):
		return fmt.Errorf("%w: chunk %d of %d stores %d raw bytes, want %d", ErrCorrupt, ci, nc, stored, rawLen)
	case flags == flagZstd && stored >= int64(rawLen):
		return fmt.Errorf("%w: chunk %d of %d stores %d compressed bytes, want fewer than %d", ErrCorrupt, ci, nc, stored, rawLen)
	}
	if need := chunkHeaderLen + int(stored); cap(wk.in) < need {
		wk.in = append(make([]byte, 0, need), wk.in...)
	}
	wk.in = wk.in[:chunkHeaderLen+int(stored)]
	return readFull(r, wk.in[chunkHeaderLen:], "payload", ci, nc)
}

// decodeChunk verifies, decompresses and dequantizes chunk ci into dst.
func (d *Decoder) decodeChunk(h Header, wk *decWorker, ci int, dst []float32) error {
	in := wk.in
	if got, want := binary.LittleEndian.Uint64(in), xxhash.Sum64(in[8:]); got != want {
		return fmt.Errorf("%w: chunk %d of %d: stored %#016x, computed %#016x", ErrChecksum, ci, h.Chunks(), got, want)
	}
	rawLen := bodyLen(h.Codec, len(dst), h.BlockSize)
	body := in[chunkHeaderLen:]
	if in[12]&flagZstd != 0 {
		wk.raw = grow(wk.raw, rawLen)
		raw, err := d.zdec.DecodeAll(body, wk.raw[:0:rawLen])
		if err != nil {
			return fmt.Errorf("%w: chunk %d of %d: zstd: %w", ErrCorrupt, ci, h.Chunks(), err)
		}
		if len(raw) != rawLen {
			return fmt.Errorf("%w: chunk %d of %d: zstd gave %d bytes, want %d", ErrCorrupt, ci, h.Chunks(), len(raw), rawLen)
		}
		body = raw
	}
	base := ci * h.ChunkElems
	if err := decodeBody(h.Codec, dst, body, h.BlockSize, base); err != nil {
		return fmt.Errorf("chunk %d of %d: %w", ci, h.Chunks(), err)
	}
	return nil
}

// Reader decodes a frame chunk by chunk, for tensors too large to hold twice
// or consumed incrementally (for example accumulated into a partial sum).
type Reader struct {
	d    *Decoder
	r    io.Reader
	h    Header
	next int       // next chunk to read
	buf  []float32 // decoded chunk not yet returned
	off  int
	err  error // sticky
}

// NewReader reads and validates the frame header from r.
func (d *Decoder) NewReader(r io.Reader) (*Reader, error) {
	h, err := d.ReadHeader(r)
	if err != nil {
		return nil, err
	}
	return &Reader{d: d, r: r, h: h}, nil
}

// Header returns the frame header.
func (t *Reader) Header() Header { return t.h }

// Read decodes up to len(dst) next elements into dst. It returns io.EOF after
// the last element; any other error is final. Memory is one chunk.
func (t *Reader) Read(dst []float32) (int, error) {
	if t.err != nil {
		return 0, t.err
	}
	n := 0
	for n < len(dst) {
		if t.off < len(t.buf) {
			c := copy(dst[n:], t.buf[t.off:])
			t.off += c
			n += c
			continue
		}
		if t.next >= t.h.Chunks() {
			if n == 0 {
				return 0, io.EOF
			}
			return n, nil
		}
		ci := t.next
		m := t.h.chunkLen(ci)
		wk := t.d.workers[0]
		if err := t.d.readChunk(t.r, t.h, wk, ci); err != nil {
			t.err = err
			return n, err
		}
		t.next++
		out := dst[n:]
		direct := len(out) >= m
		if !direct {
			t.buf = growF(t.buf, m)
			out = t.buf
		}
		if err := t.d.decodeChunk(t.h, wk, ci, out[:m]); err != nil {
			t.err = err
			return n, err
		}
		if direct {
			n += m
		} else {
			t.off = 0
		}
	}
	return n, nil
}
