package p2p

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// ClockFrame is the frame type of a clock reading on ProtoClock.
const ClockFrame byte = 0x43

// ErrBadClock is returned (wrapped) for a clock reading that does not
// decode.
var ErrBadClock = errors.New("p2p: bad clock reading")

// AppendClock appends t as a clock reading: Unix nanoseconds, 8 bytes
// big-endian.
func AppendClock(b []byte, t time.Time) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(t.UnixNano()))
}

// ParseClock decodes a clock reading of frame type typ. It never panics.
func ParseClock(typ byte, b []byte) (time.Time, error) {
	if typ != ClockFrame || len(b) != 8 {
		return time.Time{}, fmt.Errorf("%w: frame type %d, %d bytes", ErrBadClock, typ, len(b))
	}
	ns := int64(binary.BigEndian.Uint64(b))
	if ns <= 0 {
		return time.Time{}, fmt.Errorf("%w: %d ns", ErrBadClock, ns)
	}
	return time.Unix(0, ns), nil
}
