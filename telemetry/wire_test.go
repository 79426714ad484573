package telemetry

import (
	"bytes"
	"encoding"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"strings"
	"testing"
)

var (
	_ encoding.BinaryMarshaler   = Report{}
	_ encoding.BinaryAppender    = Report{}
	_ encoding.BinaryUnmarshaler = (*Report)(nil)
)

// sampleReports are valid reports covering every field's extremes.
func sampleReports() []Report {
	nan := float32(math.NaN())
	return []Report{
		{},
		{Round: 12, StateHash: 0xdeadbeefcafef00d, TrainLoss: 2.5, ValLoss: nan, Tokens: 51200, TokensPerSec: 1234.5,
			BytesSent: 1 << 20, BytesRecv: 3 << 20, ComputeSeconds: 41.5, WallSeconds: 45.25, Members: 4,
			Device: "cpu (8 threads)", Version: "v0.3.1", UnixMS: 1_750_000_000_000},
		{Round: math.MaxUint64, StateHash: math.MaxUint64, Adopted: true, TrainLoss: math.MaxFloat32,
			ValLoss: math.SmallestNonzeroFloat32, Tokens: math.MaxUint64, TokensPerSec: math.MaxFloat64,
			BytesSent: math.MaxUint64, BytesRecv: math.MaxUint64, ComputeSeconds: math.MaxFloat64,
			WallSeconds: math.SmallestNonzeroFloat64, Members: MaxMembers, UnixMS: math.MaxInt64,
			Device: strings.Repeat("d", MaxString), Version: strings.Repeat("é", MaxString/2),
			HasData: true, Epoch: math.MaxUint64, EpochTrained: 1},
		{Adopted: true, TrainLoss: nan, ValLoss: nan, TokensPerSec: math.Copysign(0, -1),
			ComputeSeconds: math.Copysign(0, -1), Device: "NVIDIA H100 80GB HBM3 ✓", Version: "dev (go1.26) ~ [x] \"q\" \\",
			HasData: true, EpochTrained: float32(math.Copysign(0, -1))},
		{Round: 40, StateHash: 0x0123456789abcdef, TrainLoss: 3.25, ValLoss: 3.5, Tokens: 8192, Members: 3,
			Device: "cpu", Version: "v0.5.0", UnixMS: 1_760_000_000_000,
			HasData: true, Epoch: 2, EpochTrained: 0.4375},
	}
}

// same compares reports field by field, NaN equal to NaN.
func same(a, b Report) bool {
	f32 := func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) || x != x && y != y }
	f64 := func(x, y float64) bool { return math.Float64bits(x) == math.Float64bits(y) }
	return a.Round == b.Round && a.StateHash == b.StateHash && a.Adopted == b.Adopted &&
		f32(a.TrainLoss, b.TrainLoss) && f32(a.ValLoss, b.ValLoss) && a.Tokens == b.Tokens &&
		f64(a.TokensPerSec, b.TokensPerSec) && a.BytesSent == b.BytesSent && a.BytesRecv == b.BytesRecv &&
		f64(a.ComputeSeconds, b.ComputeSeconds) && f64(a.WallSeconds, b.WallSeconds) &&
		a.Members == b.Members && a.Device == b.Device && a.Version == b.Version && a.UnixMS == b.UnixMS &&
		a.HasData == b.HasData && a.Epoch == b.Epoch && f32(a.EpochTrained, b.EpochTrained)
}

// wireSize is the length of r's encoding by the package doc's table.
func wireSize(r Report) int {
	n := 88 + len(r.Device) + len(r.Version)
	if r.HasData {
		n += 12
	}
	return n
}

