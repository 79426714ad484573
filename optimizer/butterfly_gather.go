package optimizer

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"slices"

	"github.com/skein-ml/skein/transport"
)

// Phase 4 of a butterfly round (butterfly.go): every member settles each
// part (agreement, fetch, audit); a left-out member fetches the result.

// ---- 4. Gather ------------------------------------------------------------

func (b *Butterfly) onResult(from transport.PeerID, h header, body []byte) {
	c := b.cur
	if h.group != c.gh || int(h.chunk) >= len(c.parts) {
		return
	}
	pt := &c.parts[h.chunk]
	ds, frame, err := parseDecls(body, len(c.group))
	if err != nil || len(frame) > b.maxFrame() {
		return
	}
	switch from {
	case pt.a:
		if pt.frameA == nil {
			pt.frameA, pt.declA = slices.Clone(frame), ds
		}
	case pt.b:
		if pt.frameB == nil {
			pt.frameB = slices.Clone(frame)
			if pt.declB == nil {
				pt.declB = ds
			}
		}
	}
}

func (b *Butterfly) onDigest(from transport.PeerID, h header, body []byte) {
	c := b.cur
	if h.group != c.gh || int(h.chunk) >= len(c.parts) {
		return
	}
	pt := &c.parts[h.chunk]
	if from != pt.b || pt.gotDigest || len(body) < digestLen {
		return
	}
	ds, rest, err := parseDecls(body[digestLen:], len(c.group))
	if err != nil || len(rest) != 0 {
		return
	}
	pt.digestB, pt.declB, pt.gotDigest, pt.digestAt = slices.Clone(body[:digestLen]), ds, true, b.now
}

func (b *Butterfly) onInputs(from transport.PeerID, h header, body []byte) {
	c := b.cur
	if h.group != c.gh || int(h.chunk) >= len(c.parts) {
		return
	}
	pt := &c.parts[h.chunk]
	if !pt.audit {
		return
	}
	in, err := parseAudit(body, len(c.group), b.maxFrame())
	if err != nil {
		return
	}
	for i := range in {
		in[i].frame = slices.Clone(in[i].frame)
	}
	switch {
	case from == pt.a && !pt.gotAudA:
		pt.auditA, pt.gotAudA = in, true
	case from == pt.b && !pt.gotAudB:
		pt.auditB, pt.gotAudB = in, true
	}
}

func (b *Butterfly) advanceGather(c *bfRound) {
	due := b.gatherEst.deadline(b.cfg.PhaseWait, b.cfg.MinPhase, b.cfg.MaxPhase)
	start := c.groupAt
	for _, o := range c.owned {
		if !o.done {
			return // finish our own parts first
		}
	}
	if c.gatherAt == 0 {
		c.gatherAt = max(b.now, 1)
	}
	start = c.gatherAt
	pending := 0
	for p := range c.parts {
		pt := &c.parts[p]
		if pt.accepted != nil {
			continue
		}
		b.settle(c, uint32(p), pt, start, due)
		if c.result != nil {
			return
		}
		if pt.accepted == nil {
			pending++
		}
	}
	if pending > 0 {
		return
	}
	if !b.someoneMute(c) {
		b.gatherEst.observeIf(b.now-start, !c.frozen)
	}
	b.finishWith(c, ErrRoundFailed)
}

// finishWith decodes every accepted part into the output and ends the
// round; a part that does not decode ends it with failure (both owners
// agreed on garbage).
func (b *Butterfly) finishWith(c *bfRound, failure error) {
	M := len(c.group)
	for p := range c.parts {
		lo, hi := chunkBounds(b.cfg.Len, M, p)
		if err := b.decodeChecked(c.parts[p].accepted, c.out[lo:hi]); err != nil {
			b.finish(c, fmt.Errorf("%w: the aggregate of part %d: %v", failure, p, err))
			return
		}
	}
	b.finish(c, nil)
}

