package telemetry

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unicode"
	"unicode/utf8"
)

// ErrBadReport is returned (wrapped) for a report that cannot be encoded or
// decoded: a value out of range, or bytes that are not a version 1 report.
// The error's text names the field and the value.
var ErrBadReport = errors.New("telemetry: bad report")

// Limits of the wire format.
const (
	// MaxReportSize bounds an encoded report of any version this package
	// reads; a decoder refuses longer input before reading any field.
	MaxReportSize = 512
	// MaxMembers bounds Members (the size of one collective's group).
	MaxMembers = 1 << 16
)

const (
	wireVersion = 1
	// fixedSize is the length of the fields before Device's length byte.
	fixedSize = 86
	// dataSize is the length of Epoch and EpochTrained, after Version when
	// flags bit 1 (HasData) is set.
	dataSize = 12
	// minSize and maxSize bound a version 1 report.
	minSize = fixedSize + 2
	maxSize = minSize + 2*MaxString + dataSize
	// Bits of the flags byte.
	flagAdopted = 1 << 0
	flagHasData = 1 << 1
	// nanBits is the one float32 NaN the wire format carries.
	nanBits = 0x7fc00000
)

// Validate reports the first field out of the ranges in the package doc.
func (r Report) Validate() error {
	switch {
	case !lossOK(r.TrainLoss):
		return badValue("TrainLoss", r.TrainLoss, "must be NaN (not measured) or finite and >= 0")
	case !lossOK(r.ValLoss):
		return badValue("ValLoss", r.ValLoss, "must be NaN (not measured) or finite and >= 0")
	case !amountOK(r.TokensPerSec):
		return badValue("TokensPerSec", r.TokensPerSec, "must be finite and >= 0")
	case !amountOK(r.ComputeSeconds):
		return badValue("ComputeSeconds", r.ComputeSeconds, "must be finite and >= 0")
	case !amountOK(r.WallSeconds):
		return badValue("WallSeconds", r.WallSeconds, "must be finite and >= 0")
	case r.Members < 0 || r.Members > MaxMembers:
		return badValue("Members", r.Members, fmt.Sprintf("out of range [0, %d]", MaxMembers))
	case r.UnixMS < 0:
		return badValue("UnixMS", r.UnixMS, "must be >= 0")
	case !(r.EpochTrained >= 0 && r.EpochTrained <= 1):
		return badValue("EpochTrained", r.EpochTrained, "must be in [0, 1]")
	case !r.HasData && r.Epoch != 0:
		return badValue("Epoch", r.Epoch, "must be 0 without HasData")
	case !r.HasData && math.Float32bits(r.EpochTrained) != 0:
		return badValue("EpochTrained", r.EpochTrained, "must be 0 without HasData")
	}
	if err := checkString("Device", r.Device); err != nil {
		return err
	}
	return checkString("Version", r.Version)
}

// MarshalBinary encodes r in the version 1 layout (see the package doc),
// after Validate.
func (r Report) MarshalBinary() ([]byte, error) {
	return r.AppendBinary(make([]byte, 0, minSize+len(r.Device)+len(r.Version)+dataSize))
}

// AppendBinary appends r's encoding to b, as MarshalBinary; on error b is
// returned unchanged.
func (r Report) AppendBinary(b []byte) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return b, err
	}
	le := binary.LittleEndian
	var flags byte
	if r.Adopted {
		flags |= flagAdopted
	}
	if r.HasData {
		flags |= flagHasData
	}
	b = append(b, wireVersion)
	b = le.AppendUint64(b, r.Round)
	b = le.AppendUint64(b, r.StateHash)
	b = append(b, flags)
	b = le.AppendUint32(b, lossBits(r.TrainLoss))
	b = le.AppendUint32(b, lossBits(r.ValLoss))
	b = le.AppendUint64(b, r.Tokens)
	b = le.AppendUint64(b, math.Float64bits(r.TokensPerSec))
	b = le.AppendUint64(b, r.BytesSent)
	b = le.AppendUint64(b, r.BytesRecv)
	b = le.AppendUint64(b, math.Float64bits(r.ComputeSeconds))
	b = le.AppendUint64(b, math.Float64bits(r.WallSeconds))
	b = le.AppendUint32(b, uint32(r.Members))
	b = le.AppendUint64(b, uint64(r.UnixMS))
	b = append(b, byte(len(r.Device)))
	b = append(b, r.Device...)
	b = append(b, byte(len(r.Version)))
	b = append(b, r.Version...)
	if r.HasData {
		b = le.AppendUint64(b, r.Epoch)
		b = le.AppendUint32(b, math.Float32bits(r.EpochTrained))
	}
	return b, nil
}

