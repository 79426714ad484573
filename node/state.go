package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/skein-ml/skein/data"
	"github.com/skein-ml/skein/internal/atomicfile"
	"github.com/skein-ml/skein/model"
	"github.com/skein-ml/skein/optimizer"
	"github.com/skein-ml/skein/p2p"
	"github.com/skein-ml/skein/trainer"
	"github.com/skein-ml/skein/transport"
)

// The shared outer state as this volunteer keeps it in its local
// checkpoint (the .state file next to the stage's; what members serve to
// joiners is the chunk-hashed form in statefetch.go), little-endian:
//
//	0   4  magic "SKST"
//	4   4  version (1)
//	8   8  round: the next round to run
//	16  8  n: parameters
//	24  4n phi (fp32)
//	..  4n outer momentum (fp32)
//	..  4  CRC-32C of everything before it
const (
	stateMagic   = "SKST"
	stateVersion = 1
	stateHeader  = 24
	stateKey     = "diloco-state"
)

// ErrBadState is returned (wrapped) for a state blob that does not decode.
var ErrBadState = errors.New("node: malformed state")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// stateSize is the encoded size of a state of n parameters.
func stateSize(n int) int64 { return stateHeader + 8*int64(n) + 4 }

func encodeState(round uint64, phi, mom []float32) []byte {
	b := make([]byte, 0, stateSize(len(phi)))
	b = append(b, stateMagic...)
	b = binary.LittleEndian.AppendUint32(b, stateVersion)
	b = binary.LittleEndian.AppendUint64(b, round)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(phi)))
	b = optimizer.AppendFloats(optimizer.AppendFloats(b, phi), mom)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// decodeState checks and decodes a state of exactly n parameters (the
// caller's model), so nothing is allocated from a size the sender claims.
func decodeState(b []byte, n int) (round uint64, phi, mom []float32, err error) {
	if int64(len(b)) != stateSize(n) {
		return 0, nil, nil, fmt.Errorf("%w: %d bytes, a state of %d parameters has %d", ErrBadState, len(b), n, stateSize(n))
	}
	if string(b[:4]) != stateMagic {
		return 0, nil, nil, fmt.Errorf("%w: bad magic %q", ErrBadState, b[:4])
	}
	if v := binary.LittleEndian.Uint32(b[4:]); v != stateVersion {
		return 0, nil, nil, fmt.Errorf("%w: version %d, want %d", ErrBadState, v, stateVersion)
	}
	if got := binary.LittleEndian.Uint64(b[16:]); got != uint64(n) {
		return 0, nil, nil, fmt.Errorf("%w: %d parameters, want %d", ErrBadState, got, n)
	}
	body := b[:len(b)-4]
	if crc := binary.LittleEndian.Uint32(b[len(b)-4:]); crc != crc32.Checksum(body, castagnoli) {
		return 0, nil, nil, fmt.Errorf("%w: checksum mismatch", ErrBadState)
	}
	round = binary.LittleEndian.Uint64(b[8:])
	phi, mom = make([]float32, n), make([]float32, n)
	off := stateHeader
	for i := range phi {
		phi[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[off:]))
		off += 4
	}
	for i := range mom {
		mom[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[off:]))
		off += 4
	}
	for i := range phi {
		if f := float64(phi[i]) + float64(mom[i]); math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, nil, nil, fmt.Errorf("%w: non-finite value at %d", ErrBadState, i)
		}
	}
	return round, phi, mom, nil
}

// memWriterAt is a fixed-size io.WriterAt for downloads of a known size.
type memWriterAt []byte

func (m memWriterAt) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(m)) {
		return 0, fmt.Errorf("%w: write of %d bytes at %d beyond %d", ErrBadState, len(p), off, len(m))
	}
	return copy(m[off:], p), nil
}

// A state download is spread over stateConns connections ("lanes") per
// source, each with stateStreams/stateConns streams: on a long link one
// QUIC connection spends most of a few-megabyte transfer in slow start.
const (
	stateStreams = 8
	stateConns   = 4
)

// shortPeer is the part of a peer ID people can tell apart.
func shortPeer(id peer.ID) string {
	s := id.String()
	if len(s) > 16 {
		return s[8:16]
	}
	return s
}

// outerState is an outer optimizer's state as a volunteer shares it with
// joiners and keeps it in its checkpoint: the next round (or step) to run,
// the slow weights and the outer momentum. optimizer.DiLoCo and
// optimizer.NoLoCo both have it.
type outerState interface {
	State() (round uint64, phi, mom []float32)
	SetState(round uint64, phi, mom []float32) error
}

// saveState writes a volunteer's local checkpoint: two files written
// atomically one after the other, the stage (weights and AdamW moments) in
// safetensors and the outer state beside it. On resume the weights are
// reset to phi, so a crash between the two writes loses at most one round
// of local progress. A non-finite value anywhere is refused
// (trainer.ErrNonFinite) and nothing is written: the last good checkpoint
// stays.
func saveState(path string, stage *model.Stage, step int, st outerState) error {
	round, phi, mom := st.State()
	return writeState(path, stage.Snapshot(step, nil), round, phi, mom)
}

