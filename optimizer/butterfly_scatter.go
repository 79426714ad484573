package optimizer

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math"
	"slices"

	"github.com/skein-ml/skein/transport"
)

// Phases 2 and 3 of a butterfly round (butterfly.go): the parts to their
// two owners, the owners' cross-check, and the robust aggregate.

// ---- 2. Scatter -----------------------------------------------------------

func (b *Butterfly) partSeed(c *bfRound, p uint32, who int) uint64 {
	return c.gh ^ uint64(p)<<32 ^ uint64(who+1)*0x9E3779B97F4A7C15
}

func (b *Butterfly) scatter(c *bfRound) {
	M := len(c.group)
	for p := range M {
		lo, hi := chunkBounds(b.cfg.Len, M, p)
		x := c.x[lo:hi]
		if k, ok := hostileScale[b.cfg.Hostile]; ok {
			x = make([]float32, hi-lo)
			for i, v := range c.x[lo:hi] {
				x[i] = v * k
			}
		}
		if b.cfg.Hostile == HostileCollude {
			var sq float64
			for _, v := range c.x[lo:hi] {
				sq += float64(v) * float64(v)
			}
			x = make([]float32, hi-lo)
			for i := range min(3, len(x)) {
				x[i] = float32(4 * math.Sqrt(sq/3))
			}
		}
		if b.cfg.Hostile == HostilePoison {
			x = make([]float32, hi-lo)
			for i := range x {
				x[i] = 1e30
			}
		}
		frame, err := b.enc.Append(nil, x, b.partSeed(c, uint32(p), c.me))
		if err != nil {
			b.finish(c, fmt.Errorf("%w: encoding part %d: %v", ErrRoundFailed, p, err))
			return
		}
		if c.sent != nil {
			if _, err := b.dec.DecodeBytes(frame, c.sent[lo:hi]); err != nil {
				b.finish(c, fmt.Errorf("%w: decoding own part %d: %v", ErrRoundFailed, p, err))
				return
			}
		}
		hash := sha256.Sum256(frame)
		sig, err := b.cfg.Signer.Sign(partSigMsg(c.round, c.attempt, c.gh, uint32(p), hash))
		if err != nil || len(sig) != sigLen {
			b.finish(c, fmt.Errorf("%w: signing part %d: %v", ErrRoundFailed, p, err))
			return
		}
		msg := append(slices.Clone(sig), frame...)
		h := header{kind: kindPart, round: c.round, group: c.gh, step: c.attempt, chunk: uint32(p)}
		for _, o := range []transport.PeerID{c.parts[p].a, c.parts[p].b} {
			switch o {
			case "":
			case b.self:
				b.takePart(c, uint32(c.me), h, msg)
			default:
				b.send(o, h, msg)
			}
		}
	}
}

func (b *Butterfly) onPart(from transport.PeerID, h header, body []byte) {
	c := b.cur
	idx := slices.Index(c.group, from)
	if h.group != c.gh || idx < 0 {
		return
	}
	b.takePart(c, uint32(idx), h, body)
}

// takePart checks and keeps member idx's part h.chunk (signature, size,
// values); a signed bad part makes its producer an offender.
func (b *Butterfly) takePart(c *bfRound, idx uint32, h header, body []byte) {
	o := c.owned[h.chunk]
	from := c.group[idx]
	if o == nil || o.done || len(body) < sigLen || o.inputs[idx] != nil {
		return
	}
	frame := body[sigLen:]
	in := &bfInput{frame: slices.Clone(frame)}
	in.idx = idx
	in.hash = sha256.Sum256(frame)
	copy(in.sig[:], body[:sigLen])
	if !b.cfg.Signer.Verify(from, partSigMsg(c.round, c.attempt, c.gh, h.chunk, in.hash), in.sig[:]) {
		return // not provably from it: drop
	}
	lo, hi := chunkBounds(b.cfg.Len, len(c.group), int(h.chunk))
	vals := make([]float32, hi-lo)
	if err := b.decodeChecked(frame, vals); err != nil {
		b.offend(from, "part %d of round %d: %v", h.chunk, c.round, err)
		if o.refused == nil {
			o.refused = map[uint32]bool{}
		}
		o.refused[idx] = true
		return
	}
	in.vals = vals
	o.inputs[idx] = in
}

func (b *Butterfly) decodeChecked(frame []byte, dst []float32) error {
	hd, err := b.dec.ReadHeader(bytes.NewReader(frame))
	if err != nil {
		return err
	}
	if hd.Count != int64(len(dst)) {
		return fmt.Errorf("%w: frame of %d elements, want %d", ErrRejected, hd.Count, len(dst))
	}
	if _, err := b.dec.DecodeBytes(frame, dst); err != nil {
		return err
	}
	return checkFinite(dst, b.cfg.MaxAbs)
}

// ---- 3. Cross-check and aggregate ------------------------------------------

func (b *Butterfly) sortedOwned(c *bfRound) []*bfOwned {
	out := make([]*bfOwned, 0, len(c.owned))
	for _, o := range c.owned {
		out = append(out, o)
	}
	slices.SortFunc(out, func(x, y *bfOwned) int { return int(x.p) - int(y.p) })
	return out
}

func (b *Butterfly) haveList(o *bfOwned) []signedInput {
	out := make([]signedInput, 0, len(o.inputs))
	for _, in := range o.inputs {
		out = append(out, in.signedInput)
	}
	slices.SortFunc(out, func(x, y signedInput) int { return int(x.idx) - int(y.idx) })
	return out
}

