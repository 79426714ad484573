package compression

import (
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Encoder turns float32 tensors into frames. It keeps its zstd encoder and
// per-worker buffers between calls, so encoding allocates nothing in steady
// state. An Encoder is not safe for concurrent use; make one per goroutine.
type Encoder struct {
	cfg     Config
	zenc    *zstd.Encoder // nil when cfg.ZstdLevel == 0
	workers []*encWorker
	hdr     [headerLen]byte
	sw      sliceWriter
}

type encWorker struct {
	raw []byte    // quantized body
	out []byte    // chunk header + stored payload
	v   []float32 // error feedback: input plus residual
	c   []float32 // error feedback: decoded message
	err error
}

// NewEncoder validates cfg and returns an Encoder for it.
func NewEncoder(cfg Config) (*Encoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Encoder{cfg: cfg}
	nw := cfg.workers()
	if cfg.ZstdLevel > 0 {
		z, err := zstd.NewWriter(nil,
			zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(cfg.ZstdLevel)),
			zstd.WithEncoderConcurrency(nw),
			zstd.WithEncoderCRC(false), // chunks carry their own checksum
		)
		if err != nil {
			return nil, fmt.Errorf("compression: zstd encoder: %w", err)
		}
		e.zenc = z
	}
	e.workers = make([]*encWorker, nw)
	for i := range e.workers {
		e.workers[i] = &encWorker{}
	}
	return e, nil
}

// Config returns the Encoder's configuration.
func (e *Encoder) Config() Config { return e.cfg }

// Close releases the zstd encoder's resources. The Encoder must not be used after.
func (e *Encoder) Close() error {
	if e.zenc != nil {
		return e.zenc.Close()
	}
	return nil
}

// Encode writes x as one frame to w. seed keys stochastic rounding (ignored
// otherwise): the same x, seed and Config give the same bytes for any
// Workers. Chunks are written as they are produced; memory beyond x is two
// chunk buffers per worker. A NaN or Inf in x fails with ErrNonFinite; the
// frame written so far is then incomplete and must be discarded (a Decoder
// reports it as ErrTruncated).
func (e *Encoder) Encode(w io.Writer, x []float32, seed uint64) error {
	return e.encode(w, x, seed, nil)
}

// Append appends the frame for x to dst and returns the extended slice.
func (e *Encoder) Append(dst []byte, x []float32, seed uint64) ([]byte, error) {
	e.sw.b = dst
	err := e.encode(&e.sw, x, seed, nil)
	out := e.sw.b
	e.sw.b = nil
	return out, err
}

type sliceWriter struct{ b []byte }

func (s *sliceWriter) Write(p []byte) (int, error) {
	s.b = append(s.b, p...)
	return len(p), nil
}

func (e *Encoder) header(n int64) Header {
	return Header{Codec: e.cfg.Codec, Count: n, BlockSize: e.cfg.BlockSize, ChunkElems: e.cfg.ChunkElems, Stochastic: e.cfg.Stochastic}
}

func (e *Encoder) encode(w io.Writer, x []float32, seed uint64, ef *ErrorFeedback) error {
	if ef != nil && len(ef.state) != len(x) {
		return fmt.Errorf("%w: error feedback holds %d elements, tensor has %d", ErrSize, len(ef.state), len(x))
	}
	h := e.header(int64(len(x)))
	if ef != nil {
		// Reject non-finite input before the state changes.
		if m := absmaxBits(x); m >= expMask {
			return nonFinite(x, 0)
		}
	}
	putHeader(&e.hdr, h)
	if _, err := w.Write(e.hdr[:]); err != nil {
		return fmt.Errorf("compression: writing header: %w", err)
	}
	nc := h.Chunks()
	key := rngKey(seed)
	for start := 0; start < nc; start += len(e.workers) {
		k := min(len(e.workers), nc-start)
		if k == 1 {
			wk := e.workers[0]
			wk.err = e.encodeChunk(wk, x, start, key, ef)
		} else {
			e.encodeParallel(x, start, k, key, ef)
		}
		for j := range k {
			wk := e.workers[j]
			if wk.err != nil {
				return wk.err
			}
			if _, err := w.Write(wk.out); err != nil {
				return fmt.Errorf("compression: writing chunk %d of %d: %w", start+j, nc, err)
			}
		}
	}
	return nil
}

// encodeParallel encodes chunks start..start+k-1 with workers 0..k-1.
func (e *Encoder) encodeParallel(x []float32, start, k int, key uint64, ef *ErrorFeedback) {
	var wg sync.WaitGroup
	for j := range k {
		wg.Add(1)
		go func(wk *encWorker, ci int) {
			defer wg.Done()
			wk.err = e.encodeChunk(wk, x, ci, key, ef)
		}(e.workers[j], start+j)
	}
	wg.Wait()
}

