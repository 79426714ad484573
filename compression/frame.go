package compression

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/cespare/xxhash/v2"
)

// Wire format constants; the layout is documented in doc.go.
const (
	Magic          = "SKNT"
	Version        = 1
	headerLen      = 32
	chunkHeaderLen = 20

	flagStochastic = 1 << 0 // header flag: encoded with stochastic rounding (informational)
	flagZstd       = 1 << 0 // chunk flag: payload is one zstd frame
)

// Header describes an encoded tensor, as read from its frame header.
type Header struct {
	Codec      Codec
	Count      int64 // elements in the tensor
	BlockSize  int
	ChunkElems int // elements per chunk; the last chunk may be shorter
	Stochastic bool
}

// Chunks returns the number of chunks that follow the header.
func (h Header) Chunks() int {
	return int((h.Count + int64(h.ChunkElems) - 1) / int64(h.ChunkElems))
}

// chunkEnd returns the element index just past chunk ci.
func (h Header) chunkEnd(ci int) int {
	return int(min(int64(ci+1)*int64(h.ChunkElems), h.Count))
}

// chunkLen returns the element count of chunk ci.
func (h Header) chunkLen(ci int) int {
	lo := int64(ci) * int64(h.ChunkElems)
	return int(min(int64(h.ChunkElems), h.Count-lo))
}

func putHeader(b *[headerLen]byte, h Header) {
	copy(b[0:4], Magic)
	b[4] = Version
	b[5] = byte(h.Codec)
	b[6] = 0
	if h.Stochastic {
		b[6] = flagStochastic
	}
	b[7] = 0
	binary.LittleEndian.PutUint64(b[8:], uint64(h.Count))
	binary.LittleEndian.PutUint32(b[16:], uint32(h.BlockSize))
	binary.LittleEndian.PutUint32(b[20:], uint32(h.ChunkElems))
	binary.LittleEndian.PutUint64(b[24:], xxhash.Sum64(b[:24]))
}

// parseHeader validates a frame header against the limit on element count.
func parseHeader(b *[headerLen]byte, maxElems int64) (Header, error) {
	if string(b[0:4]) != Magic {
		return Header{}, fmt.Errorf("%w: header starts with %q, want %q", ErrBadMagic, b[0:4], Magic)
	}
	if b[4] != Version {
		return Header{}, fmt.Errorf("%w: header version %d, this build reads %d", ErrVersion, b[4], Version)
	}
	if got, want := binary.LittleEndian.Uint64(b[24:]), xxhash.Sum64(b[:24]); got != want {
		return Header{}, fmt.Errorf("%w: header checksum %#016x, computed %#016x", ErrChecksum, got, want)
	}
	h := Header{
		Codec:      Codec(b[5]),
		Stochastic: b[6]&flagStochastic != 0,
	}
	if !h.Codec.valid() {
		return Header{}, fmt.Errorf("%w: header codec id %d", ErrCodec, b[5])
	}
	if b[6]&^flagStochastic != 0 || b[7] != 0 {
		return Header{}, fmt.Errorf("%w: header flags %#02x reserved %#02x, want unknown bits zero", ErrCorrupt, b[6], b[7])
	}
	count := binary.LittleEndian.Uint64(b[8:])
	if count > uint64(maxElems) {
		return Header{}, fmt.Errorf("%w: header declares %d elements, limit %d", ErrTooLarge, count, maxElems)
	}
	h.Count = int64(count)
	block := int64(binary.LittleEndian.Uint32(b[16:]))
	if err := checkBlockSize(block); err != nil {
		return Header{}, fmt.Errorf("header: %w", err)
	}
	h.BlockSize = int(block)
	ce := int64(binary.LittleEndian.Uint32(b[20:]))
	if ce > MaxChunkElems {
		return Header{}, fmt.Errorf("%w: header declares %d elements per chunk, limit %d", ErrTooLarge, ce, MaxChunkElems)
	}
	if err := checkChunkElems(ce, h.BlockSize); err != nil {
		return Header{}, fmt.Errorf("%w: header: %w", ErrCorrupt, err)
	}
	h.ChunkElems = int(ce)
	return h, nil
}

// putChunkHeader fills out[0:20] for a chunk whose stored payload is out[20:].
func putChunkHeader(out []byte, ci int, flags byte) {
	binary.LittleEndian.PutUint32(out[8:], uint32(ci))
	out[12] = flags
	out[13], out[14], out[15] = 0, 0, 0
	binary.LittleEndian.PutUint32(out[16:], uint32(len(out)-chunkHeaderLen))
	binary.LittleEndian.PutUint64(out[0:], xxhash.Sum64(out[8:]))
}

// readFull reads len(b) bytes, turning EOF into ErrTruncated with context:
// what, and "chunk ci of nc" when ci >= 0.
func readFull(r io.Reader, b []byte, what string, ci, nc int) error {
	n, err := io.ReadFull(r, b)
	if err == nil {
		return nil
	}
	if ci >= 0 {
		what = fmt.Sprintf("chunk %d of %d %s", ci, nc, what)
	}
	return readErr(err, what, n, len(b))
}

// readErr reports a failed read of want bytes of what, of which got arrived.
func readErr(err error, what string, got, want int) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: %s ends after %d of %d bytes", ErrTruncated, what, got, want)
	}
	return fmt.Errorf("compression: reading %s: %w", what, err)
}
