package compression

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/cespare/xxhash/v2"
	"github.com/klauspost/compress/zstd"
	"github.com/skein-ml/skein/internal/topk"
)

// The sparse codec (issue [3/4]; ALGORITHMS.md 7, SparseLoCo's scheme): a
// pseudo-gradient is cut into chunks of C elements; each chunk sends its K
// largest elements by magnitude, each as 2 bits (its sign, and whether its
// magnitude is in the chunk's upper or lower half of the K), with two
// float32 scales per chunk (the mean magnitude of each half), and their
// positions Elias-Fano coded. Everything else is zero on the wire: the
// sender's error feedback (SparseFeedback) carries it into later rounds. At
// C = 4096 and K = 64 (1.56%) a message costs about (2 + 8 + 1) / 64 of a
// bit per element, about 0.17 bits per parameter before zstd.
//
// Selection is deterministic: larger magnitude first, the lower index
// between equal magnitudes, so every machine sends the same bytes for the
// same tensor. The scales are float64 sums of float32 magnitudes in a fixed
// order, rounded once to float32.
//
// # Wire format, version 1
//
// All integers are little-endian.
//
//	Header (40 bytes)
//	  0  4  magic "SKSP"
//	  4  1  version = 1
//	  5  3  reserved, 0
//	  8  8  element count n (uint64), >= 1
//	 16  4  C, elements per chunk (uint32), in [64, 65536]
//	 20  4  K, elements sent per chunk (uint32), in [1, C]
//	 24  4  zstd payload length P (uint32)
//	 28  4  reserved, 0
//	 32  8  xxhash64 of bytes 0..31 and of the payload
//	Payload: one zstd frame of the body.
//	Body: ceil(n/C) chunks in order; chunk i holds elements [iC, min(iC+C, n)),
//	m of them, and sends k = min(K, m):
//	  8                     float32 lo, float32 hi (finite, 0 <= lo <= hi)
//	  ceil(2k/8)            2-bit codes in element order, code j in bits
//	                        2j..2j+1 (LSB first): bit 0 sign (1 = negative),
//	                        bit 1 magnitude (1 = hi, 0 = lo)
//	  ceil(k*l/8)           Elias-Fano low bits, l = floor(log2(m/k)) (0 when
//	                        m < 2k), index j's l low bits at bit j*l
//	  ceil((k+(m>>l)+1)/8)  Elias-Fano high bits: for each index j in
//	                        increasing order, bit (i>>l)+j set
//
// The body's length is a function of (n, C, K) alone, so a decoder knows
// exactly how much to inflate and refuses anything else. Positions must be
// strictly increasing and below m.
const (
	sparseMagic   = "SKSP"
	sparseVersion = 1
	sparseHeader  = 40
	// MinSparseChunk and MaxSparseChunk bound C.
	MinSparseChunk = 64
	MaxSparseChunk = 1 << 16
)

// ErrSparseFormat is returned (wrapped) for a sparse frame that breaks the
// format.
var ErrSparseFormat = errors.New("compression: malformed sparse frame")

// SparseConfig configures the sparse codec.
type SparseConfig struct {
	Chunk int // C, elements per chunk (default 4096)
	K     int // elements sent per chunk (default 64: 1.56%)
	Level int // zstd level, 1..4 (default 1)
}

// DefaultSparseConfig is SparseLoCo's density: 64 of every 4096.
func DefaultSparseConfig() SparseConfig { return SparseConfig{Chunk: 4096, K: 64, Level: 1} }

// Validate reports a field out of range.
func (c SparseConfig) Validate() error {
	switch {
	case c.Chunk < MinSparseChunk || c.Chunk > MaxSparseChunk:
		return fmt.Errorf("%w: sparse chunk %d out of range [%d, %d]", ErrConfig, c.Chunk, MinSparseChunk, MaxSparseChunk)
	case c.K < 1 || c.K > c.Chunk:
		return fmt.Errorf("%w: sparse K %d out of range [1, %d]", ErrConfig, c.K, c.Chunk)
	case c.Level < 1 || c.Level > 4:
		return fmt.Errorf("%w: zstd level %d out of range [1, 4]", ErrConfig, c.Level)
	}
	return nil
}

// efParams are a chunk's Elias-Fano parameters: low bits l, and the byte
// lengths of the codes, low and high parts.
func efParams(m, k int) (l, codes, lows, highs int) {
	if m >= 2*k {
		l = bits.Len(uint(m/k)) - 1
	}
	return l, (2*k + 7) / 8, (k*l + 7) / 8, (k + (m >> l) + 1 + 7) / 8
}

