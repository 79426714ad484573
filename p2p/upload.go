package p2p

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// The upload probe (ProtoUploadProbe): `skein node doctor` sends the
// bootstrap filler chunks for a few seconds, and the bootstrap answers how
// many bytes it received and over how long, timed at its end, so that the
// figure is the rate that arrived, not the rate the sender's buffers took.

// Frame types of the upload probe.
const (
	UploadChunkFrame   byte = 0x55 // filler bytes, at most UploadChunkSize
	UploadEndFrame     byte = 0x56 // the sender is done
	UploadReceiptFrame byte = 0x57 // the receiver's answer (16 bytes)
)

const (
	// UploadChunkSize is the largest chunk of the probe.
	UploadChunkSize = 256 << 10
	// UploadMaxBytes bounds what a receiver reads of one probe.
	UploadMaxBytes = 32 << 20
)

// ErrBadReceipt is returned (wrapped) for an upload receipt that does not
// decode.
var ErrBadReceipt = errors.New("p2p: bad upload receipt")

// UploadReceipt is what the receiver measured: the bytes that arrived after
// the first chunk, and the time from the first chunk's arrival to the
// last's.
type UploadReceipt struct {
	Bytes    int64
	Duration time.Duration
}

// Mbps is the receipt's rate in megabits per second (0 if it timed
// nothing).
func (r UploadReceipt) Mbps() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.Bytes) * 8 / 1e6 / r.Duration.Seconds()
}

// AppendUploadReceipt encodes r: bytes and nanoseconds, 8 bytes each,
// big-endian.
func AppendUploadReceipt(b []byte, r UploadReceipt) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(r.Bytes))
	return binary.BigEndian.AppendUint64(b, uint64(r.Duration))
}

// ParseUploadReceipt decodes a receipt of frame type typ. It never panics.
func ParseUploadReceipt(typ byte, b []byte) (UploadReceipt, error) {
	if typ != UploadReceiptFrame || len(b) != 16 {
		return UploadReceipt{}, fmt.Errorf("%w: frame type %d, %d bytes", ErrBadReceipt, typ, len(b))
	}
	r := UploadReceipt{Bytes: int64(binary.BigEndian.Uint64(b)), Duration: time.Duration(binary.BigEndian.Uint64(b[8:]))}
	if r.Bytes < 0 || r.Bytes > UploadMaxBytes || r.Duration < 0 {
		return UploadReceipt{}, fmt.Errorf("%w: %d bytes in %d ns", ErrBadReceipt, r.Bytes, int64(r.Duration))
	}
	return r, nil
}

// UploadFrameConfig is the probe's framing (a chunk is the largest frame).
func UploadFrameConfig() FrameConfig { return MessageFrameConfig(UploadChunkSize) }

// ServeUploadProbe is the receiving end: it reads chunks until the end
// frame (or UploadMaxBytes), then writes the receipt.
func ServeUploadProbe(st *Stream) error {
	var total, after int64
	var first, last time.Time
	for {
		typ, b, err := st.ReadFrame()
		if err != nil {
			return err
		}
		switch typ {
		case UploadChunkFrame:
			now := time.Now()
			total += int64(len(b))
			if first.IsZero() {
				first = now
			} else {
				after += int64(len(b))
			}
			last = now
			if total > UploadMaxBytes {
				return fmt.Errorf("p2p: upload probe over %d bytes", UploadMaxBytes)
			}
			continue
		case UploadEndFrame:
		default:
			return fmt.Errorf("p2p: upload probe: frame type %d", typ)
		}
		return st.WriteFrame(UploadReceiptFrame, AppendUploadReceipt(nil, UploadReceipt{Bytes: after, Duration: last.Sub(first)}))
	}
}

// MeasureUpload sends p filler chunks for up to maxTime or maxBytes (at
// most UploadMaxBytes) on ProtoUploadProbe and returns p's receipt.
func (n *Node) MeasureUpload(ctx context.Context, p peer.ID, maxBytes int64, maxTime time.Duration) (UploadReceipt, error) {
	maxBytes = min(maxBytes, UploadMaxBytes)
	st, err := n.Open(ctx, p, ProtoUploadProbe, UploadFrameConfig())
	if err != nil {
		return UploadReceipt{}, err
	}
	defer st.Close()
	chunk := make([]byte, UploadChunkSize)
	for i := range chunk {
		chunk[i] = byte(i * 131) // not zeros: nothing on the way may shrink them
	}
	deadline := time.Now().Add(maxTime)
	for sent := int64(0); sent+UploadChunkSize <= maxBytes && time.Now().Before(deadline); sent += UploadChunkSize {
		if err := ctx.Err(); err != nil {
			st.Reset()
			return UploadReceipt{}, err
		}
		if err := st.WriteFrame(UploadChunkFrame, chunk); err != nil {
			st.Reset()
			return UploadReceipt{}, err
		}
	}
	if err := st.WriteFrame(UploadEndFrame, nil); err != nil {
		st.Reset()
		return UploadReceipt{}, err
	}
	typ, b, err := st.ReadFrame()
	if err != nil {
		st.Reset()
		return UploadReceipt{}, err
	}
	return ParseUploadReceipt(typ, b)
}