// settle decides part p when it can: the owners agree; one owner is gone
// (fetch from the other); they disagree (audit).
func (b *Butterfly) settle(c *bfRound, p uint32, pt *bfPart, start, due int64) {
	h := header{round: c.round, group: c.gh, step: c.attempt, chunk: p}
	gone := b.gone
	// The owners may wait a whole scatter phase and the cross-check for a
	// contribution that never comes: a part is late only after that.
	scatterDue := c.groupAt + b.scatterEst.deadline(b.cfg.PhaseWait, b.cfg.MinPhase, b.cfg.MaxPhase) + b.cfg.MinPhase
	late := b.now >= max(start, scatterDue)+due
	// The second owner is done and the first has not answered within a
	// short wait: ask the second for the aggregate itself.
	aSilent := pt.frameA == nil && pt.gotDigest && b.now >= pt.digestAt+b.cfg.MinPhase
	switch {
	case pt.audit:
		b.settleAudit(c, p, pt, due)
	case pt.b == "" && pt.frameA != nil:
		pt.accepted = pt.frameA // one owner per part (Replicas 1): no cross-check by design
	case pt.frameA != nil && pt.gotDigest:
		d := sha256.Sum256(pt.frameA)
		if bytes.Equal(d[:], pt.digestB) {
			pt.accepted, pt.verified = pt.frameA, true
			return
		}
		b.startAudit(c, p, pt)
	case pt.frameA == nil && pt.frameB != nil && gone(pt.a):
		// Only once the first owner is gone (or, below, past every deadline
		// and asked again): a member that took the second owner's aggregate
		// while the first was merely slow could end with other bits than
		// those who audit. And never on the second owner's word alone: it is
		// checked against the inputs it declared (an audit of one owner), so
		// that a hostile owner whose co-owner is gone or stalled cannot hand
		// some members a forged aggregate while others, who heard the
		// co-owner, reject it.
		b.startAudit(c, p, pt)
	case pt.frameA != nil && pt.b != "" && gone(pt.b):
		b.startAudit(c, p, pt) // the second owner is gone: check the first's claim alone
	case pt.fetchAt == 0 && (late || aSilent || (pt.frameA == nil && gone(pt.a))):
		pt.fetchAt = b.now
		h.kind = kindFetch
		if pt.frameA == nil {
			for _, o := range []transport.PeerID{pt.a, pt.b} {
				if o != "" && o != b.self && !b.Banned(o) {
					b.send(o, h, nil)
				}
			}
		}
	case pt.fetchAt != 0 && b.now >= pt.fetchAt+due:
		if pt.frameA != nil || pt.frameB != nil {
			b.startAudit(c, p, pt) // one owner's aggregate, unconfirmed: check it
			return
		}
		b.finish(c, fmt.Errorf("%w: no aggregate of part %d from %s nor %s", ErrRoundFailed, p, short(pt.a), short(pt.b)))
	}
}

// startAudit asks part p's owners for the signed inputs they declared
// (this member's own answer, when it owns the part, directly);
// settleAudit then recomputes each owner's claim from them.
func (b *Butterfly) startAudit(c *bfRound, p uint32, pt *bfPart) {
	pt.audit, pt.auditAt = true, b.now
	h := header{kind: kindAudit, round: c.round, group: c.gh, step: c.attempt, chunk: p}
	for _, o := range []transport.PeerID{pt.a, pt.b} {
		switch {
		case o == "":
		case o == b.self:
			b.auditSelf(c, p, pt)
		default:
			b.send(o, h, nil)
		}
	}
}

// auditInputs are the signed inputs the owner declared, with their frames.
func (o *bfOwned) auditInputs() []auditInput {
	in := make([]auditInput, 0, len(o.decls))
	for _, d := range o.decls {
		x := o.inputs[d.idx]
		in = append(in, auditInput{signedInput: x.signedInput, frame: x.frame})
	}
	return in
}