// encodeChunk quantizes, compresses and frames chunk ci of x into wk.out.
func (e *Encoder) encodeChunk(wk *encWorker, x []float32, ci int, key uint64, ef *ErrorFeedback) error {
	ce := e.cfg.ChunkElems
	lo := ci * ce
	hi := min(lo+ce, len(x))
	return e.encodeSpan(wk, x[lo:hi], ci, key, ef)
}

// encodeSpan frames xs, the elements of chunk ci. Without zstd the body is
// quantized in place after the chunk header, so it is not copied.
func (e *Encoder) encodeSpan(wk *encWorker, xs []float32, ci int, key uint64, ef *ErrorFeedback) error {
	cfg := &e.cfg
	lo := ci * cfg.ChunkElems
	rawLen := bodyLen(cfg.Codec, len(xs), cfg.BlockSize)
	need := chunkHeaderLen + rawLen
	if e.zenc != nil {
		need = chunkHeaderLen + e.zenc.MaxEncodedSize(rawLen)
	}
	if cap(wk.out) < need {
		wk.out = make([]byte, 0, need)
	}
	var raw []byte
	if e.zenc == nil {
		raw = wk.out[chunkHeaderLen : chunkHeaderLen+rawLen]
	} else {
		wk.raw = grow(wk.raw, rawLen)
		raw = wk.raw
	}
	src := xs
	if ef != nil {
		wk.v = growF(wk.v, len(xs))
		wk.c = growF(wk.c, len(xs))
		src = ef.input(wk.v, xs, lo)
	}
	if err := encodeBody(cfg.Codec, raw, src, cfg.BlockSize, lo, key, cfg.Stochastic); err != nil {
		return err // names the tensor element
	}
	if ef != nil {
		if err := decodeBody(cfg.Codec, wk.c, raw, cfg.BlockSize, lo); err != nil {
			return fmt.Errorf("error feedback, chunk %d: %w", ci, err)
		}
		ef.update(lo, src, wk.c)
	}
	out := wk.out[:chunkHeaderLen+rawLen] // stored raw
	var flags byte
	if e.zenc != nil {
		out = e.zenc.EncodeAll(raw, wk.out[:chunkHeaderLen])
		if len(out)-chunkHeaderLen < rawLen {
			flags = flagZstd
		} else {
			out = append(out[:chunkHeaderLen], raw...) // zstd did not help
		}
	}
	putChunkHeader(out, ci, flags)
	wk.out = out
	return nil
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

func growF(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// Writer encodes a tensor of known length that arrives in pieces, for
// example read from disk, holding one chunk of input at a time. It writes the
// same bytes as Encode on the whole tensor.
type Writer struct {
	e    *Encoder
	w    io.Writer
	h    Header
	key  uint64
	buf  []float32 // pending elements of the current chunk
	next int       // index of the chunk being filled
	seen int64
	err  error // sticky
}

// NewWriter writes the header for a tensor of n elements to w.
func (e *Encoder) NewWriter(w io.Writer, n int64, seed uint64) (*Writer, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: tensor length %d is negative", ErrSize, n)
	}
	h := e.header(n)
	putHeader(&e.hdr, h)
	if _, err := w.Write(e.hdr[:]); err != nil {
		return nil, fmt.Errorf("compression: writing header: %w", err)
	}
	return &Writer{e: e, w: w, h: h, key: rngKey(seed), buf: make([]float32, 0, min(int64(h.ChunkElems), n))}, nil
}

// Write adds the next len(x) elements. Writing past the declared length fails with ErrSize.
func (s *Writer) Write(x []float32) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if s.seen+int64(len(x)) > s.h.Count {
		s.err = fmt.Errorf("%w: writing %d elements past %d of %d", ErrSize, len(x), s.seen, s.h.Count)
		return 0, s.err
	}
	n := 0
	for len(x) > 0 {
		m := s.h.chunkLen(s.next)
		k := min(m-len(s.buf), len(x))
		s.buf = append(s.buf, x[:k]...)
		x = x[k:]
		n += k
		s.seen += int64(k)
		if len(s.buf) == m {
			wk := s.e.workers[0]
			if err := s.e.encodeSpan(wk, s.buf, s.next, s.key, nil); err != nil {
				s.err = err
				return n, err
			}
			if _, err := s.w.Write(wk.out); err != nil {
				s.err = fmt.Errorf("compression: writing chunk %d of %d: %w", s.next, s.h.Chunks(), err)
				return n, s.err
			}
			s.buf = s.buf[:0]
			s.next++
		}
	}
	return n, nil
}

// Close reports ErrSize if fewer elements than declared were written. It does
// not close the underlying writer.
func (s *Writer) Close() error {
	if s.err != nil {
		return s.err
	}
	if s.seen != s.h.Count {
		return fmt.Errorf("%w: wrote %d of %d declared elements", ErrSize, s.seen, s.h.Count)
	}
	return nil
}
