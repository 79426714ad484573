package optimizer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"hash/fnv"
	"math"
	"slices"

	"github.com/skein-ml/skein/compression"
)

// DiLoCoConfig holds the outer optimizer's settings (ALGORITHMS.md 1).
type DiLoCoConfig struct {
	OuterLR  float64 // eta, paper default 0.7
	Momentum float64 // mu, paper default 0.9
	// MaxDeltaNorm bounds the L2 norm of this member's own pseudo-gradient
	// and of the averaged one; a larger or non-finite one is an error and
	// nothing is applied (0 disables the bound).
	MaxDeltaNorm float64
	// NormGrowth bounds the averaged pseudo-gradient's norm by this many
	// times the median of the last normWindow accepted averages, once
	// normMinHistory have been seen (0 disables it). Honest averages change
	// by a few percent from round to round; one member adding a large
	// offset to its contribution moves the average by orders of magnitude.
	// Such a round is rejected (nothing applied, the volunteer retries or
	// takes the run's state) instead of poisoning every member. The history
	// lives in memory: a member that just joined or restarted relies on
	// MaxDeltaNorm alone until it has seen normMinHistory rounds.
	NormGrowth float64
	// Feedback, if set, compresses this member's pseudo-gradient with error
	// feedback before it enters the collective (for example int4 + EF); the
	// residual carries to the next round and is saved with the checkpoint.
	Feedback *compression.Config
	// Support, if set, sends only each round's shared support (support.go)
	// with error feedback; it excludes Feedback.
	Support *SupportConfig
	// Nominator gathers the members' nominations when Support.Nominate is
	// set.
	Nominator Nominator
	// Subspace, if set, sends only each weight matrix's coordinates in the
	// round's shared low-rank basis, with error feedback (subspace.go); it
	// excludes Feedback and Support.
	Subspace *SubspaceConfig
}

// DefaultDiLoCo returns the paper's outer settings: Nesterov, eta 0.7, mu 0.9.
func DefaultDiLoCo() DiLoCoConfig {
	return DiLoCoConfig{OuterLR: 0.7, Momentum: 0.9, MaxDeltaNorm: 1e6, NormGrowth: 10}
}

// Validate names the first invalid field.
func (c DiLoCoConfig) Validate() error {
	switch {
	case !(c.OuterLR > 0):
		return fmt.Errorf("%w: outer lr %v must be positive", ErrConfig, c.OuterLR)
	case c.Momentum < 0 || c.Momentum >= 1:
		return fmt.Errorf("%w: outer momentum %v must be in [0, 1)", ErrConfig, c.Momentum)
	case c.MaxDeltaNorm < 0:
		return fmt.Errorf("%w: max delta norm %v must be >= 0", ErrConfig, c.MaxDeltaNorm)
	case c.NormGrowth < 0 || (c.NormGrowth > 0 && c.NormGrowth < 1):
		return fmt.Errorf("%w: norm growth %v must be 0 (off) or >= 1", ErrConfig, c.NormGrowth)
	}
	if c.Subspace != nil {
		if c.Feedback != nil || c.Support != nil {
			return fmt.Errorf("%w: a shared subspace with a shared support or dense error feedback", ErrConfig)
		}
		return c.Subspace.Validate()
	}
	if c.Support != nil {
		if c.Feedback != nil {
			return fmt.Errorf("%w: a shared support and dense error feedback together", ErrConfig)
		}
		if c.Support.Nominate > 0 && c.Nominator == nil {
			return fmt.Errorf("%w: support nominations without a Nominator to gather them", ErrConfig)
		}
		return c.Support.Validate()
	}
	if c.Feedback != nil {
		return c.Feedback.Validate()
	}
	return nil
}

// NesterovStep applies the DiLoCo outer update in place:
//
//	m   = mu*m + delta
//	phi = phi - eta*(delta + mu*m)
//
// Every operation is rounded to float32 explicitly, so no compiler may fuse
// it into an FMA and every member computes the same bits.
func NesterovStep(phi, m, delta []float32, eta, mu float32) {
	for i, d := range delta {
		mi := float32(mu*m[i]) + d
		m[i] = mi
		phi[i] -= float32(eta * float32(d+float32(mu*mi)))
	}
}

// nesterovStepScaled is NesterovStep on delta[i]*scale[i], the product
// rounded to float32 first, as a pass that multiplied delta by scale and
// then stepped would round it.
func nesterovStepScaled(phi, m, delta, scale []float32, eta, mu float32) {
	scale = scale[:len(delta)]
	for i, x := range delta {
		d := float32(x * scale[i])
		mi := float32(mu*m[i]) + d
		m[i] = mi
		phi[i] -= float32(eta * float32(d+float32(mu*mi)))
	}
}

