package model

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"math"
	"os"
	"strconv"

	"github.com/skein-ml/skein/internal/atomicfile"
)

// Checkpoint format identifiers, stored in the safetensors metadata.
const (
	checkpointFormat = "skein-checkpoint/1"
	momentPrefixM    = "optimizer.adamw.m."
	momentPrefixV    = "optimizer.adamw.v."
)

// ErrCheckpoint is returned (wrapped) when a checkpoint does not match what
// the caller expects (format, config, missing tensors).
var ErrCheckpoint = errors.New("model: bad checkpoint")

// Checkpoint is the host-side state of one stage: its parameters and AdamW
// moments in layout order, the step reached, and free-form metadata (for
// example the trainer's settings) that is stored as strings.
type Checkpoint struct {
	Config Config
	Spec   StageSpec
	Step   int
	Params []float32
	M, V   []float32 // nil when the optimizer state is not saved
	Meta   map[string]string
}

// Checkpoint metadata every snapshot carries (Meta): the sequence length
// the stage was trained at, which evaluation windows use.
const MetaSeqLen = "skein.seq_len"

// MetaTokenizer names the tokenizer of the ids the model was trained on;
// absent: "byte".
const MetaTokenizer = "skein.tokenizer"

// Snapshot copies the stage's parameters and moments to host memory; meta
// (copied) gets MetaSeqLen.
func (s *Stage) Snapshot(step int, meta map[string]string) *Checkpoint {
	return s.SnapshotInto(nil, step, meta)
}

// SnapshotInto is Snapshot reusing ck's buffers when they have the stage's
// size (a background writer's spare: no allocation per checkpoint); nil
// or another size allocates.
func (s *Stage) SnapshotInto(ck *Checkpoint, step int, meta map[string]string) *Checkpoint {
	meta = maps.Clone(meta)
	if meta == nil {
		meta = map[string]string{}
	}
	meta[MetaSeqLen] = strconv.Itoa(s.T)
	n := s.NumParams()
	if ck == nil || len(ck.Params) != n || len(ck.M) != n || len(ck.V) != n {
		ck = &Checkpoint{Params: make([]float32, n), M: make([]float32, n), V: make([]float32, n)}
	}
	ck.Config, ck.Spec, ck.Step, ck.Meta = s.Config, s.Spec, step, meta
	s.dev.CopyOut(ck.Params, s.Params)
	s.dev.CopyOut(ck.M, s.M)
	s.dev.CopyOut(ck.V, s.V)
	return ck
}

// SeqLen is the sequence length ck's stage was trained at (MetaSeqLen),
// or the model's context length for a checkpoint without it.
func (ck *Checkpoint) SeqLen() int {
	if t, err := strconv.Atoi(ck.Meta[MetaSeqLen]); err == nil && t > 0 && t <= ck.Config.MaxT {
		return t
	}
	return ck.Config.MaxT
}

// Tokenizer names the tokenizer of ck's model (MetaTokenizer; "byte"
// without it).
func (ck *Checkpoint) Tokenizer() string {
	if n := ck.Meta[MetaTokenizer]; n != "" {
		return n
	}
	return "byte"
}

// Restore loads a checkpoint of the same config and spec into the stage.
func (s *Stage) Restore(ck *Checkpoint) error {
	if !ck.Config.SameShape(s.Config) {
		return fmt.Errorf("%w: checkpoint is for model %+v, stage is %+v", ErrCheckpoint, ck.Config, s.Config)
	}
	if ck.Spec != s.Spec {
		return fmt.Errorf("%w: checkpoint holds stage %+v, not %+v", ErrCheckpoint, ck.Spec, s.Spec)
	}
	if len(ck.Params) != s.NumParams() {
		return fmt.Errorf("%w: %d parameters, stage has %d", ErrCheckpoint, len(ck.Params), s.NumParams())
	}
	s.dev.CopyIn(s.Params, ck.Params)
	if ck.M != nil && ck.V != nil {
		s.dev.CopyIn(s.M, ck.M)
		s.dev.CopyIn(s.V, ck.V)
	} else {
		s.dev.Zero(s.M)
		s.dev.Zero(s.V)
	}
	s.dev.Zero(s.Grads)
	return nil
}

// SaveCheckpoint writes ck to path atomically: a temporary file in the same
// directory is written, synced and renamed over path, so a crash leaves
// either the old or the new checkpoint, never a torn one.
func SaveCheckpoint(path string, ck *Checkpoint) error {
	layout := Layout(ck.Config, ck.Spec)
	var tensors []NamedTensor
	add := func(prefix string, flat []float32) error {
		for _, t := range layout {
			if t.Offset+t.Size() > len(flat) {
				return fmt.Errorf("%w: flat buffer of %d too short for %s", ErrCheckpoint, len(flat), t.Name)
			}
			tensors = append(tensors, NamedTensor{Name: prefix + t.Name, Shape: t.Shape, Data: flat[t.Offset : t.Offset+t.Size()]})
		}
		return nil
	}
	if err := add("", ck.Params); err != nil {
		return err
	}
	if ck.M != nil && ck.V != nil {
		if err := add(momentPrefixM, ck.M); err != nil {
			return err
		}
		if err := add(momentPrefixV, ck.V); err != nil {
			return err
		}
	}
	cfg, _ := json.Marshal(ck.Config)
	spec, _ := json.Marshal(ck.Spec)
	meta := map[string]string{
		"format":       checkpointFormat,
		"skein.config": string(cfg),
		"skein.spec":   string(spec),
		"skein.step":   strconv.Itoa(ck.Step),
		"skein.crc32c": strconv.FormatUint(uint64(ck.checksum()), 16),
	}
	for k, v := range ck.Meta {
		if _, reserved := meta[k]; reserved {
			return fmt.Errorf("%w: metadata key %q is reserved", ErrCheckpoint, k)
		}
		meta[k] = v
	}
	return atomicfile.Write(path, 0o644, func(w io.Writer) error { return WriteSafetensors(w, tensors, meta) })
}