// auditSelf answers this member's own audit of a part it owns.
func (b *Butterfly) auditSelf(c *bfRound, p uint32, pt *bfPart) {
	o := c.owned[p]
	if o == nil || !o.done {
		return
	}
	in := o.auditInputs()
	if pt.a == b.self {
		pt.auditA, pt.gotAudA = in, true
	} else {
		pt.auditB, pt.gotAudB = in, true
	}
}

// settleAudit recomputes each owner's aggregate from the signed inputs it
// declared and takes the one whose claim holds.
func (b *Butterfly) settleAudit(c *bfRound, p uint32, pt *bfPart, due int64) {
	// An owner has a claim when this member holds its aggregate (the first
	// owner's frame; the second's digest, or its frame for a digest). Wait
	// for the inputs of every owner with a claim: deciding on one answer
	// alone would let members that heard from different owners in time end
	// with different bits. Only an owner that is gone, or silent far past
	// the deadline, is decided without.
	claimA := pt.frameA != nil
	claimB := pt.b != "" && (pt.gotDigest || pt.frameB != nil)
	if (claimA && !pt.gotAudA && !b.gone(pt.a)) || (claimB && !pt.gotAudB && !b.gone(pt.b)) {
		if b.now < pt.auditAt+4*due {
			return
		}
	}
	var okA, okB bool
	var frameA, frameB []byte
	if claimA && pt.gotAudA {
		dA := sha256.Sum256(pt.frameA)
		okA, frameA = b.check(c, p, pt.declA, pt.auditA, dA[:])
	}
	if claimB && pt.gotAudB {
		dB := pt.digestB
		if !pt.gotDigest {
			d := sha256.Sum256(pt.frameB)
			dB = d[:]
		}
		okB, frameB = b.check(c, p, pt.declB, pt.auditB, dB)
	}
	switch {
	case okA && okB && covers(pt.declB, pt.declA):
		// Both consistent, the owners having aggregated different sets of
		// genuine inputs: one gave up waiting for the other's list. That
		// one (the early one) took every input it held, the other only
		// those both lists hold, so the early one's inputs include the
		// late one's. A member may have taken the early one's aggregate
		// alone, before the late one's came (when to stop waiting is each
		// member's own deadline), so every member takes the aggregate over
		// more inputs: here the second owner's. Before, members that heard
		// both took the first owner's, and those that had taken the second
		// owner's alone ended the round with other bits (once in 300 seeds
		// of TestButterflySuspensionDisagree; TestButterflyLateFirstOwner).
		pt.accepted = frameB
	case okA:
		// Both consistent otherwise (the first owner's inputs include the
		// second's, or neither's include the other's: each gave up on the
		// other's list): the first owner's, as every member decides.
		pt.accepted = frameA
		if claimB && !okB && pt.gotAudB {
			b.offend(pt.b, "its digest of part %d of round %d does not match its inputs", p, c.round)
		}
	case okB:
		pt.accepted = frameB
		if claimA && pt.gotAudA {
			b.offend(pt.a, "its aggregate of part %d of round %d does not match its inputs", p, c.round)
		}
	default:
		if claimA && pt.gotAudA {
			b.offend(pt.a, "its aggregate of part %d of round %d does not match its inputs", p, c.round)
		}
		if claimB && pt.gotAudB {
			b.offend(pt.b, "its aggregate of part %d of round %d does not match its inputs", p, c.round)
		}
		b.finish(c, fmt.Errorf("%w: no owner of part %d (%s, %s) has a consistent aggregate", ErrRoundFailed, p, short(pt.a), short(pt.b)))
		return
	}
	pt.verified = true
}

// covers reports whether the declared inputs big are more than small and
// include all of them.
func covers(big, small []decl) bool {
	if len(big) <= len(small) {
		return false
	}
	for _, d := range small {
		if !slices.Contains(big, d) {
			return false
		}
	}
	return true
}