// DiLoCo is one member's outer optimizer state: the global ("slow") weights
// phi, the outer momentum and the round number, identical on every member
// after each round. Phi and Mom are written only by its methods (apply and
// SetState), which is what lets it hash them once per state
// (StateChunkHashes); a test that writes them directly calls Touch.
type DiLoCo struct {
	cfg   DiLoCoConfig
	coll  Collective
	Phi   []float32
	Mom   []float32
	Round uint64

	// chunks caches StateChunkHashes(Phi, Mom) while chunksOK: the
	// volunteer's served state and the next round's state hash are the
	// same state, a 1 GB SHA-256 pass at 124M parameters.
	chunks   [][sha256.Size]byte
	chunksOK bool

	delta, avg []float32
	ef         *compression.ErrorFeedback
	efEnc      *compression.Encoder
	efDec      *compression.Decoder
	efBuf      bytes.Buffer
	efEncOnly  bool // quantize the contribution without feedback (for comparisons)

	// shared support (DiLoCoConfig.Support): the residual (local), the
	// round's support and the compacted contribution and average
	resid        []float32
	sup          []int32
	cdelta, cavg []float32
	// csent is cdelta as the wire carried it (SupportConfig.FeedRounding),
	// and sentOK whether the last round's collective filled it.
	csent  []float32
	sentOK bool
	// residNext says that prepare wrote the next residual (decayed, plus
	// delta) into the delta buffer instead of delta (fusedSupport): apply
	// takes out what was sent there and swaps the two buffers.
	residNext bool

	// rot rotates the support's basis (SupportConfig.Rotate); mfull then
	// holds the round's delta rotated (with a residual: without one,
	// prepareRotated and applyRotated work a chunk at a time in rbuf).
	rot  *rotation
	rbuf []float32
	// tiled: a tiled support's draws in a plain round (prepareRotated),
	// with its positions not written into sup (46.6M at 124M parameters,
	// 0.09 s a round): the first chunk's draw, a partial last chunk's,
	// and the draws' scratch bitmap.
	tiled         bool
	tfirst, ttail []int32
	ttaken        []uint64

	// shared subspace (DiLoCoConfig.Subspace): the bases, and this
	// member's full contribution (residual plus delta) of the round
	sub   *subspace
	mfull []float32

	// norms of the last accepted averages (NormGrowth), oldest first
	norms []float64

	// delayed (overlapped) mode
	start   []float32
	pending chan pendingRound
}

type pendingRound struct {
	stats RoundStats
	err   error
}