func mustMarshal(t testing.TB, r Report) []byte {
	t.Helper()
	b, err := r.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRoundTrip(t *testing.T) {
	for i, r := range sampleReports() {
		b := mustMarshal(t, r)
		if want := wireSize(r); len(b) != want || len(b) > maxSize || maxSize > MaxReportSize {
			t.Errorf("report %d: %d bytes, want %d (at most %d)", i, len(b), want, MaxReportSize)
		}
		var got Report
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("report %d: %v", i, err)
		}
		if !same(got, r) {
			t.Errorf("report %d: got %+v, want %+v", i, got, r)
		}
		if b2 := mustMarshal(t, got); !bytes.Equal(b2, b) {
			t.Errorf("report %d: re-encoding differs", i)
		}
	}
}

// TestLayout builds a report's bytes from the package doc's table, not from
// the encoder.
func TestLayout(t *testing.T) {
	r := sampleReports()[1]
	r.Adopted = true
	le := binary.LittleEndian
	want := make([]byte, 86, 128)
	want[0] = 1
	le.PutUint64(want[1:], r.Round)
	le.PutUint64(want[9:], r.StateHash)
	want[17] = 1
	le.PutUint32(want[18:], math.Float32bits(r.TrainLoss))
	le.PutUint32(want[22:], 0x7fc00000)
	le.PutUint64(want[26:], r.Tokens)
	le.PutUint64(want[34:], math.Float64bits(r.TokensPerSec))
	le.PutUint64(want[42:], r.BytesSent)
	le.PutUint64(want[50:], r.BytesRecv)
	le.PutUint64(want[58:], math.Float64bits(r.ComputeSeconds))
	le.PutUint64(want[66:], math.Float64bits(r.WallSeconds))
	le.PutUint32(want[74:], uint32(r.Members))
	le.PutUint64(want[78:], uint64(r.UnixMS))
	want = append(want, byte(len(r.Device)))
	want = append(want, r.Device...)
	want = append(want, byte(len(r.Version)))
	want = append(want, r.Version...)
	if got := mustMarshal(t, r); !bytes.Equal(got, want) {
		t.Errorf("layout:\ngot  %x\nwant %x", got, want)
	}

	// With data progress: flags bit 1, and 12 bytes after Version.
	r.HasData, r.Epoch, r.EpochTrained = true, 3, 0.625
	want[17] = 3
	want = le.AppendUint64(want, 3)
	want = le.AppendUint32(want, math.Float32bits(0.625))
	if got := mustMarshal(t, r); !bytes.Equal(got, want) {
		t.Errorf("layout with data:\ngot  %x\nwant %x", got, want)
	}
}

// oldReport is sampleReports()[1] with Adopted set, as the encoder wrote it
// before reports carried data progress.
const oldReport = "010c000000000000000df0fecaefbeadde01000020400000c07f00c800000000000000000000004a9340000010000000000000003000000000000000000000c044400000000000a046400400000000dc2074970100000f6370752028382074687265616473290676302e332e31"