// chunkBodyLen is the body length of a chunk of m elements sending k.
func chunkBodyLen(m, k int) int {
	_, c, lo, hi := efParams(m, k)
	return 8 + c + lo + hi
}

// sparseBodyLen is the body length of n elements in chunks of c sending k.
func sparseBodyLen(n int64, c, k int) (int64, error) {
	full := n / int64(c)
	total := full * int64(chunkBodyLen(c, k))
	if r := int(n % int64(c)); r > 0 {
		total += int64(chunkBodyLen(r, min(k, r)))
	}
	if total > math.MaxUint32 {
		return 0, fmt.Errorf("%w: a sparse body of %d bytes", ErrConfig, total)
	}
	return total, nil
}

// SparseEncoder encodes tensors with the sparse codec. It keeps its zstd
// state and scratch buffers; it is not safe for concurrent use.
type SparseEncoder struct {
	cfg   SparseConfig
	zenc  *zstd.Encoder
	body  []byte
	keys  []uint64 // the boundary bin's
	sel   []uint64 // the elements above the boundary bin
	out   []uint64 // the sent elements' keys, in index order
	mags  []uint64 // scratch for the halves
	merge []uint64 // scratch for the boundary bin's selection
	cand  []int32  // candidate positions of a chunk
	guess int      // the previous chunk's boundary exponent
}

// NewSparseEncoder returns an encoder for cfg.
func NewSparseEncoder(cfg SparseConfig) (*SparseEncoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	z, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.EncoderLevel(cfg.Level)), zstd.WithEncoderConcurrency(1),
		zstd.WithEncoderCRC(false))
	if err != nil {
		return nil, err
	}
	return &SparseEncoder{cfg: cfg, zenc: z, keys: make([]uint64, 0, cfg.Chunk), sel: make([]uint64, 0, cfg.K),
		mags: make([]uint64, 0, cfg.K), cand: make([]int32, cfg.Chunk)}, nil
}

// Config is the encoder's configuration.
func (e *SparseEncoder) Config() SparseConfig { return e.cfg }

// Append appends the frame of x to dst. sent, if not nil (len(x)), is set
// to what the receiver decodes: zero everywhere but at the sent elements.
// A non-finite element, or one past 2^126 in magnitude, is an error
// (ErrNonFinite).
func (e *SparseEncoder) Append(dst []byte, x []float32, sent []float32) ([]byte, error) {
	return e.appendFrame(dst, x, nil, sent, false)
}

// AppendSubtract is Append that subtracts what the receivers decode from x
// in place, leaving x the residual: error feedback without a second
// tensor. On error x may be partly updated.
func (e *SparseEncoder) AppendSubtract(dst []byte, x []float32) ([]byte, error) {
	return e.appendFrame(dst, x, nil, nil, true)
}

// appendFrame encodes x (after x += add when add is not nil).
func (e *SparseEncoder) appendFrame(dst []byte, x, add []float32, sent []float32, sub bool) ([]byte, error) {
	n := len(x)
	if n == 0 {
		return dst, fmt.Errorf("%w: an empty tensor", ErrConfig)
	}
	if sent != nil && len(sent) != n {
		return dst, fmt.Errorf("%w: sent has %d elements, x %d", ErrConfig, len(sent), n)
	}
	c, k := e.cfg.Chunk, e.cfg.K
	size, err := sparseBodyLen(int64(n), c, k)
	if err != nil {
		return dst, err
	}
	e.body = e.body[:0]
	if sent != nil {
		clear(sent)
	}
	for base := 0; base < n; base += c {
		m := min(c, n-base)
		var out []float32
		if sent != nil {
			out = sent[base : base+m]
		}
		var a []float32
		if add != nil {
			a = add[base : base+m]
		}
		if e.body, err = e.chunk(e.body, x[base:base+m], a, min(k, m), out, sub, base); err != nil {
			return dst, err
		}
	}
	if int64(len(e.body)) != size {
		panic(fmt.Sprintf("compression: sparse body of %d bytes, want %d", len(e.body), size))
	}
	start := len(dst)
	dst = append(dst, make([]byte, sparseHeader)...)
	dst = e.zenc.EncodeAll(e.body, dst)
	h := dst[start : start+sparseHeader]
	copy(h, sparseMagic)
	h[4] = sparseVersion
	binary.LittleEndian.PutUint64(h[8:], uint64(n))
	binary.LittleEndian.PutUint32(h[16:], uint32(c))
	binary.LittleEndian.PutUint32(h[20:], uint32(k))
	binary.LittleEndian.PutUint32(h[24:], uint32(len(dst)-start-sparseHeader))
	d := xxhash.New()
	d.Write(h[:32])
	d.Write(dst[start+sparseHeader:])
	binary.LittleEndian.PutUint64(h[32:], d.Sum64())
	return dst, nil
}