// LoadCheckpoint reads a checkpoint written by SaveCheckpoint. Every size is
// checked against the file before anything is allocated; a malformed,
// truncated or foreign file gives an error naming the problem.
func LoadCheckpoint(path string) (*Checkpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("model: opening checkpoint: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("model: opening checkpoint: %w", err)
	}
	ck, err := decodeCheckpoint(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ck, nil
}

type readerAt interface {
	ReadAt(p []byte, off int64) (int, error)
}

func decodeCheckpoint(r readerAt, size int64) (*Checkpoint, error) {
	h, err := ReadSafetensorsHeader(r, size, 0)
	if err != nil {
		return nil, err
	}
	if f := h.Metadata["format"]; f != checkpointFormat {
		return nil, fmt.Errorf("%w: format %q, want %q", ErrCheckpoint, f, checkpointFormat)
	}
	ck := &Checkpoint{Meta: map[string]string{}}
	if err := json.Unmarshal([]byte(h.Metadata["skein.config"]), &ck.Config); err != nil {
		return nil, fmt.Errorf("%w: skein.config: %v", ErrCheckpoint, err)
	}
	if err := ck.Config.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCheckpoint, err)
	}
	if err := json.Unmarshal([]byte(h.Metadata["skein.spec"]), &ck.Spec); err != nil {
		return nil, fmt.Errorf("%w: skein.spec: %v", ErrCheckpoint, err)
	}
	if err := ck.Spec.Validate(ck.Config); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCheckpoint, err)
	}
	if ck.Step, err = strconv.Atoi(h.Metadata["skein.step"]); err != nil || ck.Step < 0 {
		return nil, fmt.Errorf("%w: skein.step %q", ErrCheckpoint, h.Metadata["skein.step"])
	}
	for k, v := range h.Metadata {
		if k != "format" && k != "skein.config" && k != "skein.spec" && k != "skein.step" && k != "skein.crc32c" {
			ck.Meta[k] = v
		}
	}
	layout := Layout(ck.Config, ck.Spec)
	n := 0
	for _, t := range layout {
		n += t.Size()
	}
	// The header's tensors were checked against the file size, so the
	// layout's size is bounded by the file once every tensor matches.
	byName := make(map[string]STTensorInfo, len(h.Tensors))
	for _, t := range h.Tensors {
		byName[t.Name] = t
	}
	var declared int64
	for _, t := range h.Tensors {
		declared += t.End - t.Begin
	}
	hasMoments := false
	if _, ok := byName[momentPrefixM+layout[0].Name]; ok {
		hasMoments = true
	}
	copies := 1 // parameters, and optionally the two AdamW moments
	if hasMoments {
		copies = 3
	}
	want := int64(4 * n * copies)
	if declared != want || len(h.Tensors) != len(layout)*copies {
		return nil, fmt.Errorf("%w: file holds %d tensors (%d bytes); model %s stage %+v needs %d bytes", ErrCheckpoint, len(h.Tensors), declared, ck.Config.Name, ck.Spec, want)
	}
	read := func(prefix string) ([]float32, error) {
		flat := make([]float32, n)
		for _, t := range layout {
			info, ok := byName[prefix+t.Name]
			if !ok {
				return nil, fmt.Errorf("%w: tensor %q missing", ErrCheckpoint, prefix+t.Name)
			}
			if !equalShape(info.Shape, t.Shape) {
				return nil, fmt.Errorf("%w: tensor %q has shape %v, want %v", ErrCheckpoint, info.Name, info.Shape, t.Shape)
			}
			if err := h.ReadTensor(r, info, flat[t.Offset:t.Offset+t.Size()]); err != nil {
				return nil, err
			}
		}
		return flat, nil
	}
	if ck.Params, err = read(""); err != nil {
		return nil, err
	}
	if hasMoments {
		if ck.M, err = read(momentPrefixM); err != nil {
			return nil, err
		}
		if ck.V, err = read(momentPrefixV); err != nil {
			return nil, err
		}
	}
	// Files from other tools carry no checksum; ours must match theirs.
	if want, ok := h.Metadata["skein.crc32c"]; ok {
		if got := strconv.FormatUint(uint64(ck.checksum()), 16); got != want {
			return nil, fmt.Errorf("%w: checksum %s, file says %s (corrupted)", ErrMalformed, got, want)
		}
	}
	return ck, nil
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum is the CRC-32C of the parameters then the moments, as
// little-endian float32 bytes: what SaveCheckpoint writes, in that order.
func (ck *Checkpoint) checksum() uint32 {
	var crc uint32
	var buf [4096]byte
	for _, flat := range [][]float32{ck.Params, ck.M, ck.V} {
		for i := 0; i < len(flat); i += len(buf) / 4 {
			chunk := flat[i:min(i+len(buf)/4, len(flat))]
			for j, v := range chunk {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(v))
			}
			crc = crc32.Update(crc, castagnoli, buf[:4*len(chunk)])
		}
	}
	return crc
}