func (b *Butterfly) advanceOwned(c *bfRound, o *bfOwned) {
	if o.done {
		return
	}
	scatterDue := c.groupAt + b.scatterEst.deadline(b.cfg.PhaseWait, b.cfg.MinPhase, b.cfg.MaxPhase)
	// Members this member suspends are not waited for, once a majority of
	// the group's inputs is in (butterfly_silence.go): a schedule where
	// their parts come late, which the round survives anyway.
	all := !(len(c.suspects) > 0 && 2*len(o.inputs) <= len(c.group))
	for i, p := range c.group {
		if o.inputs[uint32(i)] == nil && !o.refused[uint32(i)] && !b.gone(p) && !c.suspects[p] {
			all = false
		}
	}
	if !all && b.now < scatterDue {
		return
	}
	if all && !o.sentHave {
		b.scatterEst.observeIf(b.now-c.groupAt, !c.frozen)
	}
	if o.co != "" && !o.sentHave {
		o.sentHave = true
		b.send(o.co, header{kind: kindHave, round: c.round, group: c.gh, step: c.attempt, chunk: o.p},
			appendInputs(nil, b.haveList(o)))
	}
	// Nor a suspended co-owner's list: aggregating without it is what a
	// co-owner whose list came late gets anyway.
	if o.co != "" && !o.gotCoHave && !b.gone(o.co) && !c.suspects[o.co] && b.now < scatterDue+b.cfg.MinPhase {
		return
	}
	b.aggregate(c, o)
}

func (b *Butterfly) onHave(from transport.PeerID, h header, body []byte) {
	c := b.cur
	o := c.owned[h.chunk]
	if h.group != c.gh || o == nil || o.co != from || o.gotCoHave {
		return
	}
	list, err := parseInputs(body, len(c.group))
	if err != nil {
		return
	}
	o.coHave, o.gotCoHave = list, true
}

// aggregate forms the part's inputs (those both owners hold with the same
// hash; equivocators out) and sends the result or its digest.
func (b *Butterfly) aggregate(c *bfRound, o *bfOwned) {
	use := map[uint32]*bfInput{}
	for idx, in := range o.inputs {
		use[idx] = in
	}
	if o.gotCoHave {
		theirs := map[uint32]signedInput{}
		for _, s := range o.coHave {
			theirs[s.idx] = s
		}
		for idx, in := range o.inputs {
			t, ok := theirs[idx]
			switch {
			case !ok:
				delete(use, idx)
			case t.hash != in.hash:
				delete(use, idx)
				p := c.group[idx]
				if b.cfg.Signer.Verify(p, partSigMsg(c.round, c.attempt, c.gh, o.p, t.hash), t.sig[:]) {
					b.offend(p, "signed two different frames for part %d of round %d", o.p, c.round)
				}
			}
		}
	}
	o.decls = o.decls[:0]
	idxs := make([]uint32, 0, len(use))
	for idx := range use {
		idxs = append(idxs, idx)
	}
	slices.Sort(idxs)
	for _, idx := range idxs {
		o.decls = append(o.decls, use[idx].decl)
	}
	if 2*len(idxs) <= len(c.group) {
		// Most of the group did not contribute: it may have gone to another
		// group of this attempt (a leader taking over from a slow one).
		// Fail the round rather than end it with a result the rest of the
		// run does not share; the members retry with a new attempt.
		b.finish(c, fmt.Errorf("%w: part %d has contributions from %d of the %d members", ErrRoundFailed, o.p, len(idxs), len(c.group)))
		return
	}
	frame, err := b.aggregateFrame(c, o.p, idxs, func(i uint32) []float32 { return use[i].vals })
	if err != nil {
		b.finish(c, fmt.Errorf("%w: aggregating part %d: %v", ErrRoundFailed, o.p, err))
		return
	}
	o.frame, o.done = frame, true
	h := header{kind: kindResult, round: c.round, group: c.gh, step: c.attempt, chunk: o.p}
	var body []byte
	if o.primary {
		sent := frame
		if b.cfg.Hostile == HostileForge {
			sent = b.forged(c, o.p)
		}
		body = append(appendDecls(nil, o.decls), sent...)
	} else {
		h.kind = kindDigest
		c.parts[o.p].frameB = frame
		d := sha256.Sum256(frame)
		body = appendDecls(append([]byte(nil), d[:]...), o.decls)
	}
	for i, p := range c.group {
		if i == c.me {
			b.step(p, h, body, false) // our own copy, through the same path
			continue
		}
		b.send(p, h, body)
	}
	for _, p := range o.fetchers {
		b.send(p, header{kind: kindResult, round: c.round, group: c.gh, step: c.attempt, chunk: o.p},
			append(appendDecls(nil, o.decls), frame...))
	}
	o.fetchers = nil
}

// aggregateFrame is the encoded robust aggregate of the given inputs of
// part p (ordered by member index): the same bits on every member.
func (b *Butterfly) aggregateFrame(c *bfRound, p uint32, idxs []uint32, vals func(uint32) []float32) ([]byte, error) {
	lo, hi := chunkBounds(b.cfg.Len, len(c.group), int(p))
	agg := make([]float32, hi-lo)
	ins := make([][]float32, len(idxs))
	for i, idx := range idxs {
		ins[i] = vals(idx)
	}
	b.scratch = b.cfg.Robust.Aggregate(agg, ins, b.scratch)
	return b.aggEnc.Append(nil, agg, b.partSeed(c, p, -1)^0xA66)
}

// forged is what a hostile owner sends instead of part p's aggregate: a
// well-formed frame of large values, under the honest list of inputs.
func (b *Butterfly) forged(c *bfRound, p uint32) []byte {
	lo, hi := chunkBounds(b.cfg.Len, len(c.group), int(p))
	x := make([]float32, hi-lo)
	for i := range x {
		x[i] = b.cfg.MaxAbs / 2
	}
	f, err := b.enc.Append(nil, x, 1)
	if err != nil {
		return nil
	}
	return f
}