// chunk appends the body of one chunk: its k largest elements. Either sent
// (when not nil) receives what the receiver decodes, or, with sub, the
// decoded values are subtracted from x in place (error feedback). add, if
// not nil, is added to x first (x += add, the feedback's accumulation,
// done here while the chunk is in cache).
func (e *SparseEncoder) chunk(b []byte, x, add []float32, k int, sent []float32, sub bool, base int) ([]byte, error) {
	m := len(x)
	if add != nil {
		for i, d := range add[:m] {
			x[i] += d
		}
	}
	// Radix select of the k-th largest magnitude: a histogram of the
	// exponent byte; meanwhile the positions whose exponent is at least
	// the previous chunk's boundary less one (a guess, almost always
	// right: neighbouring chunks have alike magnitudes) are kept, so that
	// the second pass runs over them only.
	var hist [256]int32
	guess := max(e.guess-1, 0)
	cand := e.cand[:m]
	nc := 0
	for i, v := range x {
		a := math.Float32bits(v) &^ (1 << 31)
		if a > 0x7e800000 { // |v| > 2^126, NaN and Inf included
			return b, fmt.Errorf("%w: element %d is %v, beyond the sparse codec's 2^126", ErrNonFinite, base+i, v)
		}
		ex := int(a >> 23)
		hist[ex]++
		cand[nc] = int32(i)
		if ex >= guess {
			nc++
		}
	}
	above, bin := 0, 255
	for ; bin > 0 && above+int(hist[bin]) < k; bin-- {
		above += int(hist[bin])
	}
	e.guess = bin
	if bin < guess { // the guess missed: every position is a candidate
		for i := range cand {
			cand[i] = int32(i)
		}
		nc = m
	}
	// The elements above the boundary bin (all sent) and the keys of the
	// boundary bin (larger magnitude first, the lower index between
	// equals), both in index order.
	keys, sel := e.keys[:0], e.sel[:0]
	for _, i := range cand[:nc] {
		a := math.Float32bits(x[i]) &^ (1 << 31)
		key := uint64(a)<<32 | uint64(math.MaxUint32-uint32(i))
		switch ex := int(a >> 23); {
		case ex > bin:
			sel = append(sel, key)
		case ex == bin:
			keys = append(keys, key)
		}
	}
	// The boundary bin's k - above largest: those at or above the
	// (k-above)-th largest key, taken in index order.
	scratch := append(e.merge[:0], keys...)
	cutoff := slices.Min(topk.Largest(scratch, k-above))
	e.merge = scratch
	chosen := keys[:0]
	for _, key := range keys {
		if key >= cutoff {
			chosen = append(chosen, key)
		}
	}
	sel = mergeByIndex(sel, chosen, e.out[:0])
	e.keys, e.out = keys, sel
	if len(sel) != k {
		panic(fmt.Sprintf("compression: selected %d of %d", len(sel), k))
	}
	// Magnitude halves: the h largest of the k are hi; the scales sum the
	// magnitudes in index order.
	h := (k + 1) / 2
	byMag := append(e.mags[:0], sel...)
	cutKey := slices.Min(topk.Largest(byMag, h)) // hi iff key >= cutKey
	e.mags = byMag
	var shi, slo float64
	for _, key := range sel {
		a := float64(math.Float32frombits(uint32(key >> 32)))
		if key >= cutKey {
			shi += a
		} else {
			slo += a
		}
	}
	hi := float32(shi / float64(h))
	lo := float32(0)
	if k > h {
		lo = float32(slo / float64(k-h))
	}
	l, nc, nl, nh := efParams(m, k)
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(lo))
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(hi))
	codes := len(b)
	b = append(b, make([]byte, nc+nl+nh)...)
	lows, highs := codes+nc, codes+nc+nl
	for j, key := range sel {
		i := int(math.MaxUint32 - uint32(key))
		v := x[i]
		var code byte
		if math.Signbit(float64(v)) {
			code |= 1
		}
		mag := lo
		if key >= cutKey {
			code |= 2
			mag = hi
		}
		b[codes+j/4] |= code << (2 * (j % 4))
		if code&1 != 0 {
			mag = -mag
		}
		switch {
		case sent != nil:
			sent[i] = mag
		case sub:
			x[i] = v - mag
		}
		// Elias-Fano.
		for t := range l {
			if i>>t&1 != 0 {
				bit := j*l + t
				b[lows+bit/8] |= 1 << (bit % 8)
			}
		}
		bit := i>>l + j
		b[highs+bit/8] |= 1 << (bit % 8)
	}
	return b, nil
}