// UnmarshalBinary decodes one whole report, checking the size before
// anything else, then the version, every field's range as Validate does, and
// that no byte is left over. On error *r is unchanged.
func (r *Report) UnmarshalBinary(b []byte) error {
	switch {
	case len(b) > MaxReportSize:
		return fmt.Errorf("%w: %d bytes, more than MaxReportSize %d", ErrBadReport, len(b), MaxReportSize)
	case len(b) == 0:
		return fmt.Errorf("%w: empty", ErrBadReport)
	case b[0] != wireVersion:
		return fmt.Errorf("%w: version %d, want %d", ErrBadReport, b[0], wireVersion)
	case len(b) < minSize:
		return fmt.Errorf("%w: %d bytes, fewer than the %d of an empty-string report", ErrBadReport, len(b), minSize)
	}
	le := binary.LittleEndian
	var x Report
	x.Round = le.Uint64(b[1:])
	x.StateHash = le.Uint64(b[9:])
	flags := b[17]
	if flags&^(flagAdopted|flagHasData) != 0 {
		return fmt.Errorf("%w: flags %#x: only bits 0 (Adopted) and 1 (HasData) are defined", ErrBadReport, flags)
	}
	x.Adopted = flags&flagAdopted != 0
	x.HasData = flags&flagHasData != 0
	var err error
	if x.TrainLoss, err = readLoss("TrainLoss", le.Uint32(b[18:])); err != nil {
		return err
	}
	if x.ValLoss, err = readLoss("ValLoss", le.Uint32(b[22:])); err != nil {
		return err
	}
	x.Tokens = le.Uint64(b[26:])
	x.TokensPerSec = math.Float64frombits(le.Uint64(b[34:]))
	x.BytesSent = le.Uint64(b[42:])
	x.BytesRecv = le.Uint64(b[50:])
	x.ComputeSeconds = math.Float64frombits(le.Uint64(b[58:]))
	x.WallSeconds = math.Float64frombits(le.Uint64(b[66:]))
	members := le.Uint32(b[74:])
	if members > MaxMembers {
		return badValue("Members", members, fmt.Sprintf("out of range [0, %d]", MaxMembers))
	}
	x.Members = int(members)
	x.UnixMS = int64(le.Uint64(b[78:]))
	rest := b[fixedSize:]
	if x.Device, rest, err = readString("Device", rest); err != nil {
		return err
	}
	if x.Version, rest, err = readString("Version", rest); err != nil {
		return err
	}
	if x.HasData {
		if len(rest) < dataSize {
			return fmt.Errorf("%w: data progress: %d bytes left, want %d", ErrBadReport, len(rest), dataSize)
		}
		x.Epoch = le.Uint64(rest)
		x.EpochTrained = math.Float32frombits(le.Uint32(rest[8:]))
		rest = rest[dataSize:]
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: %d bytes after the report", ErrBadReport, len(rest))
	}
	if err := x.Validate(); err != nil {
		return err
	}
	*r = x
	return nil
}

// badValue is the error for field = v.
func badValue(field string, v any, why string) error {
	return fmt.Errorf("%w: %s = %v: %s", ErrBadReport, field, v, why)
}

// lossOK reports whether x is NaN or finite and >= 0.
func lossOK(x float32) bool { return math.IsNaN(float64(x)) || x >= 0 && x <= math.MaxFloat32 }

// amountOK reports whether x is finite and >= 0.
func amountOK(x float64) bool { return x >= 0 && x <= math.MaxFloat64 }

// lossBits returns x's bits, with every NaN as nanBits.
func lossBits(x float32) uint32 {
	if math.IsNaN(float64(x)) {
		return nanBits
	}
	return math.Float32bits(x)
}

// readLoss decodes a loss, refusing NaN bits other than nanBits (so that
// encoding again gives the same bytes); the range is Validate's.
func readLoss(field string, bits uint32) (float32, error) {
	x := math.Float32frombits(bits)
	if math.IsNaN(float64(x)) && bits != nanBits {
		return 0, fmt.Errorf("%w: %s = NaN with bits %#08x: a NaN must be %#08x", ErrBadReport, field, bits, nanBits)
	}
	return x, nil
}

// readString reads a length byte and that many bytes from b.
func readString(field string, b []byte) (s string, rest []byte, err error) {
	if len(b) == 0 {
		return "", nil, fmt.Errorf("%w: %s: truncated before its length", ErrBadReport, field)
	}
	n := int(b[0])
	if n > MaxString {
		return "", nil, fmt.Errorf("%w: %s: length %d, more than MaxString %d", ErrBadReport, field, n, MaxString)
	}
	if len(b)-1 < n {
		return "", nil, fmt.Errorf("%w: %s: length %d, only %d bytes left", ErrBadReport, field, n, len(b)-1)
	}
	return string(b[1 : 1+n]), b[1+n:], nil
}

// checkString checks a string field: at most MaxString bytes of valid UTF-8,
// every character printable.
func checkString(field, s string) error {
	if len(s) > MaxString {
		return fmt.Errorf("%w: %s: %d bytes, more than MaxString %d", ErrBadReport, field, len(s), MaxString)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s = %q: not valid UTF-8", ErrBadReport, field, s)
	}
	for i, c := range s {
		if !unicode.IsPrint(c) {
			return fmt.Errorf("%w: %s = %q: character %U at byte %d is not printable", ErrBadReport, field, s, c, i)
		}
	}
	return nil
}
