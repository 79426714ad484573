package p2p

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Role is a node's part in a run.
type Role uint8

// Roles.
const (
	RoleVolunteer Role = iota // trains
	RoleBootstrap             // seed and relay; never on the training critical path
	RoleObserver              // watches only (status page, tools)
)

func (r Role) String() string {
	switch r {
	case RoleVolunteer:
		return "volunteer"
	case RoleBootstrap:
		return "bootstrap"
	case RoleObserver:
		return "observer"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// MetaLimit is memberlist's bound on node metadata.
const MetaLimit = 512

// Bounds of the variable-length metadata fields (MarshalBinary refuses
// longer ones).
const (
	MaxDeviceLen  = 32
	MaxVersionLen = 32

	maxDeviceLen  = MaxDeviceLen
	maxVersionLen = MaxVersionLen
)

const metaVersion = 1

// Meta is the node metadata gossiped with membership. Encoded it is at most
// MetaLimit bytes (178 with every string at its bound, 382 with a token of
// MaxTokenLen; 448 signed).
type Meta struct {
	Role    Role
	RunID   string // set by the node from its config
	Stage   int16  // pipeline stage, -1 when none
	Device  string // "cpu", "cuda:H100", ... at most 32 bytes
	Version string // software version, at most 32 bytes

	ComputeTFLOPS float32 // measured compute
	UpMbps        float32 // measured upload bandwidth
	DownMbps      float32 // measured download bandwidth

	// Volunteer caps (0 = none).
	CapUpMbps   float32
	CapDownMbps float32
	CapMemMiB   uint32

	// TCPPort is the node's TCP fallback port on the same IP as its memberlist
	// (QUIC) address; 0 when it has none. Set by the node.
	TCPPort uint16

	// Round and StateHash are a trainer's last finished outer round and the
	// hash of its shared state after it: members compare them to detect a
	// diverged state and re-sync (an optional trailing field: older
	// encodings without it decode as zero).
	Round     uint64
	StateHash uint64

	// Token is the node's join token of a closed run (admission.go), its
	// raw bytes, at most MaxTokenLen; "" in an open run. Set by the node
	// from NodeConfig.Token (an optional trailing field: u8 length, then
	// the bytes; older encodings without it decode as "").
	Token string
}

// MarshalBinary encodes m. Strings over their bound are an error.
func (m Meta) MarshalBinary() ([]byte, error) {
	if err := ValidateRunID(m.RunID); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadMeta, err)
	}
	if len(m.Device) > maxDeviceLen {
		return nil, fmt.Errorf("%w: device %q longer than %d bytes", ErrBadMeta, m.Device, maxDeviceLen)
	}
	if len(m.Version) > maxVersionLen {
		return nil, fmt.Errorf("%w: version %q longer than %d bytes", ErrBadMeta, m.Version, maxVersionLen)
	}
	if len(m.Token) > MaxTokenLen {
		return nil, fmt.Errorf("%w: token of %d bytes, limit %d", ErrBadMeta, len(m.Token), MaxTokenLen)
	}
	b := make([]byte, 0, 64+len(m.RunID)+len(m.Device)+len(m.Version)+1+len(m.Token))
	b = append(b, metaVersion, byte(m.Role))
	b = appendStr(b, m.RunID)
	b = binary.BigEndian.AppendUint16(b, uint16(m.Stage))
	b = appendStr(b, m.Device)
	b = appendStr(b, m.Version)
	for _, f := range []float32{m.ComputeTFLOPS, m.UpMbps, m.DownMbps, m.CapUpMbps, m.CapDownMbps} {
		b = binary.BigEndian.AppendUint32(b, math.Float32bits(f))
	}
	b = binary.BigEndian.AppendUint32(b, m.CapMemMiB)
	b = binary.BigEndian.AppendUint16(b, m.TCPPort)
	b = binary.BigEndian.AppendUint64(b, m.Round)
	b = binary.BigEndian.AppendUint64(b, m.StateHash)
	if m.Token != "" {
		b = appendStr(b, m.Token)
	}
	return b, nil
}

func appendStr(b []byte, s string) []byte {
	b = append(b, byte(len(s)))
	return append(b, s...)
}

// UnmarshalBinary decodes metadata from the network. It never panics and
// rejects anything over MetaLimit. Bytes after the known fields are ignored
// (newer versions may append fields).
func (m *Meta) UnmarshalBinary(b []byte) error {
	if len(b) > MetaLimit {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrBadMeta, len(b), MetaLimit)
	}
	d := metaDecoder{b: b}
	if v := d.u8(); d.err == nil && v != metaVersion {
		return fmt.Errorf("%w: version %d, want %d", ErrBadMeta, v, metaVersion)
	}
	var out Meta
	out.Role = Role(d.u8())
	out.RunID = d.str(MaxRunIDLen)
	out.Stage = int16(d.u16())
	out.Device = d.str(maxDeviceLen)
	out.Version = d.str(maxVersionLen)
	out.ComputeTFLOPS = d.f32()
	out.UpMbps = d.f32()
	out.DownMbps = d.f32()
	out.CapUpMbps = d.f32()
	out.CapDownMbps = d.f32()
	out.CapMemMiB = d.u32()
	out.TCPPort = d.u16()
	if d.err == nil && len(d.b) >= 16 {
		out.Round = binary.BigEndian.Uint64(d.take(8))
		out.StateHash = binary.BigEndian.Uint64(d.take(8))
		if len(d.b) > 0 {
			out.Token = d.str(MaxTokenLen)
		}
	}
	if d.err != nil {
		return d.err
	}
	if out.Role > RoleObserver {
		return fmt.Errorf("%w: role %d", ErrBadMeta, out.Role)
	}
	if err := ValidateRunID(out.RunID); err != nil { // what MarshalBinary would refuse
		return fmt.Errorf("%w: %v", ErrBadMeta, err)
	}
	*m = out
	return nil
}

type metaDecoder struct {
	b   []byte
	err error
}

func (d *metaDecoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n {
		d.err = fmt.Errorf("%w: truncated, need %d more bytes, have %d", ErrBadMeta, n, len(d.b))
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *metaDecoder) u8() uint8 {
	if b := d.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (d *metaDecoder) u16() uint16 {
	if b := d.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *metaDecoder) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *metaDecoder) f32() float32 { return math.Float32frombits(d.u32()) }

func (d *metaDecoder) str(limit int) string {
	n := int(d.u8())
	if d.err == nil && n > limit {
		d.err = fmt.Errorf("%w: string of %d bytes, limit %d", ErrBadMeta, n, limit)
		return ""
	}
	return string(d.take(n))
}