// mergeByIndex merges two lists of keys each in increasing index order
// (decreasing low halves) into out.
func mergeByIndex(a, b, out []uint64) []uint64 {
	for len(a) > 0 && len(b) > 0 {
		if uint32(a[0]) > uint32(b[0]) { // a's index is lower
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	out = append(out, a...)
	return append(out, b...)
}

// Close releases the zstd encoder.
func (e *SparseEncoder) Close() error { return e.zenc.Close() }

// SparseHeader is a sparse frame's header, parsed.
type SparseHeader struct {
	Count    int64
	Chunk, K int
	Payload  int
}

// SparseDecoder decodes sparse frames. It is not safe for concurrent use.
type SparseDecoder struct {
	zdec *zstd.Decoder
	body []byte
}

// NewSparseDecoder returns a decoder.
func NewSparseDecoder() (*SparseDecoder, error) {
	z, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(1<<32))
	if err != nil {
		return nil, err
	}
	return &SparseDecoder{zdec: z}, nil
}

// Close releases the zstd decoder.
func (d *SparseDecoder) Close() { d.zdec.Close() }

// ParseSparseHeader checks a sparse frame's header for a tensor of n
// elements (the caller's: nothing is sized from the sender's word) and
// returns it.
func ParseSparseHeader(b []byte, n int) (SparseHeader, error) {
	bad := func(f string, a ...any) (SparseHeader, error) {
		return SparseHeader{}, fmt.Errorf("%w: %s", ErrSparseFormat, fmt.Sprintf(f, a...))
	}
	if len(b) < sparseHeader {
		return bad("%d bytes, shorter than the %d-byte header", len(b), sparseHeader)
	}
	h := SparseHeader{Count: int64(binary.LittleEndian.Uint64(b[8:])), Chunk: int(binary.LittleEndian.Uint32(b[16:])),
		K: int(binary.LittleEndian.Uint32(b[20:])), Payload: int(binary.LittleEndian.Uint32(b[24:]))}
	switch {
	case string(b[:4]) != sparseMagic:
		return bad("magic %q", b[:4])
	case b[4] != sparseVersion:
		return bad("version %d, want %d", b[4], sparseVersion)
	case b[5] != 0 || b[6] != 0 || b[7] != 0 || binary.LittleEndian.Uint32(b[28:]) != 0:
		return bad("reserved bytes not zero")
	case h.Count != int64(n):
		return bad("%d elements, want %d", h.Count, n)
	case h.Chunk < MinSparseChunk || h.Chunk > MaxSparseChunk:
		return bad("chunk %d out of range", h.Chunk)
	case h.K < 1 || h.K > h.Chunk:
		return bad("K %d out of range [1, %d]", h.K, h.Chunk)
	}
	return h, nil
}

// Decode decodes the frame b of a tensor of len(dst) elements into dst
// (zero but at the sent elements). b must be exactly one frame.
func (d *SparseDecoder) Decode(b []byte, dst []float32) error {
	clear(dst)
	return d.decode(b, dst, false)
}

// DecodeAdd adds the frame's values to dst (an aggregate's sum): it
// touches only the sent elements. On error dst may be partly updated.
func (d *SparseDecoder) DecodeAdd(b []byte, dst []float32) error {
	return d.decode(b, dst, true)
}

func (d *SparseDecoder) decode(b []byte, dst []float32, add bool) error {
	h, err := ParseSparseHeader(b, len(dst))
	if err != nil {
		return err
	}
	if len(b) != sparseHeader+h.Payload {
		return fmt.Errorf("%w: %d bytes, the header says %d", ErrSparseFormat, len(b), sparseHeader+h.Payload)
	}
	x := xxhash.New()
	x.Write(b[:32])
	x.Write(b[sparseHeader:])
	if x.Sum64() != binary.LittleEndian.Uint64(b[32:]) {
		return fmt.Errorf("%w: checksum mismatch", ErrSparseFormat)
	}
	size, err := sparseBodyLen(h.Count, h.Chunk, h.K)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSparseFormat, err)
	}
	if cap(d.body) < int(size) {
		d.body = make([]byte, 0, size)
	}
	body, err := d.zdec.DecodeAll(b[sparseHeader:], d.body[:0])
	if err != nil {
		return fmt.Errorf("%w: zstd: %v", ErrSparseFormat, err)
	}
	if len(body) != int(size) {
		return fmt.Errorf("%w: body of %d bytes, want %d", ErrSparseFormat, len(body), size)
	}
	d.body = body[:0]
	n := len(dst)
	for base := 0; base < n; base += h.Chunk {
		m := min(h.Chunk, n-base)
		k := min(h.K, m)
		cl := chunkBodyLen(m, k)
		if err := decodeSparseChunk(body[:cl], dst[base:base+m], k, base, add); err != nil {
			return err
		}
		body = body[cl:]
	}
	return nil
}

