package sim

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"path"
	"slices"
	"strings"
)

// Spec is a network description as it is written in a file (JSON):
//
//	{
//	  "name": "volunteers-20",
//	  "goodput": 0.88,                      // optional; default Goodput
//	  "regions": ["us-west", "eu-west"],
//	  "latency_ms": [[5, 70], [70, 5]],     // one way, region to region; diagonal: within a region
//	  "nodes": [{"id": "a", "region": "us-west", "class": "home-cable", "speed": 6,
//	             "memory_gib": 16, "up_mbps": 20, "down_mbps": 300, "access_ms": 12}]
//	}
//
// Unknown fields are an error, so a misspelt field is not silently ignored.
type Spec struct {
	Name    string  `json:"name"`
	Note    string  `json:"note,omitempty"`
	Goodput float64 `json:"goodput,omitempty"`
	// MessagePaceMs is what a message takes beyond its serialization and
	// the latency, in ms: encoding and decoding, QUIC's pacing and
	// congestion window on a connection idle between bursts, a busy CPU
	// (BenchmarkMessageWAN; a staged run measures its own). 0 for bulk
	// transfers.
	MessagePaceMs float64     `json:"message_pace_ms,omitempty"`
	Regions       []string    `json:"regions"`
	LatencyMs     [][]float64 `json:"latency_ms"`
	Nodes         []NodeSpec  `json:"nodes"`
}

// NodeSpec is one node of a Spec. Rates are in Mbit/s and latencies in ms,
// as people write them; Node holds them in the simulator's units.
type NodeSpec struct {
	ID        string  `json:"id"`
	Region    string  `json:"region"`
	Class     string  `json:"class,omitempty"`
	Speed     float64 `json:"speed"` // relative to the reference machine (measured.go)
	MemoryGiB float64 `json:"memory_gib"`
	UpMbps    float64 `json:"up_mbps"`
	DownMbps  float64 `json:"down_mbps"`
	AccessMs  float64 `json:"access_ms"`
}

// Limits on a description, checked before anything sized by them is
// allocated. They are far above any network we simulate in detail; the
// projection to 10,000 members samples members instead of listing them.
const (
	MaxSpecBytes = 1 << 20
	MaxNodes     = 1024
	MaxRegions   = 64
	maxNameLen   = 64
	maxNoteLen   = 4096
	maxLatencyMs = 10_000    // a one-way latency above 10 s is a typo
	maxRateMbps  = 1_000_000 // 1 Tbit/s
	maxSpeed     = 1e6
	maxMemoryGiB = 1 << 20
)

// ParseNetwork decodes a JSON description and builds the network. data
// larger than MaxSpecBytes is refused before it is decoded.
func ParseNetwork(data []byte) (*Network, error) {
	if len(data) > MaxSpecBytes {
		return nil, fmt.Errorf("%w: network file of %d bytes, limit %d", ErrTooLarge, len(data), MaxSpecBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s Spec
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNetwork, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the network description", ErrNetwork)
	}
	return NewNetwork(s)
}

// MarshalSpec encodes a description as ParseNetwork reads it.
func MarshalSpec(s Spec) ([]byte, error) {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNetwork, err)
	}
	return b, nil
}

// Validate reports the first inconsistency: counts over the limits, names
// empty or repeated, a latency matrix that is not regions x regions of
// finite values in [0, 10 s], a node field out of range.
func (s Spec) Validate() error {
	if err := checkCount("regions", len(s.Regions), MaxRegions); err != nil {
		return err
	}
	if err := checkCount("nodes", len(s.Nodes), MaxNodes); err != nil {
		return err
	}
	if len(s.Name) > maxNameLen || len(s.Note) > maxNoteLen {
		return fmt.Errorf("%w: name of %d bytes or note of %d, limits %d and %d", ErrNetwork, len(s.Name), len(s.Note), maxNameLen, maxNoteLen)
	}
	if g := s.Goodput; g != 0 && !(g > 0 && g <= 1) {
		return fmt.Errorf("%w: goodput %v outside (0, 1]", ErrNetwork, g)
	}
	if !inRange(s.MessagePaceMs, 0, maxLatencyMs) {
		return fmt.Errorf("%w: message pace %v ms outside [0, %d]", ErrNetwork, s.MessagePaceMs, maxLatencyMs)
	}
	regions := make(map[string]bool, len(s.Regions))
	for _, r := range s.Regions {
		if err := checkName("region", r); err != nil {
			return err
		}
		if regions[r] {
			return fmt.Errorf("%w: region %q listed twice", ErrNetwork, r)
		}
		regions[r] = true
	}
	if err := s.validateLatency(); err != nil {
		return err
	}
	ids := make(map[string]bool, len(s.Nodes))
	for i, n := range s.Nodes {
		if err := n.validate(regions); err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
		if ids[n.ID] {
			return fmt.Errorf("%w: node ID %q listed twice", ErrNetwork, n.ID)
		}
		ids[n.ID] = true
	}
	return nil
}

