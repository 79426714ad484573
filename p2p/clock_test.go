package p2p

import (
	"errors"
	"testing"
	"time"
)

func TestClockReading(t *testing.T) {
	now := time.Unix(1795000000, 123456789)
	got, err := ParseClock(ClockFrame, AppendClock(nil, now))
	if err != nil || !got.Equal(now) {
		t.Fatalf("%v, %v", got, err)
	}
	for _, c := range []struct {
		typ byte
		b   []byte
	}{
		{ClockFrame, nil},
		{ClockFrame, make([]byte, 9)},
		{ClockFrame, make([]byte, 8)}, // the zero time
		{ClockFrame, []byte{0xff, 0, 0, 0, 0, 0, 0, 0}},
		{ClockFrame + 1, AppendClock(nil, now)},
	} {
		if _, err := ParseClock(c.typ, c.b); !errors.Is(err, ErrBadClock) {
			t.Errorf("%d %x: %v, want ErrBadClock", c.typ, c.b, err)
		}
	}
}

func FuzzParseClock(f *testing.F) {
	f.Add(ClockFrame, AppendClock(nil, time.Unix(1795000000, 0)))
	f.Fuzz(func(t *testing.T, typ byte, b []byte) {
		if tm, err := ParseClock(typ, b); err == nil && string(AppendClock(nil, tm)) != string(b) {
			t.Fatal("decode then encode changed the bytes")
		}
	})
}

func FuzzParseUploadReceipt(f *testing.F) {
	f.Add(UploadReceiptFrame, AppendUploadReceipt(nil, UploadReceipt{Bytes: 8 << 20, Duration: 3 * time.Second}))
	f.Fuzz(func(t *testing.T, typ byte, b []byte) {
		if r, err := ParseUploadReceipt(typ, b); err == nil && string(AppendUploadReceipt(nil, r)) != string(b) {
			t.Fatal("decode then encode changed the bytes")
		}
	})
}