// writeState writes ck and the outer state (round, phi, mom: copies) as
// saveState does; the volunteer runs it in the background
// (trainer.Checkpointer.SaveWith) on copies taken between rounds.
func writeState(path string, ck *model.Checkpoint, round uint64, phi, mom []float32) error {
	for _, t := range []struct {
		name string
		x    []float32
	}{{"weights", ck.Params}, {"AdamW first moments", ck.M}, {"AdamW second moments", ck.V}, {"phi", phi}, {"outer momentum", mom}} {
		if i := nonFinite(t.x); i >= 0 {
			return fmt.Errorf("node: not saving %s: %w: %s[%d] = %v", path, trainer.ErrNonFinite, t.name, i, t.x[i])
		}
	}
	if err := model.SaveCheckpoint(path, ck); err != nil {
		return err
	}
	return atomicfile.WriteFile(path+".state", encodeState(round, phi, mom), 0o644)
}

// nonFinite returns the index of the first NaN or infinity in x, or -1.
func nonFinite(x []float32) int {
	for i, v := range x {
		if f := float64(v); math.IsNaN(f) || math.IsInf(f, 0) {
			return i
		}
	}
	return -1
}

// resumeState loads both files into stage and st and returns the inner
// step reached. Everything is checked (sizes, checksum, finite values)
// before anything is installed, so a failure leaves stage and st as they
// were. An error wrapping fs.ErrNotExist means there is no checkpoint.
func resumeState(path string, stage *model.Stage, st outerState) (int, error) {
	raw, err := os.ReadFile(path + ".state")
	if err != nil {
		return 0, err
	}
	round, phi, mom, err := decodeState(raw, stage.NumParams())
	if err != nil {
		return 0, err
	}
	ck, err := model.LoadCheckpoint(path)
	if errors.Is(err, fs.ErrNotExist) {
		// The outer state without the stage is half a checkpoint, not none.
		return 0, fmt.Errorf("%w: %s is missing beside %s.state", ErrBadState, path, path)
	}
	if err != nil {
		return 0, err
	}
	for _, x := range [][]float32{ck.Params, ck.M, ck.V} {
		if i := nonFinite(x); i >= 0 {
			return 0, fmt.Errorf("%w: %s: %w: value %v at %d", ErrBadState, path, trainer.ErrNonFinite, x[i], i)
		}
	}
	if ts, ok := st.(tailSetter); ok {
		// The tail saved beside the state (a dataset run's ledger); a
		// checkpoint without one gets the empty ledger, whose state the
		// run's certificates will not name: the member then takes the run's.
		tail, err := os.ReadFile(path + ".tail")
		if errors.Is(err, fs.ErrNotExist) {
			tail, err = (&data.Ledger{Round: round}).MarshalBinary()
		}
		if err != nil {
			return 0, err
		}
		if err := ts.SetTail(round, tail); err != nil {
			return 0, err
		}
	}
	if err := stage.Restore(ck); err != nil {
		return 0, err
	}
	return ck.Step, st.SetState(round, phi, mom)
}

// resumeLocal resumes the local checkpoint into the stage and st and says
// whether it did. A checkpoint that cannot be used (damaged, poisoned, half
// written) is moved aside to <file>.corrupt-<UTC time>, with a warning
// naming both paths, so it is never silently overwritten by the next save.
func (v *Volunteer) resumeLocal(st outerState) bool {
	if v.cfg.DataDir == "" {
		return false
	}
	v.ckPath = filepath.Join(v.cfg.DataDir, volunteerCheckpoint)
	step, err := resumeState(v.ckPath, v.su.Stage, st)
	if err == nil {
		v.innerStep = step
		return true
	}
	stamp := time.Now().UTC().Format("20060102T150405Z")
	for _, p := range []string{v.ckPath, v.ckPath + ".state"} {
		if _, serr := os.Lstat(p); serr != nil {
			continue // absent: nothing to keep
		}
		aside := p + ".corrupt-" + stamp
		if rerr := os.Rename(p, aside); rerr != nil {
			v.log.Error("could not move an unusable checkpoint aside", "path", p, "err", rerr)
			say(v.cfg.Progress, "warning: local checkpoint %s is unusable (%v) and could not be moved aside (%v)", p, err, rerr)
			continue
		}
		v.log.Warn("moved an unusable local checkpoint aside", "path", p, "to", aside, "err", err)
		say(v.cfg.Progress, "warning: local checkpoint %s is unusable (%v); moved it to %s and starting without it", p, err, aside)
	}
	return false
}

// adoptState downloads the outer state from the members ids
// (fetchVerifiedState: at round minRound or later; with want != 0 only the
// state whose hash, optimizer.StateHashOf, is want, checked chunk by chunk:
// what a member serves must be what the run announced, never one member's
// word), installs it in st and says whose index it followed.
func adoptState(ctx context.Context, pn *p2p.Node, log *slog.Logger, st outerState, n int, minRound uint64, want uint64,
	ids []transport.PeerID, progress io.Writer) (transport.PeerID, error) {
	round, phi, mom, tail, from, err := fetchVerifiedStateTail(ctx, pn, log, n, minRound, want, ids, progress)
	if err != nil {
		return "", err
	}
	if ts, ok := st.(tailSetter); ok {
		if err := ts.SetTail(round, tail); err != nil {
			return "", err
		}
	} else if tail != nil {
		return "", fmt.Errorf("%w: the run's state has a tail this member does not keep", ErrBadState)
	}
	if err := st.SetState(round, phi, mom); err != nil {
		return "", err
	}
	return from, nil
}
