package compression

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/cespare/xxhash/v2"
)

// FeedbackMode selects the error feedback rule (ALGORITHMS.md 5).
type FeedbackMode uint8

const (
	// EF keeps the residual e: it sends c = C(x + e) and sets e = x + e - c.
	EF FeedbackMode = 1
	// EF21 keeps the estimate g: it sends c = C(x - g) and sets g = g + c.
	// The receiver reconstructs x by keeping its own g += decode(c) per sender.
	EF21 FeedbackMode = 2
)

func (m FeedbackMode) String() string {
	switch m {
	case EF:
		return "ef"
	case EF21:
		return "ef21"
	}
	return fmt.Sprintf("feedback(%d)", uint8(m))
}

// ErrorFeedback wraps any codec so that what one message loses is carried
// into the next. Its state is one float32 per tensor element; it is saved with
// the node's checkpoint through WriteTo/ReadFrom (or MarshalBinary). It is not
// safe for concurrent use.
//
// On an error from Encode the state may have been updated for the chunks
// already encoded; the message was not delivered, so Reset (or reload) it.
type ErrorFeedback struct {
	mode  FeedbackMode
	state []float32
}

// NewErrorFeedback returns zeroed error feedback state for tensors of n elements.
func NewErrorFeedback(mode FeedbackMode, n int) (*ErrorFeedback, error) {
	if mode != EF && mode != EF21 {
		return nil, fmt.Errorf("%w: feedback mode %d (want 1 ef or 2 ef21)", ErrConfig, uint8(mode))
	}
	if n < 0 {
		return nil, fmt.Errorf("%w: feedback length %d is negative", ErrConfig, n)
	}
	return &ErrorFeedback{mode: mode, state: make([]float32, n)}, nil
}

// Mode returns the feedback rule.
func (f *ErrorFeedback) Mode() FeedbackMode { return f.mode }

// State returns the residual (EF) or estimate (EF21); callers must not modify it.
func (f *ErrorFeedback) State() []float32 { return f.state }

// Reset zeroes the state.
func (f *ErrorFeedback) Reset() { clear(f.state) }

// Encode writes the frame for x with feedback applied, using e's codec, and
// updates the state with exactly what the receiver will decode. The bytes do
// not depend on e's worker count.
func (f *ErrorFeedback) Encode(e *Encoder, w io.Writer, x []float32, seed uint64) error {
	return e.encode(w, x, seed, f)
}

// input writes the value to compress for elements lo.. of x into v.
func (f *ErrorFeedback) input(v, x []float32, lo int) []float32 {
	s := f.state[lo : lo+len(x)]
	v = v[:len(x)]
	if f.mode == EF {
		for i := range v {
			v[i] = x[i] + s[i]
		}
	} else {
		for i := range v {
			v[i] = x[i] - s[i]
		}
	}
	return v
}

// update records the decoded message c of input v for elements lo...
func (f *ErrorFeedback) update(lo int, v, c []float32) {
	s := f.state[lo : lo+len(v)]
	c = c[:len(v)]
	if f.mode == EF {
		for i := range s {
			s[i] = v[i] - c[i]
		}
	} else {
		for i := range s {
			s[i] += c[i]
		}
	}
}

// Serialized state: "SKEF", version 1, mode, 2 zero bytes, element count
// (uint64 LE), the values (float32 LE), xxhash64 (LE) of all preceding bytes.
const (
	feedbackMagic     = "SKEF"
	feedbackHeaderLen = 16
)

// WriteTo writes the state in a few KiB at a time.
func (f *ErrorFeedback) WriteTo(w io.Writer) (int64, error) {
	var buf [4096]byte
	copy(buf[:4], feedbackMagic)
	buf[4], buf[5], buf[6], buf[7] = Version, byte(f.mode), 0, 0
	binary.LittleEndian.PutUint64(buf[8:], uint64(len(f.state)))
	d := xxhash.New()
	var total int64
	emit := func(b []byte) error {
		d.Write(b)
		n, err := w.Write(b)
		total += int64(n)
		return err
	}
	if err := emit(buf[:feedbackHeaderLen]); err != nil {
		return total, err
	}
	s := f.state
	for len(s) > 0 {
		k := min(len(s), len(buf)/4)
		for i, v := range s[:k] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(v))
		}
		if err := emit(buf[:4*k]); err != nil {
			return total, err
		}
		s = s[k:]
	}
	binary.LittleEndian.PutUint64(buf[:8], d.Sum64())
	n, err := w.Write(buf[:8])
	return total + int64(n), err
}