// TestOldReport: a report from before the data fields (flags bit 1 clear,
// nothing after Version) still decodes, without data, and encodes to the
// same bytes.
func TestOldReport(t *testing.T) {
	b, err := hex.DecodeString(oldReport)
	if err != nil {
		t.Fatal(err)
	}
	var got Report
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	want := sampleReports()[1]
	want.Adopted = true
	if !same(got, want) || got.HasData {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if b2 := mustMarshal(t, got); !bytes.Equal(b2, b) {
		t.Errorf("re-encoding differs:\ngot  %x\nwant %x", b2, b)
	}
}

func TestAppendBinary(t *testing.T) {
	r := sampleReports()[1]
	prefix := []byte("frame:")
	b, err := r.AppendBinary(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, prefix) || !bytes.Equal(b[len(prefix):], mustMarshal(t, r)) {
		t.Errorf("AppendBinary: %x", b)
	}
	r.Members = -1
	if b, err := r.AppendBinary(prefix); err == nil || !bytes.Equal(b, prefix) {
		t.Errorf("AppendBinary of a bad report: %x, %v; want the input back and an error", b, err)
	}
}

func TestTruncated(t *testing.T) {
	for i, r := range sampleReports() {
		b := mustMarshal(t, r)
		for n := range len(b) {
			var got Report
			if err := got.UnmarshalBinary(b[:n]); !errors.Is(err, ErrBadReport) {
				t.Errorf("report %d cut to %d of %d bytes: %v, want ErrBadReport", i, n, len(b), err)
			}
		}
		var got Report
		if err := got.UnmarshalBinary(append(b, 0)); !errors.Is(err, ErrBadReport) || !strings.Contains(err.Error(), "1 bytes after the report") {
			t.Errorf("report %d with a trailing byte: %v", i, err)
		}
	}
}

func TestOversize(t *testing.T) {
	var r Report
	// Garbage (version 0) over the limit is refused for its size first.
	err := r.UnmarshalBinary(make([]byte, MaxReportSize+1))
	if !errors.Is(err, ErrBadReport) || !strings.Contains(err.Error(), "513 bytes, more than MaxReportSize 512") {
		t.Errorf("oversize: %v", err)
	}
}

// TestMarshalRefuses: a bad value is refused by the encoder, with the field
// named.
func TestMarshalRefuses(t *testing.T) {
	inf32 := float32(math.Inf(1))
	nan, inf := math.NaN(), math.Inf(1)
	cases := []struct {
		want string
		edit func(r *Report)
	}{
		{"TrainLoss = +Inf", func(r *Report) { r.TrainLoss = inf32 }},
		{"TrainLoss = -1", func(r *Report) { r.TrainLoss = -1 }},
		{"ValLoss = -Inf", func(r *Report) { r.ValLoss = -inf32 }},
		{"TokensPerSec = NaN", func(r *Report) { r.TokensPerSec = nan }},
		{"TokensPerSec = +Inf", func(r *Report) { r.TokensPerSec = inf }},
		{"TokensPerSec = -5", func(r *Report) { r.TokensPerSec = -5 }},
		{"ComputeSeconds = NaN", func(r *Report) { r.ComputeSeconds = nan }},
		{"ComputeSeconds = -0.5", func(r *Report) { r.ComputeSeconds = -0.5 }},
		{"WallSeconds = +Inf", func(r *Report) { r.WallSeconds = inf }},
		{"Members = -1", func(r *Report) { r.Members = -1 }},
		{"Members = 65537", func(r *Report) { r.Members = MaxMembers + 1 }},
		{"UnixMS = -1", func(r *Report) { r.UnixMS = -1 }},
		{"EpochTrained = NaN: must be in [0, 1]", func(r *Report) { r.HasData, r.EpochTrained = true, float32(nan) }},
		{"EpochTrained = 1.5: must be in [0, 1]", func(r *Report) { r.HasData, r.EpochTrained = true, 1.5 }},
		{"EpochTrained = -0.25: must be in [0, 1]", func(r *Report) { r.HasData, r.EpochTrained = true, -0.25 }},
		{"EpochTrained = +Inf: must be in [0, 1]", func(r *Report) { r.HasData, r.EpochTrained = true, inf32 }},
		{"Epoch = 2: must be 0 without HasData", func(r *Report) { r.Epoch = 2 }},
		{"EpochTrained = 0.5: must be 0 without HasData", func(r *Report) { r.EpochTrained = 0.5 }},
		{"EpochTrained = -0: must be 0 without HasData", func(r *Report) { r.EpochTrained = float32(math.Copysign(0, -1)) }},
		{"Device: 65 bytes, more than MaxString 64", func(r *Report) { r.Device = strings.Repeat("x", MaxString+1) }},
		{"Version: 66 bytes", func(r *Report) { r.Version = strings.Repeat("é", MaxString/2+1) }},
		{"Device = \"cpu\\xff\": not valid UTF-8", func(r *Report) { r.Device = "cpu\xff" }},
		{"Device = \"a\\nb\": character U+000A", func(r *Report) { r.Device = "a\nb" }},
		{"Device = \"\\tcpu\": character U+0009", func(r *Report) { r.Device = "\tcpu" }},
		{"Version = \"v1\\x00\": character U+0000", func(r *Report) { r.Version = "v1\x00" }},
		{"Version = \"v1\\x7f\": character U+007F", func(r *Report) { r.Version = "v1\x7f" }},
		{"Version = \"\\u202egnp.exe\": character U+202E", func(r *Report) { r.Version = "\u202egnp.exe" }},
		{"Device = \"gpu\\u200b\": character U+200B", func(r *Report) { r.Device = "gpu\u200b" }},
		{"Device = \"\\u0085\": character U+0085", func(r *Report) { r.Device = "\u0085" }},
	}
	for _, c := range cases {
		r := sampleReports()[1]
		c.edit(&r)
		_, err := r.MarshalBinary()
		if !errors.Is(err, ErrBadReport) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v", c.want, err)
		}
		if err2 := r.Validate(); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("%s: Validate says %v, MarshalBinary %v", c.want, err2, err)
		}
	}
	// A NaN loss means "not measured" and any NaN is written as the one
	// canonical NaN.
	r := sampleReports()[1]
	r.TrainLoss = math.Float32frombits(0xffc00001)
	b := mustMarshal(t, r)
	if bits := binary.LittleEndian.Uint32(b[18:]); bits != nanBits {
		t.Errorf("NaN written as %#x, want %#x", bits, nanBits)
	}
}