// check recomputes an owner's aggregate of part p from the audit inputs and
// reports whether it matches its claimed digest and declared inputs.
func (b *Butterfly) check(c *bfRound, p uint32, declared []decl, in []auditInput, digest []byte) (bool, []byte) {
	if len(in) != len(declared) {
		return false, nil
	}
	lo, hi := chunkBounds(b.cfg.Len, len(c.group), int(p))
	vals := map[uint32][]float32{}
	idxs := make([]uint32, len(in))
	for i, s := range in {
		if s.decl != declared[i] || sha256.Sum256(s.frame) != s.hash {
			return false, nil
		}
		prod := c.group[s.idx]
		if !b.cfg.Signer.Verify(prod, partSigMsg(c.round, c.attempt, c.gh, p, s.hash), s.sig[:]) {
			return false, nil
		}
		v := make([]float32, hi-lo)
		if err := b.decodeChecked(s.frame, v); err != nil {
			return false, nil
		}
		vals[s.idx], idxs[i] = v, s.idx
	}
	frame, err := b.aggregateFrame(c, p, idxs, func(i uint32) []float32 { return vals[i] })
	if err != nil {
		return false, nil
	}
	d := sha256.Sum256(frame)
	return bytes.Equal(d[:], digest), frame
}

// ---- Left out, and answers ------------------------------------------------

func (b *Butterfly) advanceLeftOut(c *bfRound) {
	due := b.gatherEst.deadline(b.cfg.PhaseWait, b.cfg.MinPhase, b.cfg.MaxPhase)
	if !c.fetched {
		c.fetched = true
		for p := range c.parts {
			h := header{kind: kindFetch, round: c.round, group: c.gh, step: c.attempt, chunk: uint32(p)}
			c.parts[p].fetchAt = max(b.now, 1)
			b.send(c.parts[p].a, h, nil)
			if c.parts[p].b != "" {
				b.send(c.parts[p].b, h, nil)
			}
		}
	}
	// The second owner's whole result stands for its digest; from there a
	// left-out member settles each part as the group's members do (and
	// audits when the owners disagree).
	pending := 0
	for p := range c.parts {
		pt := &c.parts[p]
		if pt.accepted != nil {
			continue
		}
		if pt.frameB != nil && !pt.gotDigest {
			d := sha256.Sum256(pt.frameB)
			pt.digestB, pt.gotDigest, pt.digestAt = d[:], true, b.now
		}
		// Patient: a left-out member hears the owners later than the group
		// does, and taking one owner's word early risks other bits.
		b.settle(c, uint32(p), pt, c.groupAt, 3*due)
		if c.result != nil {
			return
		}
		if pt.accepted == nil {
			pending++
		}
	}
	if pending > 0 {
		return
	}
	b.finishWith(c, ErrExcluded)
}

// answer serves a fetch (the aggregate) or an audit (the signed inputs) of a
// part this member owns, in the current or a recently finished round.
func (b *Butterfly) answer(from transport.PeerID, h header) {
	var owned map[uint32]*bfOwned
	var gh uint64
	switch c := b.cur; {
	case c != nil && c.round == h.round && c.gh == h.group:
		owned, gh = c.owned, c.gh
	case b.finished[h.round] != nil && b.finished[h.round].gh == h.group:
		owned, gh = b.finished[h.round].owned, h.group
	default:
		return
	}
	o := owned[h.chunk]
	if o == nil {
		return
	}
	if !o.done {
		if h.kind == kindFetch && !slices.Contains(o.fetchers, from) && len(o.fetchers) < maxGroup {
			o.fetchers = append(o.fetchers, from)
		}
		return
	}
	r := header{round: h.round, group: gh, step: h.step, chunk: h.chunk}
	switch h.kind {
	case kindFetch:
		r.kind = kindResult
		b.send(from, r, append(appendDecls(nil, o.decls), o.frame...))
	case kindAudit:
		r.kind = kindInputs
		b.send(from, r, appendAudit(nil, o.auditInputs()))
	}
}
