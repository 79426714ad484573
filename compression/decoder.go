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
// declared size against its limits, allocates for a frame only as its bytes
// arrive, verifies every checksum, and never panics on malformed input. It
// keeps its zstd decoder and buffers between calls. A Decoder is not safe for
// concurrent use.
type Decoder struct {
	maxElems int64
	zdec     *zstd.Decoder
	workers  []*decWorker
	hdr      [headerLen]byte
	br       bytes.Reader
}

type decWorker struct {
	in       []byte // chunk header + stored payload
	raw      []byte // decompressed body
	verified bool   // in's checksum matched (reset by readChunk)
	err      error
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

// Decode reads one frame from r and returns the tensor in dst[:n]. When
// cap(dst) >= n it decodes into dst and allocates nothing for the output.
// Otherwise it leaves dst untouched and grows a new slice as the chunks arrive
// and pass their checksums, to twice the elements received so far (capped at
// n), so a header declaring a large count costs memory only once the chunks
// that carry it have been read. It reads exactly the frame's bytes, so frames
// can follow each other on one stream. Chunks are decoded in parallel. On
// error the returned slice's contents are unspecified.
func (d *Decoder) Decode(r io.Reader, dst []float32) ([]float32, error) {
	return d.decode(r, dst, nil)
}

// decode implements Decode. When r reads the bytes src, which are already in
// memory, the output is allocated at once for the chunks src holds whole.
func (d *Decoder) decode(r io.Reader, dst []float32, src []byte) ([]float32, error) {
	h, err := d.ReadHeader(r)
	if err != nil {
		return dst[:0], err
	}
	var out []float32
	switch {
	case int64(cap(dst)) >= h.Count:
		out = dst[:h.Count]
	case src != nil:
		if n := wholeChunkElems(h, src[headerLen:]); n > 0 {
			out = make([]float32, n)
		}
	}
	nc := h.Chunks()
	for start := 0; start < nc; start += len(d.workers) {
		k := min(len(d.workers), nc-start)
		for j := range k {
			if err := d.readChunk(r, h, d.workers[j], start+j); err != nil {
				return out, err
			}
		}
		end := h.chunkEnd(start + k - 1)
		if end > cap(out) {
			// Allocate only for chunks that have arrived whole and intact.
			for j := range k {
				if err := d.verifyChunk(h, d.workers[j], start+j); err != nil {
					return out, err
				}
			}
		}
		out = growOutput(out, end, h.Count)
		if k == 1 {
			wk := d.workers[0]
			wk.err = d.decodeChunk(h, wk, start, d.span(h, out, start))
		} else {
			d.decodeParallel(h, out, start, k)
		}
		for j := range k {
			if err := d.workers[j].err; err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// wholeChunkElems returns the elements held by the leading chunks in b (the
// bytes after the frame header) whose chunk headers are valid and whose
// payloads lie whole in b; checksums are left to decoding.
func wholeChunkElems(h Header, b []byte) int {
	end := 0
	for ci := range h.Chunks() {
		if len(b) < chunkHeaderLen {
			break
		}
		stored, err := checkChunkHeader(h, b[:chunkHeaderLen], ci)
		if err != nil || len(b)-chunkHeaderLen < stored {
			break
		}
		b = b[chunkHeaderLen+stored:]
		end = h.chunkEnd(ci)
	}
	return end
}

// growOutput returns out extended to at least end elements, reallocating (to
// twice end, at most count) when its capacity is short; values are kept.
func growOutput(out []float32, end int, count int64) []float32 {
	switch {
	case end <= len(out):
		return out
	case end <= cap(out):
		return out[:end]
	}
	c := int(min(count, 2*int64(end)))
	grown := make([]float32, end, c)
	copy(grown, out)
	return grown
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
// As src is already in memory, when dst is too small the output is allocated
// at once for the chunks whose valid headers and whole payloads src holds
// (all of them for a well-formed frame), not grown as in Decode.
func (d *Decoder) DecodeBytes(src []byte, dst []float32) ([]float32, error) {
	d.br.Reset(src)
	out, err := d.decode(&d.br, dst, src)
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
	wk.in = grow(wk.in, chunkHeaderLen)
	wk.verified = false
	if err := readFull(r, wk.in, "header", ci, nc); err != nil {
		return err
	}
	stored, err := checkChunkHeader(h, wk.in, ci)
	if err != nil {
		return err
	}
	need := chunkHeaderLen + stored
	if cap(wk.in) >= need {
		wk.in = wk.in[:need]
		return readFull(r, wk.in[chunkHeaderLen:], "payload", ci, nc)
	}
	// Grow the buffer as the payload arrives, not to the declared length up
	// front: a forged chunk header then costs only the bytes that follow it.
	for len(wk.in) < need {
		if len(wk.in) == cap(wk.in) {
			c := min(need, max(2*cap(wk.in), minPayloadStep))
			wk.in = append(make([]byte, 0, c), wk.in...)
		}
		lo, hi := len(wk.in), min(need, cap(wk.in))
		wk.in = wk.in[:hi]
		if n, err := io.ReadFull(r, wk.in[lo:hi]); err != nil {
			got := lo - chunkHeaderLen + n
			return readErr(err, fmt.Sprintf("chunk %d of %d payload", ci, nc), got, stored)
		}
	}
	return nil
}

// checkChunkHeader checks the 20-byte header in of chunk ci (its index, its
// flags and its payload length against the chunk's exact raw size) and
// returns the payload length.
func checkChunkHeader(h Header, in []byte, ci int) (int, error) {
	nc := h.Chunks()
	rawLen := bodyLen(h.Codec, h.chunkLen(ci), h.BlockSize)
	idx := binary.LittleEndian.Uint32(in[8:])
	flags := in[12]
	stored := int64(binary.LittleEndian.Uint32(in[16:]))
	switch {
	case idx != uint32(ci):
		return 0, fmt.Errorf("%w: chunk %d of %d has index %d", ErrCorrupt, ci, nc, idx)
	case flags&^flagZstd != 0 || in[13] != 0 || in[14] != 0 || in[15] != 0:
		return 0, fmt.Errorf("%w: chunk %d of %d has flags %#02x reserved % x", ErrCorrupt, ci, nc, flags, in[13:16])
	case flags == 0 && stored != int64(rawLen):
		return 0, fmt.Errorf("%w: chunk %d of %d stores %d raw bytes, want %d", ErrCorrupt, ci, nc, stored, rawLen)
	case flags == flagZstd && stored >= int64(rawLen):
		return 0, fmt.Errorf("%w: chunk %d of %d stores %d compressed bytes, want fewer than %d", ErrCorrupt, ci, nc, stored, rawLen)
	}
	return int(stored), nil
}

// minPayloadStep is the first capacity readChunk gives a payload buffer that
// must grow; it then doubles as bytes arrive.
const minPayloadStep = 64 << 10

// verifyChunk checks the checksum of chunk ci, read by wk, once.
func (d *Decoder) verifyChunk(h Header, wk *decWorker, ci int) error {
	if wk.verified {
		return nil
	}
	in := wk.in
	if got, want := binary.LittleEndian.Uint64(in), xxhash.Sum64(in[8:]); got != want {
		return fmt.Errorf("%w: chunk %d of %d: stored %#016x, computed %#016x", ErrChecksum, ci, h.Chunks(), got, want)
	}
	wk.verified = true
	return nil
}

// decodeChunk verifies, decompresses and dequantizes chunk ci into dst.
func (d *Decoder) decodeChunk(h Header, wk *decWorker, ci int, dst []float32) error {
	if err := d.verifyChunk(h, wk, ci); err != nil {
		return err
	}
	in := wk.in
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
			if err := t.d.verifyChunk(t.h, wk, ci); err != nil {
				t.err = err
				return n, err
			}
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