// ReadFrom replaces the state with one written by WriteTo. The saved state
// must have the same mode and length as f, so nothing is allocated from what
// the input declares; on error f is unchanged.
func (f *ErrorFeedback) ReadFrom(r io.Reader) (int64, error) {
	var buf [4096]byte
	var total int64
	d := xxhash.New()
	read := func(b []byte, what string) error {
		err := readFull(r, b, what, -1, 0)
		if err == nil {
			total += int64(len(b))
			d.Write(b)
		}
		return err
	}
	if err := read(buf[:feedbackHeaderLen], "error feedback header"); err != nil {
		return total, err
	}
	mode, n, err := parseFeedbackHeader(buf[:feedbackHeaderLen])
	if err != nil {
		return total, err
	}
	if mode != f.mode || n != uint64(len(f.state)) {
		return total, fmt.Errorf("%w: saved error feedback is %v with %d elements, want %v with %d", ErrSize, mode, n, f.mode, len(f.state))
	}
	// Stage the values; they replace the state only once the checksum matches.
	tmp := make([]float32, len(f.state))
	for off := 0; off < len(tmp); {
		k := min(len(tmp)-off, len(buf)/4)
		if err := read(buf[:4*k], "error feedback values"); err != nil {
			return total, err
		}
		for i := range k {
			tmp[off+i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
		}
		off += k
	}
	sum := d.Sum64()
	if err := readFull(r, buf[:8], "error feedback checksum", -1, 0); err != nil {
		return total, err
	}
	total += 8
	if got := binary.LittleEndian.Uint64(buf[:8]); got != sum {
		return total, fmt.Errorf("%w: error feedback stored %#016x, computed %#016x", ErrChecksum, got, sum)
	}
	if m := absmaxBits(tmp); m >= expMask {
		return total, fmt.Errorf("error feedback state: %w", nonFinite(tmp, 0))
	}
	copy(f.state, tmp)
	return total, nil
}

func parseFeedbackHeader(b []byte) (FeedbackMode, uint64, error) {
	if string(b[:4]) != feedbackMagic {
		return 0, 0, fmt.Errorf("%w: error feedback starts with %q, want %q", ErrBadMagic, b[:4], feedbackMagic)
	}
	if b[4] != Version {
		return 0, 0, fmt.Errorf("%w: error feedback version %d, this build reads %d", ErrVersion, b[4], Version)
	}
	mode := FeedbackMode(b[5])
	if mode != EF && mode != EF21 {
		return 0, 0, fmt.Errorf("%w: error feedback mode %d", ErrCorrupt, b[5])
	}
	if b[6] != 0 || b[7] != 0 {
		return 0, 0, fmt.Errorf("%w: error feedback reserved bytes % x", ErrCorrupt, b[6:8])
	}
	return mode, binary.LittleEndian.Uint64(b[8:]), nil
}

// MarshalBinary returns the state as WriteTo writes it.
func (f *ErrorFeedback) MarshalBinary() ([]byte, error) {
	var b bytes.Buffer
	b.Grow(feedbackHeaderLen + 4*len(f.state) + 8)
	_, err := f.WriteTo(&b)
	return b.Bytes(), err
}

// UnmarshalBinary replaces f (mode and length included) with the saved state
// in data. It allocates only after checking that data's length matches the
// declared element count.
func (f *ErrorFeedback) UnmarshalBinary(data []byte) error {
	if len(data) < feedbackHeaderLen+8 {
		return fmt.Errorf("%w: error feedback is %d bytes, minimum %d", ErrTruncated, len(data), feedbackHeaderLen+8)
	}
	mode, n, err := parseFeedbackHeader(data[:feedbackHeaderLen])
	if err != nil {
		return err
	}
	if want := uint64(len(data)-feedbackHeaderLen-8) / 4; n != want || (len(data)-feedbackHeaderLen-8)%4 != 0 {
		if n > want {
			return fmt.Errorf("%w: error feedback declares %d elements, %d bytes hold %d", ErrTruncated, n, len(data), want)
		}
		return fmt.Errorf("%w: error feedback declares %d elements but is %d bytes long", ErrCorrupt, n, len(data))
	}
	g := &ErrorFeedback{mode: mode, state: make([]float32, n)}
	if _, err := g.ReadFrom(bytes.NewReader(data)); err != nil {
		return err
	}
	*f = *g
	return nil
}
