package replica

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/skein-ml/skein/transport"
)

// Book is one member's record of the run's certificates: the votes of the
// rounds it took part in (AddVote), the certificates they form, and the
// chain it trusts, from an anchor (the run's start state, or the last
// certificate saved in its data directory) to its latest certified state.
// It serves that chain to the others (Chain) and takes theirs only when it
// extends its own (Adopt). Safe for concurrent use.
type Book struct {
	run    string
	signer transport.Signer
	// Anchorless, if set, must also accept a certificate adopted from an
	// anchor without a group (a newcomer's start state, or a restart
	// without a saved certificate), whose chain no earlier group vouches
	// for: node asks that a majority of the members it sees live signed it.
	Anchorless func(*Certificate) error

	mu      sync.Mutex
	trusted []*Certificate // the chain, oldest first; [0] is the anchor
	pending map[pendingKey]*Certificate
	voted   map[voter]bool      // who has voted in which pending round
	mine    map[uint64][32]byte // round -> digest of the group this member voted in
}

type voter struct {
	id    transport.PeerID
	round uint64
}

type pendingKey struct {
	round, hash uint64
	group       [32]byte
}

// Bounds: certificates kept in the chain, rounds ahead of the trusted one
// whose votes are collected, and partial certificates. A member votes once
// a round (its first vote counts), so the callers, which take votes only
// from live members, bound the partial certificates by members x maxAhead.
const (
	maxChain   = 64
	maxAhead   = 4
	maxPending = 4096
)

// NewBook returns a book of run whose trusted chain starts at anchor.
func NewBook(run string, signer transport.Signer, anchor *Certificate) *Book {
	return &Book{run: run, signer: signer, trusted: []*Certificate{anchor},
		pending: map[pendingKey]*Certificate{}, voted: map[voter]bool{}, mine: map[uint64][32]byte{}}
}

// Trusted is the latest certificate this member trusts.
func (b *Book) Trusted() *Certificate {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.trusted[len(b.trusted)-1]
}

// At is the trusted certificate of round r, if the book holds one.
func (b *Book) At(r uint64) (*Certificate, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.trusted {
		if c.Round == r {
			return c, true
		}
	}
	return nil, false
}

// Chain returns the trusted certificates after round from, oldest first
// (what a member behind needs to reach this one's state), at most max.
func (b *Book) Chain(from uint64, max int) []*Certificate {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*Certificate
	for _, c := range b.trusted[1:] {
		if c.Round > from && len(out) < max {
			out = append(out, c)
		}
	}
	return out
}

// Vote signs this member's vote for the state hash at round within group
// and records it; the vote (a certificate carrying this member's signature
// alone) is what to send the group's other members.
func (b *Book) Vote(round, hash uint64, group []transport.PeerID, self transport.PeerID, sign func([]byte) ([]byte, error)) (*Certificate, error) {
	group = sortedGroup(group)
	i, ok := slices.BinarySearch(group, self)
	if !ok {
		return nil, fmt.Errorf("%w: %s is not in round %d's group", ErrBadCert, self, round)
	}
	sig, err := sign(VoteBytes(b.run, round, hash, group))
	if err != nil {
		return nil, err
	}
	v := &Certificate{Run: b.run, Round: round, Hash: hash, Group: group, Sigs: make([][]byte, len(group))}
	v.Sigs[i] = sig
	b.mu.Lock()
	b.mine[round] = GroupDigest(group)
	b.mu.Unlock()
	if _, err := b.AddVote(v, self); err != nil {
		return nil, err
	}
	// The others' votes that came first may form the certificate now.
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, c := range b.pending {
		if k.round == round && k.group == b.mine[round] {
			b.formLocked(c)
		}
	}
	return v, nil
}

