package p2p

import (
	"encoding/binary"
	"fmt"
	"io"
	"time"

	pool "github.com/libp2p/go-buffer-pool"
)

// FrameHeaderLen is the size of a frame header on the wire:
//
//	type u8 | version u8 | flags u16 (must be 0) | payload length u32, big endian
const FrameHeaderLen = 8

// Defaults for FrameConfig.
const (
	DefaultMaxFrame     = 1 << 20
	DefaultFrameTimeout = 30 * time.Second
)

// DeadlineReadWriter is what frames travel on: a libp2p network.Stream, a
// net.Conn, or anything with per-direction deadlines.
type DeadlineReadWriter interface {
	io.ReadWriter
	SetReadDeadline(time.Time) error
	SetWriteDeadline(time.Time) error
}

// FrameConfig bounds one framed stream.
type FrameConfig struct {
	Version      uint8         // frames of another version are ErrBadFrame
	MaxSize      uint32        // largest payload accepted, checked before allocation
	ReadTimeout  time.Duration // deadline for reading one whole frame
	WriteTimeout time.Duration // deadline for writing one whole frame
}

// DefaultFrameConfig returns version 1, 1 MiB frames and 30 s deadlines.
func DefaultFrameConfig() FrameConfig {
	return FrameConfig{Version: 1, MaxSize: DefaultMaxFrame, ReadTimeout: DefaultFrameTimeout, WriteTimeout: DefaultFrameTimeout}
}

// MessageFrameConfig is the config of a protocol of one small message per
// stream (a manifest, a telemetry report): frames of at most maxSize bytes,
// each read and write bounded by 10 seconds.
func MessageFrameConfig(maxSize uint32) FrameConfig {
	c := DefaultFrameConfig()
	c.MaxSize, c.ReadTimeout, c.WriteTimeout = maxSize, 10*time.Second, 10*time.Second
	return c
}

// Validate names the offending value.
func (c FrameConfig) Validate() error {
	if c.MaxSize == 0 || c.MaxSize > 1<<30 {
		return fmt.Errorf("p2p: frame MaxSize %d out of range [1, 1<<30]", c.MaxSize)
	}
	if c.ReadTimeout <= 0 || c.WriteTimeout <= 0 {
		return fmt.Errorf("p2p: frame timeouts read=%v write=%v must be positive", c.ReadTimeout, c.WriteTimeout)
	}
	return nil
}

// FrameStream reads and writes typed, length-prefixed frames with a deadline on
// every frame. It reuses one read buffer: a payload returned by ReadFrame is
// valid until the next ReadFrame. It is not safe for concurrent readers or
// concurrent writers (one of each is fine).
type FrameStream struct {
	rw   DeadlineReadWriter
	cfg  FrameConfig
	rhdr [FrameHeaderLen]byte
	buf  []byte
}

// NewFrameStream wraps rw. cfg must be valid (see FrameConfig.Validate).
func NewFrameStream(rw DeadlineReadWriter, cfg FrameConfig) *FrameStream {
	return &FrameStream{rw: rw, cfg: cfg}
}

// Config returns the stream's limits.
func (f *FrameStream) Config() FrameConfig { return f.cfg }

// WriteFrame writes one frame. Small frames go out in one write.
func (f *FrameStream) WriteFrame(typ uint8, payload []byte) error {
	if uint64(len(payload)) > uint64(f.cfg.MaxSize) {
		return fmt.Errorf("%w: writing %d bytes, limit %d", ErrFrameTooLarge, len(payload), f.cfg.MaxSize)
	}
	if err := f.rw.SetWriteDeadline(time.Now().Add(f.cfg.WriteTimeout)); err != nil {
		return err
	}
	var hdr [FrameHeaderLen]byte
	putFrameHeader(hdr[:], typ, f.cfg.Version, uint32(len(payload)))
	if len(payload) <= 64<<10 {
		b := pool.Get(FrameHeaderLen + len(payload))
		copy(b, hdr[:])
		copy(b[FrameHeaderLen:], payload)
		_, err := f.rw.Write(b)
		pool.Put(b)
		return err
	}
	if _, err := f.rw.Write(hdr[:]); err != nil {
		return err
	}
	_, err := f.rw.Write(payload)
	return err
}

// ReadFrame reads one frame. An oversized length is rejected with
// ErrFrameTooLarge before anything is allocated; a wrong version or nonzero
// flags with ErrBadFrame; a frame not complete within ReadTimeout with the
// deadline error. On any error the caller should Reset the stream.
func (f *FrameStream) ReadFrame() (typ uint8, payload []byte, err error) {
	if err := f.rw.SetReadDeadline(time.Now().Add(f.cfg.ReadTimeout)); err != nil {
		return 0, nil, err
	}
	if _, err := io.ReadFull(f.rw, f.rhdr[:]); err != nil {
		return 0, nil, err
	}
	typ, n, err := parseFrameHeader(f.rhdr[:], f.cfg)
	if err != nil {
		return 0, nil, err
	}
	// Grow the buffer as bytes arrive, at most doubling, so that a header
	// that declares a large frame pins no more memory than the peer has
	// actually sent (plus 1 MiB).
	f.buf = f.buf[:0]
	for len(f.buf) < int(n) {
		want := min(int(n), max(2*len(f.buf), 1<<20))
		if cap(f.buf) < want {
			grown := make([]byte, len(f.buf), want)
			copy(grown, f.buf)
			f.buf = grown
		}
		got, err := io.ReadFull(f.rw, f.buf[len(f.buf):want])
		f.buf = f.buf[:len(f.buf)+got]
		if err != nil {
			return 0, nil, err
		}
	}
	return typ, f.buf, nil
}

func putFrameHeader(b []byte, typ, version uint8, n uint32) {
	b[0], b[1], b[2], b[3] = typ, version, 0, 0
	binary.BigEndian.PutUint32(b[4:], n)
}

func parseFrameHeader(b []byte, cfg FrameConfig) (typ uint8, n uint32, err error) {
	if b[1] != cfg.Version {
		return 0, 0, fmt.Errorf("%w: version %d, want %d", ErrBadFrame, b[1], cfg.Version)
	}
	if b[2] != 0 || b[3] != 0 {
		return 0, 0, fmt.Errorf("%w: reserved flags %#02x%02x set", ErrBadFrame, b[2], b[3])
	}
	n = binary.BigEndian.Uint32(b[4:])
	if n > cfg.MaxSize {
		return 0, 0, fmt.Errorf("%w: %d bytes, limit %d", ErrFrameTooLarge, n, cfg.MaxSize)
	}
	return b[0], n, nil
}
