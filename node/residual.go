package node

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"math"
	"os"

	"github.com/skein-ml/skein/optimizer"
)

// A volunteer's residual (wire.outer = "support"): what it has trained but
// not sent yet, kept beside its local checkpoint so that a restart does not
// throw it away. It is this member's own and never crosses the network.
// The file:
//
//	4 magic "SKRS" | 4 version | 8 round | 8 n | n x float32 | 4 CRC-32C of all before
//
// A residual that cannot be used (absent, damaged, of another round or
// size) is dropped with a warning: it only delays this member's
// contribution, it never changes the run's state.
const (
	residualMagic   = "SKRS"
	residualVersion = 1
	residualHeader  = 24
	residualFile    = ".residual" // after the checkpoint's path
)

func residualSize(n int) int64 { return residualHeader + 4*int64(n) + 4 }

func encodeResidual(round uint64, r []float32) []byte {
	b := make([]byte, 0, residualSize(len(r)))
	b = append(b, residualMagic...)
	b = binary.LittleEndian.AppendUint32(b, residualVersion)
	b = binary.LittleEndian.AppendUint64(b, round)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(r)))
	b = optimizer.AppendFloats(b, r)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeResidual checks and decodes a residual of exactly n parameters
// (the caller's model), so nothing is allocated from a size the file
// claims.
func decodeResidual(b []byte, n int) (uint64, []float32, error) {
	switch {
	case int64(len(b)) != residualSize(n):
		return 0, nil, fmt.Errorf("%w: residual of %d bytes, %d parameters take %d", ErrBadState, len(b), n, residualSize(n))
	case string(b[:4]) != residualMagic:
		return 0, nil, fmt.Errorf("%w: residual with magic %q", ErrBadState, b[:4])
	case binary.LittleEndian.Uint32(b[4:]) != residualVersion:
		return 0, nil, fmt.Errorf("%w: residual version %d, want %d", ErrBadState, binary.LittleEndian.Uint32(b[4:]), residualVersion)
	case binary.LittleEndian.Uint64(b[16:]) != uint64(n):
		return 0, nil, fmt.Errorf("%w: residual of %d parameters, want %d", ErrBadState, binary.LittleEndian.Uint64(b[16:]), n)
	case binary.LittleEndian.Uint32(b[len(b)-4:]) != crc32.Checksum(b[:len(b)-4], castagnoli):
		return 0, nil, fmt.Errorf("%w: residual checksum mismatch", ErrBadState)
	}
	r := make([]float32, n)
	for i := range r {
		r[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[residualHeader+4*i:]))
		if f := float64(r[i]); math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, nil, fmt.Errorf("%w: residual has %v at %d", ErrBadState, r[i], i)
		}
	}
	return binary.LittleEndian.Uint64(b[8:]), r, nil
}

// resumeResidual installs the residual saved beside the local checkpoint,
// if it belongs to the round resumed; otherwise the residual starts empty.
// Where the run keeps none, one left by an older run or build, which
// nothing would read, is removed.
func (v *Volunteer) resumeResidual() {
	if v.dl == nil || v.ckPath == "" {
		return
	}
	path := v.ckPath + residualFile
	if v.dl.Residual() == nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			v.log.Warn("could not remove a residual no round reads", "path", path, "err", err)
		}
		return
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var round uint64
	var r []float32
	if err == nil {
		round, r, err = decodeResidual(raw, v.n)
	}
	if err == nil && round != v.dl.Round {
		err = fmt.Errorf("residual of round %d beside a state of round %d", round, v.dl.Round)
	}
	if err == nil {
		err = v.dl.SetResidual(r)
	}
	if err != nil {
		v.log.Warn("not resuming the residual: it starts empty", "path", path, "err", err)
		return
	}
	say(v.cfg.Progress, "resumed the residual of round %d (what this volunteer had not sent yet)", round)
}