// AddVote records a vote received from a member: a certificate carrying
// from's signature alone. When the votes for the same (round, state, group)
// reach a strict majority of the group, and this member voted in that
// round with that group (so that votes for a group made up elsewhere never
// form a certificate here), the certificate is formed, and trusted if it
// extends the chain; it is returned then. Votes for rounds
// at or before the trusted one, or too far ahead, and a member's second
// vote in a round, are ignored.
func (b *Book) AddVote(v *Certificate, from transport.PeerID) (*Certificate, error) {
	if err := v.wellFormed(); err != nil {
		return nil, err
	}
	i, ok := slices.BinarySearch(v.Group, from)
	if !ok || v.Sigs[i] == nil || len(v.Signers()) != 1 {
		return nil, fmt.Errorf("%w: a vote must carry its sender's signature alone", ErrBadCert)
	}
	if v.Run != b.run {
		return nil, fmt.Errorf("%w: %q", ErrWrongRun, v.Run)
	}
	if !b.signer.Verify(from, VoteBytes(v.Run, v.Round, v.Hash, v.Group), v.Sigs[i]) {
		return nil, fmt.Errorf("%w: %s's vote for round %d", ErrBadSignature, from, v.Round)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	last := b.trusted[len(b.trusted)-1]
	if v.Round <= last.Round || v.Round > last.Round+maxAhead || b.voted[voter{from, v.Round}] {
		return nil, nil
	}
	k := pendingKey{v.Round, v.Hash, GroupDigest(v.Group)}
	c, ok := b.pending[k]
	if !ok {
		if len(b.pending) >= maxPending {
			return nil, nil
		}
		c = &Certificate{Run: v.Run, Round: v.Round, Hash: v.Hash, Group: v.Group, Sigs: make([][]byte, len(v.Group))}
		b.pending[k] = c
	}
	c.Sigs[i] = v.Sigs[i]
	b.voted[voter{from, v.Round}] = true
	if d, ok := b.mine[v.Round]; !ok || d != k.group {
		return nil, nil
	}
	return b.formLocked(c), nil
}

// Swing returns, for round, a state this member's vote would certify:
// signed by at least two other members of the group it voted in, who are at
// least half of that group, so that this member's vote makes a strict
// majority. A member that ended a round apart from the others (a straggler,
// a member excluded behind its back) takes that state when its round has no
// certificate because its own vote and a hostile one split the group.
// The state must also have more signers than this member's own, or as
// many and the smaller hash: of a group split in two halves, one swings.
// Breakdown: hostile members pull a swing only when they are half of the
// group or more (two sybils in a group of five are not: a state two members
// vote for is not a tie there); no lone member ever does.
func (b *Book) Swing(round, mine uint64) (*Certificate, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, ok := b.mine[round]
	if !ok {
		return nil, false
	}
	own := 0
	if c, ok := b.pending[pendingKey{round, mine, d}]; ok {
		own = len(c.Signers())
	}
	var best *Certificate
	bestN := 0
	for k, c := range b.pending {
		n := len(c.Signers())
		if k.round != round || k.group != d || k.hash == mine || n < 2 || 2*n < len(c.Group) {
			continue
		}
		// More signers than this member's state has, or as many with the
		// smaller hash: of two halves of a split group, exactly one swings
		// (both swinging would swap the halves' states round after round).
		if n < own || (n == own && k.hash > mine) {
			continue
		}
		if best == nil || n > bestN || (n == bestN && k.hash < best.Hash) {
			best, bestN = c, n
		}
	}
	return best, best != nil
}

// formLocked trusts c when a strict majority of its group signed it; it
// returns c then, else nil.
//
// It need not extend the chain: this member voted in that group, so the
// certificate names the state it computed with a majority of its round.
// (A group that lost a straggler and holds a dissenting hostile member can
// have fewer than half of the previous group among its signers; requiring
// it here left every member's chain stuck there, and catching up with it.)
func (b *Book) formLocked(c *Certificate) *Certificate {
	last := b.trusted[len(b.trusted)-1]
	if c.Round <= last.Round || 2*len(c.Signers()) <= len(c.Group) {
		return nil
	}
	b.trustLocked(c)
	return c
}

// Adopt checks chain (another member's, oldest first) against the trusted
// one and, when it verifies and extends it, trusts it and returns its last
// certificate. Certificates at or before the trusted round are skipped.
// From an anchor without a group only the chain's last certificate counts:
// it must verify and pass Anchorless.
func (b *Book) Adopt(chain []*Certificate) (*Certificate, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.adoptLocked(chain)
}

// AdoptFrom is Adopt through anchor, a certificate vouched for outside
// the chain (the bootstrap's, Anchor.Verify), where the trusted chain
// cannot decide: for a book whose trusted certificate has no group (a
// newcomer), and for one whose chain does not extend to chain
// (ErrBrokenChain: churn and dissent) when anchor is past the trusted
// round. Then chain (oldest first; certificates at or before anchor's round
// are skipped) must verify and extend anchor, instead of its last
// certificate passing Anchorless or the re-anchoring rule (Rejoin); anchor
// and chain are trusted then, the broken chain dropped. With a nil anchor,
// or a chain that extends the trusted one, it is Adopt.
func (b *Book) AdoptFrom(anchor *Certificate, chain []*Certificate) (*Certificate, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	last := b.trusted[len(b.trusted)-1]
	if anchor == nil {
		return b.adoptLocked(chain)
	}
	if len(last.Group) != 0 {
		c, err := b.adoptLocked(chain)
		if !errors.Is(err, ErrBrokenChain) || anchor.Round <= last.Round {
			return c, err
		}
	}
	if err := anchor.Verify(b.run, b.signer); err != nil {
		return nil, err
	}
	chain = after(chain, anchor.Round)
	if _, err := VerifyChain(b.run, b.signer, anchor, chain); err != nil {
		return nil, err
	}
	if len(last.Group) != 0 {
		b.resetLocked(anchor)
	}
	for _, c := range append([]*Certificate{anchor}, chain...) {
		if c.Round > b.trusted[len(b.trusted)-1].Round {
			b.trustLocked(c)
		}
	}
	return b.trusted[len(b.trusted)-1], nil
}

func (b *Book) adoptLocked(chain []*Certificate) (*Certificate, error) {
	last := b.trusted[len(b.trusted)-1]
	chain = after(chain, last.Round)
	if len(chain) == 0 {
		return last, nil
	}
	if len(last.Group) == 0 {
		c := chain[len(chain)-1]
		// Who signed (a count) before the signatures themselves.
		if b.Anchorless != nil {
			if err := b.Anchorless(c); err != nil {
				return nil, err
			}
		}
		if err := c.Verify(b.run, b.signer); err != nil {
			return nil, err
		}
		chain = chain[len(chain)-1:]
	} else if _, err := VerifyChain(b.run, b.signer, last, chain); err != nil {
		return nil, err
	}
	for _, c := range chain {
		b.trustLocked(c)
	}
	return b.trusted[len(b.trusted)-1], nil
}

// Reanchor trusts c, which must verify, as the start of a new chain: for
// a member whose chain no longer extends (the previous group lost its
// majority to churn and dissent) when another rule vouches for c (Rejoin).
func (b *Book) Reanchor(c *Certificate) error {
	if err := c.Verify(b.run, b.signer); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if last := b.trusted[len(b.trusted)-1]; c.Round <= last.Round {
		return fmt.Errorf("%w: round %d after round %d", ErrBrokenChain, c.Round, last.Round)
	}
	b.resetLocked(c)
	return nil
}

// Reset restarts the trusted chain at anchor (a member whose state was
// taken from elsewhere by a rule outside the chain).
func (b *Book) Reset(anchor *Certificate) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.resetLocked(anchor)
}

func (b *Book) resetLocked(anchor *Certificate) {
	b.trusted = []*Certificate{anchor}
	clear(b.pending)
	clear(b.voted)
	clear(b.mine)
}

func (b *Book) trustLocked(c *Certificate) {
	b.trusted = append(b.trusted, c)
	if len(b.trusted) > maxChain {
		b.trusted = slices.Delete(b.trusted, 1, len(b.trusted)-maxChain+1)
	}
	for k := range b.pending {
		if k.round <= c.Round {
			delete(b.pending, k)
		}
	}
	for k := range b.voted {
		if k.round <= c.Round {
			delete(b.voted, k)
		}
	}
	for r := range b.mine {
		if r <= c.Round {
			delete(b.mine, r)
		}
	}
}

// after skips the certificates of chain at or before round.
func after(chain []*Certificate, round uint64) []*Certificate {
	i := 0
	for i < len(chain) && chain[i].Round <= round {
		i++
	}
	return chain[i:]
}

func sortedGroup(g []transport.PeerID) []transport.PeerID {
	g = slices.Clone(g)
	slices.Sort(g)
	return slices.Compact(g)
}