func (s Spec) validateLatency() error {
	if len(s.LatencyMs) != len(s.Regions) {
		return fmt.Errorf("%w: latency matrix has %d rows for %d regions", ErrNetwork, len(s.LatencyMs), len(s.Regions))
	}
	for i, row := range s.LatencyMs {
		if len(row) != len(s.Regions) {
			return fmt.Errorf("%w: latency row %d (%s) has %d entries for %d regions", ErrNetwork, i, s.Regions[i], len(row), len(s.Regions))
		}
		for j, ms := range row {
			if !inRange(ms, 0, maxLatencyMs) {
				return fmt.Errorf("%w: latency %s -> %s = %v ms outside [0, %d]", ErrNetwork, s.Regions[i], s.Regions[j], ms, maxLatencyMs)
			}
		}
	}
	return nil
}

func (n NodeSpec) validate(regions map[string]bool) error {
	if err := checkName("node ID", n.ID); err != nil {
		return err
	}
	if !regions[n.Region] {
		return fmt.Errorf("%w: node %q in unknown region %q", ErrNetwork, n.ID, n.Region)
	}
	if len(n.Class) > maxNameLen {
		return fmt.Errorf("%w: node %q class of %d bytes, limit %d", ErrNetwork, n.ID, len(n.Class), maxNameLen)
	}
	fields := []struct {
		name      string
		v, lo, hi float64
		open      bool // lo excluded
	}{
		{"speed", n.Speed, 0, maxSpeed, true},
		{"memory_gib", n.MemoryGiB, 0, maxMemoryGiB, true},
		{"up_mbps", n.UpMbps, 0, maxRateMbps, true},
		{"down_mbps", n.DownMbps, 0, maxRateMbps, true},
		{"access_ms", n.AccessMs, 0, maxLatencyMs, false},
	}
	for _, f := range fields {
		if !inRange(f.v, f.lo, f.hi) || (f.open && f.v == f.lo) {
			return fmt.Errorf("%w: node %q %s = %v out of range", ErrNetwork, n.ID, f.name, f.v)
		}
	}
	return nil
}

// checkCount reports a count of zero (ErrNetwork) or over its limit
// (ErrTooLarge).
func checkCount(what string, n, limit int) error {
	switch {
	case n == 0:
		return fmt.Errorf("%w: no %s", ErrNetwork, what)
	case n > limit:
		return fmt.Errorf("%w: %d %s, limit %d", ErrTooLarge, n, what, limit)
	}
	return nil
}

func checkName(what, s string) error {
	if s == "" || len(s) > maxNameLen || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return fmt.Errorf("%w: %s %q: want 1 to %d printable bytes without spaces", ErrNetwork, what, s, maxNameLen)
	}
	return nil
}

// inRange reports lo <= v <= hi for a finite v (NaN fails every comparison).
func inRange(v, lo, hi float64) bool { return v >= lo && v <= hi && !math.IsInf(v, 0) }

func (s Spec) goodput() float64 {
	if s.Goodput == 0 {
		return Goodput
	}
	return s.Goodput
}

func (s Spec) clone() Spec {
	c := s
	c.Regions = slices.Clone(s.Regions)
	c.LatencyMs = make([][]float64, len(s.LatencyMs))
	for i, row := range s.LatencyMs {
		c.LatencyMs[i] = slices.Clone(row)
	}
	c.Nodes = slices.Clone(s.Nodes)
	return c
}

//go:embed networks/*.json
var builtin embed.FS

// Builtin returns one of the networks shipped in networks/, by file name
// without the extension (BuiltinNames lists them).
func Builtin(name string) (*Network, error) {
	data, err := builtin.ReadFile(path.Join("networks", name+".json"))
	if err != nil {
		return nil, fmt.Errorf("%w: no built-in network %q (have %s)", ErrConfig, name, strings.Join(BuiltinNames(), ", "))
	}
	return ParseNetwork(data)
}

// BuiltinNames lists the shipped networks, sorted.
func BuiltinNames() []string {
	var names []string
	entries, _ := fs.ReadDir(builtin, "networks")
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".json"))
	}
	return names
}