// NewDiLoCo starts from global weights phi (copied) with zero momentum.
// coll may be nil for a member that only holds state (it cannot step).
func NewDiLoCo(cfg DiLoCoConfig, coll Collective, phi []float32) (*DiLoCo, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n := len(phi)
	d := &DiLoCo{cfg: cfg, coll: coll, Phi: append([]float32(nil), phi...), Mom: make([]float32, n),
		delta: make([]float32, n), avg: make([]float32, n)}
	if s := cfg.Support; s != nil {
		k := s.SupportLen(n)
		// sup is written by SupportWith, which sizes it (a tiled support in
		// plain rounds never writes it: 186 MB at 124M parameters).
		d.cdelta, d.cavg = make([]float32, k), make([]float32, k)
		if s.FeedRounding {
			d.csent = make([]float32, k)
		}
		if s.Nominate > 0 || s.Rotate {
			d.mfull = make([]float32, n)
		}
		if s.Rotate {
			d.rot, d.rbuf = newRotation(s.Chunk), make([]float32, s.Chunk)
		}
		// Without decay nor nominations the residual is never read: no
		// buffer (a model's size, 0.5 GB at 124M parameters) unless the
		// fused passes use it as scratch.
		if d.keepsResidual() || d.denseSupport() {
			d.resid = make([]float32, n)
		}
	}
	if s := cfg.Subspace; s != nil {
		if err := s.checkLen(n); err != nil {
			return nil, err
		}
		k := s.Len(n)
		d.sub, d.resid, d.mfull, d.cdelta, d.cavg = newSubspace(*s), make([]float32, n), make([]float32, n), make([]float32, k), make([]float32, k)
	}
	if cfg.Feedback != nil {
		if cfg.Feedback.MaxElements < int64(n) {
			return nil, fmt.Errorf("%w: feedback codec accepts %d elements, the model has %d", ErrConfig, cfg.Feedback.MaxElements, n)
		}
		var err error
		if d.ef, err = compression.NewErrorFeedback(compression.EF, n); err != nil {
			return nil, err
		}
		if d.efEnc, err = compression.NewEncoder(*cfg.Feedback); err != nil {
			return nil, err
		}
		if d.efDec, err = compression.NewDecoder(*cfg.Feedback); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Residual is what this member has not sent yet of its pseudo-gradients
// with a shared support or subspace: the live slice, to be copied between
// rounds for a checkpoint. It is nil where no residual carries to a later
// round (no support or subspace; a support with decay 0 and no
// nominations, where each round sends its own delta), so nothing is saved.
func (d *DiLoCo) Residual() []float32 {
	if !d.keepsResidual() {
		return nil
	}
	return d.resid
}

// keepsResidual is whether a later round reads this round's residual: a
// subspace's, or a support's with decay or nominations.
func (d *DiLoCo) keepsResidual() bool {
	s := d.cfg.Support
	return d.sub != nil || s != nil && (s.Decay > 0 || s.Nominate > 0)
}

// SetResidual installs a residual saved by this member (a checkpoint's):
// of the model's size and finite, or nothing changes.
func (d *DiLoCo) SetResidual(r []float32) error {
	if !d.keepsResidual() {
		return fmt.Errorf("%w: a residual where none carries between rounds (no support or subspace, or a support without decay)", ErrRejected)
	}
	if len(r) != len(d.resid) {
		return fmt.Errorf("%w: residual of %d elements, want %d", ErrRejected, len(r), len(d.resid))
	}
	if err := checkFinite(r, math.MaxFloat32); err != nil {
		return err
	}
	copy(d.resid, r)
	return nil
}

// Feedback is the error-feedback state (nil without Feedback), for
// checkpoints.
func (d *DiLoCo) Feedback() *compression.ErrorFeedback { return d.ef }

func l2(x []float32) float64 {
	var s float64
	for _, v := range x {
		s += float64(v) * float64(v)
	}
	return math.Sqrt(s)
}

// l2x4 is the L2 norm of x summed in float64 over four sums (element i in
// sum i%4), faster than l2 where one chain of dependent adds bounds the
// pass, and not the same bits.
func l2x4(x []float32) float64 {
	var s0, s1, s2, s3 float64
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += float64(x[i]) * float64(x[i])
		s1 += float64(x[i+1]) * float64(x[i+1])
		s2 += float64(x[i+2]) * float64(x[i+2])
		s3 += float64(x[i+3]) * float64(x[i+3])
	}
	for ; i < len(x); i++ {
		s0 += float64(x[i]) * float64(x[i])
	}
	return math.Sqrt((s0 + s1) + (s2 + s3))
}

// prepare computes this member's contribution delta = start - theta, bounded
// and optionally error-feedback compressed.
//
// plain is a plain round (not the delayed variant, which reads delta
// after it): with a dense support that asks for no nominations and no
// momentum (fusedSupport), the delta buffer receives the next residual
// instead, in the same pass.
func (d *DiLoCo) prepare(ctx context.Context, start, theta []float32, plain bool) error {
	if len(theta) != len(d.Phi) {
		return fmt.Errorf("optimizer: %d local parameters, global has %d", len(theta), len(d.Phi))
	}
	d.residNext = false
	if plain && d.fusedSupport() {
		return d.prepareFused(start, theta)
	}
	if plain && d.rot != nil && d.cfg.Support.Decay == 0 {
		return d.prepareRotated(start, theta)
	}
	var sq [4]float64
	diffSquares(d.delta[:len(theta)], start, theta, &sq)
	if err := d.checkOwnNorm(sq[0], sq[1], sq[2], sq[3]); err != nil {
		return err
	}
	switch {
	case d.sub != nil:
		// This member's contribution: its residual plus delta, projected
		// on the round's bases.
		decay := d.cfg.Subspace.Decay
		for i, v := range d.delta {
			d.mfull[i] = float32(decay*d.resid[i]) + v
		}
		d.sub.project(d.cdelta, d.mfull, d.Round)
		return nil
	case d.cfg.Support != nil:
		// The round's support, from the certified momentum; this member's
		// contribution there is its residual plus delta.
		decay := d.cfg.Support.Decay
		var nominated []int32
		if s := d.cfg.Support; s.Nominate > 0 && d.cfg.Nominator != nil {
			for i, v := range d.delta {
				if s.NominateFromResidual {
					v = 0
				}
				d.mfull[i] = float32(decay*d.resid[i]) + v
			}
			var err error
			if nominated, err = d.cfg.Nominator.Nominate(ctx, d.Round, s.Nominations(nil, d.mfull, s.Nominate)); err != nil {
				return err
			}
		}
		d.sup, d.tiled = d.cfg.Support.SupportWith(d.sup[:0], d.Mom, d.Round, nominated), false
		src := d.delta
		if d.rot != nil {
			src = d.mfull
			copy(src, d.delta)
			d.rot.forward(src)
		}
		if decay == 0 { // no residual: each round sends its own delta
			for j, p := range d.sup {
				d.cdelta[j] = src[p]
			}
			return nil
		}
		for j, p := range d.sup {
			d.cdelta[j] = float32(decay*d.resid[p]) + src[p]
		}
		return nil
	case d.ef != nil:
		d.efBuf.Reset()
		if err := d.ef.Encode(d.efEnc, &d.efBuf, d.delta, d.seed()); err != nil {
			return err
		}
	case d.efEncOnly:
		d.efBuf.Reset()
		if err := d.efEnc.Encode(&d.efBuf, d.delta, d.seed()); err != nil {
			return err
		}
	default:
		return nil
	}
	if _, err := d.efDec.DecodeBytes(d.efBuf.Bytes(), d.delta); err != nil {
		return err
	}
	return nil
}

// checkOwnNorm rejects this member's pseudo-gradient when its norm, from
// four partial sums of squares, is not finite or beyond MaxDeltaNorm.
func (d *DiLoCo) checkOwnNorm(s0, s1, s2, s3 float64) error {
	if n := math.Sqrt((s0 + s1) + (s2 + s3)); math.IsNaN(n) || math.IsInf(n, 0) || (d.cfg.MaxDeltaNorm > 0 && n > d.cfg.MaxDeltaNorm) {
		return fmt.Errorf("%w: own pseudo-gradient norm %v (bound %v)", ErrRejected, n, d.cfg.MaxDeltaNorm)
	}
	return nil
}

// denseSupport is whether the round's support has no momentum and is
// dense enough that every cache line of the model holds some of it:
// apply then works it in one pass per chunk (applyDenseSupport).
func (d *DiLoCo) denseSupport() bool {
	s := d.cfg.Support
	return s != nil && d.sub == nil && d.rot == nil && d.cfg.Momentum == 0 && 8*s.K > s.Chunk
}

// fusedSupport is whether the round's support runs fused passes
// (prepareFused, applyDenseSupport): a support without momentum dense
// enough that every cache line of the model holds some of it, chosen
// without nominations.
func (d *DiLoCo) fusedSupport() bool {
	return d.denseSupport() && d.cfg.Support.Nominate == 0
}

// prepareFused is prepare's pass for fusedSupport: delta = start - theta
// and its norm as prepare computes them, but what it stores is the next
// residual, decay*resid + delta (the same operations apply's residual
// update does), in the delta buffer; the contribution is that at the
// support. One pass writes one array where two passes (delta here, the
// residual in apply) read and wrote five.
func (d *DiLoCo) prepareFused(start, theta []float32) error {
	s := d.cfg.Support
	d.sup = s.SupportWith(d.sup[:0], d.Mom, d.Round, nil)
	decay := s.Decay
	var s0, s1, s2, s3 float64
	n := len(theta)
	start, resid, next := start[:n], d.resid[:n], d.delta[:n]
	i := 0
	for ; i+4 <= n; i += 4 {
		v0, v1, v2, v3 := start[i]-theta[i], start[i+1]-theta[i+1], start[i+2]-theta[i+2], start[i+3]-theta[i+3]
		s0 += float64(v0) * float64(v0)
		s1 += float64(v1) * float64(v1)
		s2 += float64(v2) * float64(v2)
		s3 += float64(v3) * float64(v3)
		if decay == 1 {
			next[i], next[i+1], next[i+2], next[i+3] = resid[i]+v0, resid[i+1]+v1, resid[i+2]+v2, resid[i+3]+v3
		} else {
			next[i], next[i+1] = float32(decay*resid[i])+v0, float32(decay*resid[i+1])+v1
			next[i+2], next[i+3] = float32(decay*resid[i+2])+v2, float32(decay*resid[i+3])+v3
		}
	}
	for ; i < n; i++ {
		v := start[i] - theta[i]
		s0 += float64(v) * float64(v)
		if decay == 1 {
			next[i] = resid[i] + v
		} else {
			next[i] = float32(decay*resid[i]) + v
		}
	}
	if err := d.checkOwnNorm(s0, s1, s2, s3); err != nil {
		return err
	}
	for j, p := range d.sup {
		d.cdelta[j] = next[p]
	}
	d.residNext = true
	return nil
}

// prepareRotated is prepare's pass for a rotated support without a
// residual in a plain round: a chunk at a time, in a buffer that stays in
// cache, delta = start - theta (and its norm, as prepare computes it),
// rotated, and its values at the support taken as the contribution. The
// same operations on the same values as prepare's passes over the whole
// model (delta, its copy, the rotation, the gather), which read and wrote
// it four times; nothing else reads delta after a plain round without a
// residual.
func (d *DiLoCo) prepareRotated(start, theta []float32) error {
	s := d.cfg.Support
	d.drawRotated(len(theta))
	var sq [4]float64
	n := len(theta)
	cdelta := d.cdelta
	j, at := 0, 0
	for lo := 0; lo < n; lo += s.Chunk {
		hi := min(lo+s.Chunk, n)
		c := d.rbuf[:hi-lo]
		var a, b []int32
		var da, db int32
		a, da, b, db, at = d.chunkSupport(lo, hi, at)
		if len(c) < s.Chunk { // a last, partial chunk is not rotated
			diffSquares(c, start[lo:hi], theta[lo:hi], &sq)
			for _, p := range a {
				cdelta[j] = c[p+da]
				j++
			}
			continue
		}
		// forwardChunk's operations: D in the difference's pass, H, and
		// the scale only where the support takes a value.
		diffSignsSquares(c, start[lo:hi], theta[lo:hi], d.rot.signs, &sq)
		fwht(c)
		scale := d.rot.scale
		for _, p := range a {
			cdelta[j] = c[p+da] * scale
			j++
		}
		for _, p := range b {
			cdelta[j] = c[p+db] * scale
			j++
		}
	}
	return d.checkOwnNorm(sq[0], sq[1], sq[2], sq[3])
}

// drawRotated draws the round's support for prepareRotated: tiled, its
// draws alone (tiledDraws), else every position into sup.
func (d *DiLoCo) drawRotated(n int) {
	s := d.cfg.Support
	if d.tiled = s.Tiled; d.tiled {
		d.tfirst, d.ttail, d.ttaken = s.tiledDraws(d.tfirst, d.ttail, d.ttaken, d.Round, n)
		return
	}
	d.sup = s.SupportWith(d.sup[:0], d.Mom, d.Round, nil)
}

// chunkSupport returns the round's support in the chunk [lo, hi) as two
// runs of positions, a[i]+da then b[i]+db (relative to lo, together
// increasing), and where the next chunk's positions start in sup (at,
// from this chunk's): a tiled support's from its draws (tiledRuns), any
// other's from sup.
func (d *DiLoCo) chunkSupport(lo, hi, at int) (a []int32, da int32, b []int32, db int32, next int) {
	if !d.tiled {
		next = at
		for next < len(d.sup) && int(d.sup[next]) < hi {
			next++
		}
		return d.sup[at:next], -int32(lo), nil, 0, next
	}
	if hi-lo < d.cfg.Support.Chunk {
		return d.ttail, -int32(lo), nil, 0, at
	}
	a, da, b, db = tiledRuns(d.tfirst, tiledOffset(d.Round, lo, d.cfg.Support.Chunk), d.cfg.Support.Chunk)
	return a, da, b, db, at
}

// diffSignsSquares sets dst = (a - b) * signs (all of dst's length; signs
// each +1 or -1: D (a - b), which forwardChunk's first loop would compute)
// and adds the differences' squares (exactly the products') to sq, over
// four sums: element i to sq[i%4], the tail to sq[0] (diffSquares).
func diffSignsSquares(dst, a, b, signs []float32, sq *[4]float64) {
	n := len(dst)
	a, b, signs = a[:n], b[:n], signs[:n]
	s0, s1, s2, s3 := sq[0], sq[1], sq[2], sq[3]
	i := 0
	for ; i+4 <= n; i += 4 {
		v0, v1, v2, v3 := a[i]-b[i], a[i+1]-b[i+1], a[i+2]-b[i+2], a[i+3]-b[i+3]
		dst[i], dst[i+1], dst[i+2], dst[i+3] = v0*signs[i], v1*signs[i+1], v2*signs[i+2], v3*signs[i+3]
		s0 += float64(v0) * float64(v0)
		s1 += float64(v1) * float64(v1)
		s2 += float64(v2) * float64(v2)
		s3 += float64(v3) * float64(v3)
	}
	for ; i < n; i++ {
		v := a[i] - b[i]
		dst[i] = v * signs[i]
		s0 += float64(v) * float64(v)
	}
	sq[0], sq[1], sq[2], sq[3] = s0, s1, s2, s3
}

// diffSquares sets dst = a - b (all of dst's length) and adds the squares
// of dst to sq, over four sums: one sum's chain of dependent adds would
// bound the pass (the norm they make only meets a bound). Element i adds
// to sq[i%4] (the tail to sq[0]), so passes over a vector's pieces of a
// multiple of 4 long sum as one pass over it does: it is
// diffSignsSquares with every sign +1 (a product that changes nothing),
// a piece of len(ones) at a time.
func diffSquares(dst, a, b []float32, sq *[4]float64) {
	for lo := 0; lo < len(dst); lo += len(ones) {
		hi := min(lo+len(ones), len(dst))
		diffSignsSquares(dst[lo:hi], a[lo:hi], b[lo:hi], ones[:hi-lo], sq)
	}
}

// ones is diffSquares' signs.
var ones = func() (o [4096]float32) {
	for i := range o {
		o[i] = 1
	}
	return o
}()

// applyRotated is apply's outer step for a rotated support: a chunk at a
// time, in a buffer that stays in cache, the average scattered from the
// support, rotated back, and the Nesterov step of phi and the momentum
// on it. The same operations on the same values as clearing the average
// over the whole model, scattering, rotating it back and stepping, which
// read and wrote it four times.
func (d *DiLoCo) applyRotated(eta, mu float32) {
	s := d.cfg.Support
	n := len(d.Phi)
	cavg := d.cavg
	j, at := 0, 0
	for lo := 0; lo < n; lo += s.Chunk {
		hi := min(lo+s.Chunk, n)
		c := d.rbuf[:hi-lo]
		clear(c)
		var a, b []int32
		var da, db int32
		a, da, b, db, at = d.chunkSupport(lo, hi, at)
		for _, p := range a {
			c[p+da] = cavg[j]
			j++
		}
		for _, p := range b {
			c[p+db] = cavg[j]
			j++
		}
		if len(c) < s.Chunk { // not rotated
			NesterovStep(d.Phi[lo:hi], d.Mom[lo:hi], c, eta, mu)
			continue
		}
		// inverseChunk's operations, its last loop (the scaled signs)
		// in the step's pass.
		fwht(c)
		nesterovStepScaled(d.Phi[lo:hi], d.Mom[lo:hi], c, d.rot.scaledSigns, eta, mu)
	}
}

// applyDenseSupport is apply's step, momentum and residual for a support
// without momentum dense enough that every cache line of the model holds
// some of it: the same operations on each coordinate, in the same order,
// as the passes of apply (clear the momentum, step the support, decay the
// residual and take out what was sent), fused into one pass over each
// chunk while it is in cache, where the separate passes read and wrote
// the model's arrays five times over.
func (d *DiLoCo) applyDenseSupport(eta float32) {
	s := d.cfg.Support
	const mu = float32(0)
	phi, mom, resid, delta := d.Phi, d.Mom, d.resid[:len(d.Phi)], d.delta[:len(d.Phi)]
	sup, cavg, csent := d.sup, d.cavg[:len(d.sup)], d.csent
	if d.sentOK {
		csent = csent[:len(sup)]
	}
	if d.residNext {
		// prepareFused left the next residual in the delta buffer.
		resid = delta
	}
	j := 0
	for lo := 0; lo < len(phi); lo += s.Chunk {
		hi := min(lo+s.Chunk, len(phi))
		clear(mom[lo:hi])
		r, dl := resid[lo:hi], delta[lo:hi]
		switch {
		case d.residNext: // decayed and added in prepareFused
		case s.Decay == 1:
			for i, v := range dl {
				r[i] += v
			}
		default:
			for i, v := range dl {
				r[i] = float32(s.Decay*r[i]) + v
			}
		}
		for ; j < len(sup) && int(sup[j]) < hi; j++ {
			p := sup[j]
			NesterovStep(phi[p:p+1], mom[p:p+1], cavg[j:j+1], eta, mu)
			if d.sentOK {
				resid[p] -= csent[j]
			} else {
				resid[p] = 0
			}
		}
	}
	if d.residNext {
		d.resid, d.delta, d.residNext = d.delta, d.resid, false
	}
}

// seed keys stochastic rounding of this member's contribution by round and
// member, so that members' rounding errors are independent and average out.
func (d *DiLoCo) seed() uint64 {
	h := fnv.New64a()
	if d.coll != nil {
		h.Write([]byte(d.coll.Self()))
	}
	return d.Round*0x9E3779B97F4A7C15 ^ h.Sum64()
}

func (d *DiLoCo) apply() error {
	d.Touch() // before anything can write phi or the momentum
	if d.sub != nil {
		d.sub.expand(d.avg, d.cavg, d.Round)
	}
	// The norm only meets bounds (every member computes the same bits from
	// the same average): four chains of adds, not one.
	var n float64
	if d.cfg.Support != nil {
		// The average is zero off the support: its norm is the compacted
		// one's.
		n = l2x4(d.cavg)
	} else {
		n = l2x4(d.avg)
	}
	if math.IsNaN(n) || math.IsInf(n, 0) || (d.cfg.MaxDeltaNorm > 0 && n > d.cfg.MaxDeltaNorm) {
		return fmt.Errorf("%w: averaged pseudo-gradient norm %v (bound %v)", ErrRejected, n, d.cfg.MaxDeltaNorm)
	}
	if bound, ok := d.normBound(); ok && n > bound {
		return fmt.Errorf("%w: averaged pseudo-gradient norm %.4g is more than %v times the recent median (bound %.4g)",
			ErrRejected, n, d.cfg.NormGrowth, bound)
	}
	d.norms = append(d.norms, n)
	if len(d.norms) > normWindow {
		d.norms = d.norms[1:]
	}
	eta, mu := float32(d.cfg.OuterLR), float32(d.cfg.Momentum)
	if d.denseSupport() {
		d.applyDenseSupport(eta)
		d.Round++
		return nil
	}
	if d.cfg.Support != nil && mu == 0 && d.rot == nil {
		// Off the support NesterovStep with a zero average and no momentum
		// sets the momentum to +0 and leaves phi as it is: only the
		// support is worked (the same bits). The momentum is non-zero at
		// the last support alone (or anywhere, after a state was
		// installed): a read that writes only those costs far less than
		// clearing it all.
		if s := d.cfg.Support; 8*s.K > s.Chunk {
			clear(d.Mom) // dense enough that testing costs more than writing
		} else {
			for i, v := range d.Mom {
				if math.Float32bits(v) != 0 {
					d.Mom[i] = 0
				}
			}
		}
		for j, p := range d.sup {
			NesterovStep(d.Phi[p:p+1], d.Mom[p:p+1], d.cavg[j:j+1], eta, mu)
		}
	} else if d.rot != nil {
		d.applyRotated(eta, mu)
	} else {
		if d.cfg.Support != nil {
			clear(d.avg)
			for j, p := range d.sup {
				d.avg[p] = d.cavg[j]
			}
		}
		NesterovStep(d.Phi, d.Mom, d.avg, eta, mu)
	}
	if d.sub != nil {
		// The residual keeps what this member's own projection missed
		// (exactly: the projection is orthogonal); then the bases move on
		// to the aggregate's.
		d.sub.expand(d.resid, d.cdelta, d.Round)
		for i, v := range d.mfull {
			d.resid[i] = v - d.resid[i]
		}
		d.sub.advance(d.cavg, d.Round)
	}
	d.Round++
	if s := d.cfg.Support; s != nil && s.Decay > 0 {
		// What was sent leaves the residual; the rest waits for a later
		// round's support. With decay 0 nothing waits: the residual is
		// never read, and stays zero.
		delta := d.delta
		if d.rot != nil {
			delta = d.mfull // in the support's basis
		}
		if s.Decay == 1 {
			for i, v := range delta {
				d.resid[i] += v
			}
		} else {
			for i, v := range delta {
				d.resid[i] = float32(s.Decay*d.resid[i]) + v
			}
		}
		if d.sentOK {
			// What the rounding lost stays too.
			for j, p := range d.sup {
				d.resid[p] -= d.csent[j]
			}
		} else {
			for _, p := range d.sup {
				d.resid[p] = 0
			}
		}
	}
	return nil
}

// The adaptive bound on the average's norm (DiLoCoConfig.NormGrowth).
const (
	normWindow     = 8
	normMinHistory = 3
)

// normBound is NormGrowth times the median of the recent accepted norms,
// and whether there is enough history for it.
func (d *DiLoCo) normBound() (float64, bool) {
	if d.cfg.NormGrowth == 0 || len(d.norms) < normMinHistory {
		return 0, false
	}
	s := slices.Clone(d.norms)
	slices.Sort(s)
	return d.cfg.NormGrowth * s[len(s)/2], true
}

// OuterStep ends an inner phase: theta (the local weights after H inner
// steps) gives the pseudo-gradient phi - theta, which is averaged over the
// round's group; the Nesterov step updates phi and the momentum, and theta is
// reset to the new phi. On error nothing changes and the round can be
// retried.
func (d *DiLoCo) OuterStep(ctx context.Context, theta []float32) (RoundStats, error) {
	if d.pending != nil {
		return RoundStats{}, fmt.Errorf("optimizer: OuterStep while a delayed round is in flight")
	}
	var efSnapshot []byte
	if d.ef != nil {
		var err error
		if efSnapshot, err = d.ef.MarshalBinary(); err != nil {
			return RoundStats{}, err
		}
	}
	var st RoundStats
	err := d.prepare(ctx, d.Phi, theta, true)
	if err == nil {
		st, err = d.reduce(ctx, d.Round, d.StateHash())
	}
	if err == nil {
		err = d.apply()
	}
	if err != nil {
		if d.ef != nil { // the round did not happen: neither did its residual
			if rerr := d.ef.UnmarshalBinary(efSnapshot); rerr != nil {
				return st, fmt.Errorf("%w (and restoring error feedback: %v)", err, rerr)
			}
		}
		return st, err
	}
	copy(theta, d.Phi)
	return st, nil
}

// OuterStepDelayed is the one-step-delayed variant (ALGORITHMS.md 1): it
// starts averaging this phase's progress and returns at once; the average
// is applied at the next call (or Flush), after the next inner phase ran
// concurrently with the exchange. theta becomes the round's expected
// result (eagerStart), where the next phase trains until the round lands.
// The returned stats are those of the round that was applied, if any.
func (d *DiLoCo) OuterStepDelayed(ctx context.Context, theta []float32) (RoundStats, error) {
	if d.start == nil {
		d.start = append([]float32(nil), d.Phi...)
	}
	// The round in flight reads delta and writes avg: land it first.
	st, err := d.land()
	if err != nil {
		return st, err
	}
	if err := d.prepare(ctx, d.start, theta, false); err != nil {
		return st, err
	}
	d.eagerStart(theta)
	copy(d.start, theta)
	d.pending = make(chan pendingRound, 1)
	go func(round, hash uint64, ch chan pendingRound) {
		s, err := d.reduce(ctx, round, hash)
		ch <- pendingRound{stats: s, err: err}
	}(d.Round, d.StateHash(), d.pending)
	return st, nil
}

// eagerStart sets theta to where the next inner phase starts while the
// round is in flight (an eager update): the outer step the round would
// take if the group's average were this member's own pseudo-gradient,
// the outer momentum's part exact, its own part as much of it as the
// wire is expected to carry (eagerShare). Landing (Land) then moves the
// phase's progress onto the round's result. Starting from phi plus the
// member's own progress instead, which misses the outer step's momentum
// and learning rate, cost 2.2-2.8% at equal tokens where the round lands
// 30 steps into the phase; this, 1.2-1.7% (BENCHMARKS.md, session 17; a
// round that lands only at the phase's end does worse from here). Its
// operations are NesterovStep's, rounded to float32 at each step: on a
// dense exchange (share 1) where the group's average is this member's
// own, theta is the round's phi bit for bit.
func (d *DiLoCo) eagerStart(theta []float32) {
	eta, mu := float32(d.cfg.OuterLR), float32(d.cfg.Momentum)
	c := d.eagerShare()
	for i, v := range d.delta[:len(theta)] {
		x := v
		if c != 1 {
			x = float32(c * v)
		}
		mi := float32(mu*d.Mom[i]) + x
		theta[i] = d.Phi[i] - float32(eta*float32(x+float32(mu*mi)))
	}
}

// eagerShare is the share of a pseudo-gradient one round's outer step is
// expected to apply: all of it on a dense exchange; with a shared support
// or subspace keeping a fraction p of the coordinates, p of it a round
// without a residual, and with one decayed by r, what reaches the wire in
// the residual's steady state, p / (1 - r(1 - p)) (all of it at r = 1).
func (d *DiLoCo) eagerShare() float32 {
	var p, r float64
	switch {
	case d.cfg.Support != nil:
		p, r = float64(d.cfg.Support.K)/float64(d.cfg.Support.Chunk), float64(d.cfg.Support.Decay)
	case d.sub != nil:
		p, r = float64(len(d.cdelta))/float64(len(d.Phi)), float64(d.cfg.Subspace.Decay)
	default:
		return 1
	}
	return float32(min(1, p/(1-r*(1-p))))
}

// reduce averages delta into avg over the round's group; a collective that
// checks states gets the hash of the state the round starts from.
func (d *DiLoCo) reduce(ctx context.Context, round, hash uint64) (RoundStats, error) {
	if d.coll == nil {
		return RoundStats{}, fmt.Errorf("optimizer: DiLoCo without a collective")
	}
	x, out := d.delta, d.avg
	if d.cfg.Support != nil || d.sub != nil {
		x, out = d.cdelta, d.cavg
	}
	d.sentOK = false
	if sc, ok := d.coll.(sentCollective); ok && d.csent != nil {
		st, err := sc.AllReduceSent(ctx, round, hash, x, out, d.csent)
		d.sentOK = err == nil
		return st, err
	}
	if sc, ok := d.coll.(stateCollective); ok {
		return sc.AllReduceFrom(ctx, round, hash, x, out)
	}
	return d.coll.AllReduceMean(ctx, round, x, out)
}

// Flush waits for a delayed round in flight, applies it and sets theta to
// phi.
func (d *DiLoCo) Flush(theta []float32) (RoundStats, error) {
	st, err := d.land()
	if err != nil {
		return st, err
	}
	copy(theta, d.Phi)
	d.start = nil
	return st, nil
}

// Abandon gives up the delayed variant's work in progress: it waits for the
// round in flight, if any, discards its result without applying it, and
// forgets the phase start, so that the next OuterStepDelayed measures
// progress from phi again. Plain OuterStep may be used after it.
func (d *DiLoCo) Abandon() {
	if d.pending != nil {
		<-d.pending
		d.pending = nil
	}
	d.start = nil
}

// InFlight reports whether a delayed round is in flight.
func (d *DiLoCo) InFlight() bool { return d.pending != nil }

// ExchangeDone reports, without waiting, whether the delayed round in
// flight has finished its exchange, so that Land would not wait.
func (d *DiLoCo) ExchangeDone() bool { return d.pending != nil && len(d.pending) > 0 }

// Land applies the delayed round in flight during the next inner phase,
// as soon as its exchange ends (Streaming DiLoCo's overlap of a few inner
// steps, without its fragments), instead of at the phase's end: the phase
// then trains on from the round's result for its remaining steps rather
// than from a state one round stale. theta is the local weights, the
// phase's eager start (the round's expected result, eagerStart) plus this
// member's progress since; Land moves them onto the round's result,
// theta += phi' - start, so the progress made since the phase began is
// kept and the next
// pseudo-gradient measures only it. It waits for the exchange (see
// ExchangeDone) and does nothing without a round in flight. A failed
// round returns its error with nothing applied, as OuterStepDelayed does.
func (d *DiLoCo) Land(theta []float32) (RoundStats, error) {
	if d.pending == nil {
		return RoundStats{}, nil
	}
	if len(theta) != len(d.Phi) {
		return RoundStats{}, fmt.Errorf("optimizer: %d local parameters, global has %d", len(theta), len(d.Phi))
	}
	st, err := d.land()
	if err != nil {
		return st, err
	}
	for i, p := range d.Phi {
		theta[i] += p - d.start[i]
	}
	copy(d.start, d.Phi)
	return st, nil
}

// land waits for the delayed round in flight, if any, and applies it.
func (d *DiLoCo) land() (RoundStats, error) {
	if d.pending == nil {
		return RoundStats{}, nil
	}
	res := <-d.pending
	d.pending = nil
	if res.err != nil {
		return res.stats, res.err
	}
	return res.stats, d.apply()
}

// StateHash hashes the round, phi and the momentum (StateHashOf): members
// compare it (by gossip) to detect divergence, and a member adopts a
// downloaded state only if it has the hash the run announces.
func (d *DiLoCo) StateHash() uint64 {
	return StateRoot(d.Round, len(d.Phi), d.StateChunkHashes())
}

// StateChunkHashes is optimizer.StateChunkHashes(d.Phi, d.Mom), computed
// once per state: apply and SetState drop it. The result is shared: the
// caller must not modify it.
func (d *DiLoCo) StateChunkHashes() [][sha256.Size]byte {
	if !d.chunksOK {
		d.chunks, d.chunksOK = StateChunkHashes(d.Phi, d.Mom), true
	}
	return d.chunks
}

// Touch says that Phi or Mom were written other than by DiLoCo's methods,
// so that the next state hash reads them again.
func (d *DiLoCo) Touch() { d.chunksOK = false }

// State returns copies of the shared state for a joiner.
func (d *DiLoCo) State() (round uint64, phi, mom []float32) {
	return d.Round, append([]float32(nil), d.Phi...), append([]float32(nil), d.Mom...)
}

// SetState installs the shared state fetched from a member: a joiner calls
// it before its first round and then takes part from that round on. A
// delayed round in flight is abandoned first (see Abandon): the state
// adopted supersedes it.
func (d *DiLoCo) SetState(round uint64, phi, mom []float32) error {
	if len(phi) != len(d.Phi) || len(mom) != len(d.Mom) {
		return fmt.Errorf("%w: state of %d/%d elements, want %d", ErrRejected, len(phi), len(mom), len(d.Phi))
	}
	d.Abandon()
	if err := checkFinite(phi, math.MaxFloat32); err != nil {
		return err
	}
	if err := checkFinite(mom, math.MaxFloat32); err != nil {
		return err
	}
	d.Touch()
	d.Round = round
	copy(d.Phi, phi)
	copy(d.Mom, mom)
	return nil
}