// decodeSparseChunk decodes one chunk's body into dst (zeroed), or adds it.
func decodeSparseChunk(b []byte, dst []float32, k, base int, add bool) error {
	m := len(dst)
	lo, hi := math.Float32frombits(binary.LittleEndian.Uint32(b)), math.Float32frombits(binary.LittleEndian.Uint32(b[4:]))
	if !(lo >= 0 && hi >= lo && hi <= 1<<126) {
		return fmt.Errorf("%w: chunk at %d: scales %v, %v", ErrSparseFormat, base, lo, hi)
	}
	l, nc, nl, nh := efParams(m, k)
	codes, lows, highs := b[8:8+nc], b[8+nc:8+nc+nl], b[8+nc+nl:8+nc+nl+nh]
	prev := -1
	bit := 0 // position in highs
	for j := range k {
		// The next set bit of highs: (i>>l) + j.
		for bit < 8*nh && highs[bit/8]>>(bit%8)&1 == 0 {
			bit++
		}
		if bit >= 8*nh {
			return fmt.Errorf("%w: chunk at %d: %d positions of %d", ErrSparseFormat, base, j, k)
		}
		i := (bit - j) << l
		bit++
		for t := range l {
			q := j*l + t
			i |= int(lows[q/8]>>(q%8)&1) << t
		}
		if i <= prev || i >= m {
			return fmt.Errorf("%w: chunk at %d: position %d after %d (chunk of %d)", ErrSparseFormat, base, i, prev, m)
		}
		prev = i
		code := codes[j/4] >> (2 * (j % 4)) & 3
		v := lo
		if code&2 != 0 {
			v = hi
		}
		if code&1 != 0 {
			v = -v
		}
		if add {
			dst[i] += v
		} else {
			dst[i] = v
		}
	}
	return nil
}

// SparseFeedback is the volunteer's error feedback for the sparse codec,
// in one place before the wire (ALGORITHMS.md 5, 7): with residual e, a
// round's pseudo-gradient delta becomes acc = beta*e + delta, the message
// encodes acc, and e = acc - what the receivers decode. With beta = 1 the
// sum of what was sent telescopes to the sum of what was meant minus e.
type SparseFeedback struct {
	e    []float32
	beta float32
}

// NewSparseFeedback returns zeroed feedback for tensors of n elements with
// decay beta in (0, 1].
func NewSparseFeedback(n int, beta float32) (*SparseFeedback, error) {
	if !(beta > 0 && beta <= 1) || n < 1 {
		return nil, fmt.Errorf("%w: sparse feedback of %d elements, decay %v", ErrConfig, n, beta)
	}
	return &SparseFeedback{e: make([]float32, n), beta: beta}, nil
}

// Residual is e (callers must not modify it).
func (f *SparseFeedback) Residual() []float32 { return f.e }

// Encode appends the frame of beta*e + delta to dst and keeps what it did
// not send, in one pass over the tensor (the accumulation happens chunk by
// chunk inside the encoder, while the chunk is in cache). On an error (a
// non-finite element: ErrNonFinite) the residual is left part updated and
// the message was not sent: Reset it.
func (f *SparseFeedback) Encode(enc *SparseEncoder, dst []byte, delta []float32) ([]byte, error) {
	if len(delta) != len(f.e) {
		return dst, fmt.Errorf("%w: delta of %d elements, feedback of %d", ErrConfig, len(delta), len(f.e))
	}
	if f.beta != 1 {
		for i := range f.e {
			f.e[i] = float32(f.beta * f.e[i]) // rounded alone: no fused multiply-add
		}
	}
	return enc.appendFrame(dst, f.e, delta, nil, true)
}

// Reset zeroes the residual.
func (f *SparseFeedback) Reset() { clear(f.e) }