// TestUnmarshalRefuses corrupts one field of a valid encoding at a time.
func TestUnmarshalRefuses(t *testing.T) {
	le := binary.LittleEndian
	f32 := func(off int, x float32) func(b []byte) []byte {
		return func(b []byte) []byte { le.PutUint32(b[off:], math.Float32bits(x)); return b }
	}
	f64 := func(off int, x float64) func(b []byte) []byte {
		return func(b []byte) []byte { le.PutUint64(b[off:], math.Float64bits(x)); return b }
	}
	// replaceDevice replaces the device string (at offset 86) with s, raw.
	replaceDevice := func(s string) func(b []byte) []byte {
		return func(b []byte) []byte {
			n := int(b[86])
			out := append([]byte{}, b[:86]...)
			out = append(out, byte(len(s)))
			out = append(out, s...)
			return append(out, b[87+n:]...)
		}
	}
	cases := []struct {
		want string
		edit func(b []byte) []byte
	}{
		{"version 2, want 1", func(b []byte) []byte { b[0] = 2; return b }},
		{"version 0, want 1", func(b []byte) []byte { b[0] = 0; return b }},
		{"flags 0x4: only bits 0 (Adopted) and 1 (HasData)", func(b []byte) []byte { b[17] = 4; return b }},
		{"flags 0x81", func(b []byte) []byte { b[17] = 0x81; return b }},
		{"flags 0x7", func(b []byte) []byte { b[17] = 7; return b }},
		{"data progress: 0 bytes left, want 12", func(b []byte) []byte { b[17] = 2; return b }},
		{"data progress: 11 bytes left, want 12", func(b []byte) []byte { b[17] = 2; return append(b, make([]byte, 11)...) }},
		{"TrainLoss = NaN with bits 0x7fc00001", func(b []byte) []byte { le.PutUint32(b[18:], 0x7fc00001); return b }},
		{"ValLoss = NaN with bits 0xffc00000", func(b []byte) []byte { le.PutUint32(b[22:], 0xffc00000); return b }},
		{"ValLoss = NaN with bits 0x7f800001", func(b []byte) []byte { le.PutUint32(b[22:], 0x7f800001); return b }},
		{"TrainLoss = +Inf", f32(18, float32(math.Inf(1)))},
		{"ValLoss = -2", f32(22, -2)},
		{"TokensPerSec = NaN", f64(34, math.NaN())},
		{"TokensPerSec = -1", f64(34, -1)},
		{"ComputeSeconds = +Inf", f64(58, math.Inf(1))},
		{"WallSeconds = -Inf", f64(66, math.Inf(-1))},
		{"WallSeconds = NaN", f64(66, math.NaN())},
		{"Members = 65537", func(b []byte) []byte { le.PutUint32(b[74:], MaxMembers+1); return b }},
		{"Members = 4294967295", func(b []byte) []byte { le.PutUint32(b[74:], math.MaxUint32); return b }},
		{"UnixMS = -1", func(b []byte) []byte { le.PutUint64(b[78:], math.MaxUint64); return b }},
		{"Device: length 65, more than MaxString 64", func(b []byte) []byte { return replaceDevice(strings.Repeat("x", 65))(b) }},
		{"Device: length 64, only 22 bytes left", func(b []byte) []byte { b[86] = 64; return b }},
		{"Device = \"\\xc3\": not valid UTF-8", replaceDevice("\xc3")},
		{"Device = \"a\\rb\": character U+000D", replaceDevice("a\rb")},
		{"Device = \"\\u2066x\": character U+2066", replaceDevice("\u2066x")},
	}
	orig := sampleReports()[1]
	for _, c := range cases {
		b := c.edit(mustMarshal(t, orig))
		r := orig
		r.Round = 99
		err := r.UnmarshalBinary(b)
		if !errors.Is(err, ErrBadReport) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v", c.want, err)
		}
		if r.Round != 99 {
			t.Errorf("%s: the report was changed by a failed decode", c.want)
		}
	}

	// The data progress of a report that has it: the last 12 bytes.
	withData := sampleReports()[4]
	trained := func(bits uint32) func(b []byte) []byte {
		return func(b []byte) []byte { le.PutUint32(b[len(b)-4:], bits); return b }
	}
	dataCases := []struct {
		want string
		edit func(b []byte) []byte
	}{
		{"EpochTrained = NaN: must be in [0, 1]", trained(nanBits)},
		{"EpochTrained = NaN: must be in [0, 1]", trained(0xffc00001)},
		{"EpochTrained = 1.0000001: must be in [0, 1]", trained(math.Float32bits(1) + 1)},
		{"EpochTrained = 2: must be in [0, 1]", trained(math.Float32bits(2))},
		{"EpochTrained = -1e-45: must be in [0, 1]", trained(0x80000001)},
		{"EpochTrained = +Inf", trained(math.Float32bits(float32(math.Inf(1))))},
		{"data progress: 11 bytes left, want 12", func(b []byte) []byte { return b[:len(b)-1] }},
		{"4 bytes after the report", func(b []byte) []byte { return append(b, 0, 0, 0, 0) }},
	}
	for _, c := range dataCases {
		b := c.edit(mustMarshal(t, withData))
		r := withData
		r.Epoch = 99
		err := r.UnmarshalBinary(b)
		if !errors.Is(err, ErrBadReport) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v", c.want, err)
		}
		if r.Epoch != 99 {
			t.Errorf("%s: the report was changed by a failed decode", c.want)
		}
	}
}

func FuzzReport(f *testing.F) {
	for _, r := range sampleReports() {
		f.Add(mustMarshal(f, r))
	}
	b := mustMarshal(f, sampleReports()[1])
	f.Add(b[:len(b)-1])
	f.Add(append(b, 0))
	b[17] |= flagHasData // data progress announced, not there
	f.Add(b)
	f.Add(append(b, make([]byte, dataSize)...))
	d := mustMarshal(f, sampleReports()[4])
	f.Add(d[:len(d)-dataSize]) // data progress cut off
	f.Add(d[:len(d)-1])
	if h, err := hex.DecodeString(oldReport); err == nil {
		f.Add(h)
	}
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add(make([]byte, minSize))
	f.Add(make([]byte, MaxReportSize+1))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Report
		if err := r.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrBadReport) {
				t.Fatalf("error %v does not match ErrBadReport", err)
			}
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("decoded an invalid report: %v", err)
		}
		out, err := r.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded report does not encode: %v", err)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("re-encoding differs:\nin  %x\nout %x", b, out)
		}
	})
}
