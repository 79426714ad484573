package data

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"slices"
)

// Blocks and the Ledger: which member trains which data in a run whose
// members fetch only their own (a packed dataset).
//
// Blocks cuts the train split into N blocks of PerBlock consecutive windows
// of T+1 tokens (PerBlock is a round's inner steps times the batch, so a
// block is one member's round); the tail that does not fill a block is not
// trained. Each epoch visits the blocks in the order of a permutation keyed
// by (seed, epoch); a slot (epoch, position) names the block at that
// position, and inside a block the windows are drawn in an order keyed by
// (seed, epoch, block). A member fetches only the chunks of its block.
//
// The Ledger is the run's account of the epoch: the next position to hand
// out, the slots handed out but not trained (returned, handed out first),
// and the certified group of the round that produced it. It is part of the
// run's certified state, so every member holds the same one and a newcomer
// takes it with the state. Round r+1's slots go to the ledger's group (round
// r's), member i of it (sorted) taking the i-th slot of the hand-out order;
// a member outside it (a newcomer, or one left out of round r; at a run's
// start, everyone) takes one of the next max(MinSpares, 2G) spare slots,
// picked by a hash of its ID and the round (two such members may pick the
// same slot: they then train the same block, counted once, with probability
// at most 1/MinSpares for a pair). After round r+1, Advance consumes the hand-out order up to the last
// slot a member of round r+1's certified group held: those slots are
// trained ("trained" is being inside a certified round's aggregate), the
// others in that stretch go back to the pool. So within an epoch no block is
// lost or counted twice, whatever members leave, join or are left out.

// Slot names the block at position Pos of epoch Epoch's order.
type Slot struct{ Epoch, Pos uint64 }

// Blocks is a train split cut into blocks (see above).
type Blocks struct {
	T        int    // sequence length: a window is T+1 tokens
	PerBlock int    // windows per block
	N        uint64 // blocks per epoch
	Seed     uint64
}

// NewBlocks cuts a split of tokens tokens. It fails with ErrCorpusTooSmall
// when not even one block fits.
func NewBlocks(tokens int64, T, perBlock int, seed uint64) (Blocks, error) {
	if T < 1 || perBlock < 1 || int64(perBlock)*int64(T+1) > maxBatchTokens*64 {
		return Blocks{}, fmt.Errorf("data: blocks of %d windows of %d tokens: %w", perBlock, T+1, ErrInvalidConfig)
	}
	per := int64(perBlock) * int64(T+1)
	if tokens < per {
		return Blocks{}, fmt.Errorf("data: the train split's %d tokens do not fill one block of %d windows of %d tokens (%d): %w",
			tokens, perBlock, T+1, per, ErrCorpusTooSmall)
	}
	return Blocks{T: T, PerBlock: perBlock, N: uint64(tokens / per), Seed: seed}, nil
}

// BlockTokens is the tokens of one block.
func (b Blocks) BlockTokens() int64 { return int64(b.PerBlock) * int64(b.T+1) }

// Block returns the block slot s names.
func (b Blocks) Block(s Slot) uint64 { return NewPermutation(b.N, b.Seed, s.Epoch).At(s.Pos % b.N) }

// Range returns the split's tokens [off, off+n) that slot s's block covers.
func (b Blocks) Range(s Slot) (off, n int64) {
	return int64(b.Block(s)) * b.BlockTokens(), b.BlockTokens()
}

// WindowOffset returns the first token of window j (taken modulo PerBlock)
// of slot s's block, in the block's order for s's epoch.
func (b Blocks) WindowOffset(s Slot, j int) int64 {
	blk := b.Block(s)
	w := NewPermutation(uint64(b.PerBlock), b.Seed^(blk+1)*0x9e3779b97f4a7c15, s.Epoch).At(uint64(j % b.PerBlock))
	return int64(blk*uint64(b.PerBlock)+w) * int64(b.T+1)
}

// Limits of a Ledger's encoding.
const (
	// MinSpares is the fewest spare slots members outside the ledger's
	// group pick among (twice the group when that is more): two newcomers
	// of a round share a block with probability 1/MinSpares or less.
	MinSpares = 64
	// MaxLedgerGroup bounds the group a ledger records.
	MaxLedgerGroup = 4096
	// MaxReturned bounds the slots waiting to be handed out again; past it
	// the oldest are dropped and counted in Lost.
	MaxReturned = 1 << 16
	ledgerMagic = "SKLEDG1\x00"
)

// Ledger is the run's account of its data (see above). The zero Ledger is
// the start of a run: epoch 0, nothing handed out, no group.
type Ledger struct {
	Round    uint64   // the round that produced this ledger
	Group    []string // that round's certified group, sorted
	Epoch    uint64   // the epoch being handed out
	Next     uint64   // the positions of Epoch handed out
	Trained  uint64   // slots of Epoch trained
	Lost     uint64   // slots dropped past MaxReturned (never, in practice)
	Returned []Slot   // handed out, not trained: handed out first
}

// Index is the position in the hand-out order of the slot member id trains
// in round l.Round+1.
func (l *Ledger) Index(id string) int {
	if i, ok := slices.BinarySearch(l.Group, id); ok {
		return i
	}
	spare := max(MinSpares, 2*len(l.Group))
	h := fnv.New64a()
	h.Write([]byte(id))
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], l.Round+1)
	h.Write(b[:])
	return len(l.Group) + int(h.Sum64()%uint64(spare))
}

// handout returns the first n slots of the hand-out order, and the epoch
// and next position after them.
func (l *Ledger) handout(n int, blocks uint64) (slots []Slot, epoch, next uint64) {
	slots = make([]Slot, 0, n)
	slots = append(slots, l.Returned[:min(n, len(l.Returned))]...)
	epoch, next = l.Epoch, l.Next
	for len(slots) < n {
		if next >= blocks {
			epoch, next = epoch+1, 0
		}
		slots = append(slots, Slot{epoch, next})
		next++
	}
	return slots, epoch, next
}

// SlotOf is the slot member id trains in round l.Round+1.
func (l *Ledger) SlotOf(id string, blocks Blocks) Slot {
	i := l.Index(id)
	s, _, _ := l.handout(i+1, blocks.N)
	return s[i]
}

// Advance returns the ledger after round: group is its certified group
// (the members whose contributions are in its aggregate).
func (l *Ledger) Advance(round uint64, group []string, blocks Blocks) Ledger {
	g := slices.Clone(group)
	slices.Sort(g)
	g = slices.Compact(g)
	used := map[int]bool{}
	k := 0
	for _, id := range g {
		i := l.Index(id)
		used[i] = true
		k = max(k, i+1)
	}
	slots, epoch, next := l.handout(k, blocks.N)
	out := Ledger{Round: round, Group: g, Epoch: epoch, Next: next, Trained: l.Trained, Lost: l.Lost}
	if epoch != l.Epoch {
		out.Trained = 0
	}
	// Older returned slots first, then this round's untrained ones.
	out.Returned = append(out.Returned, l.Returned[min(k, len(l.Returned)):]...)
	for i, s := range slots {
		if !used[i] {
			out.Returned = append(out.Returned, s)
		} else if s.Epoch == out.Epoch {
			out.Trained++
		}
	}
	if over := len(out.Returned) - MaxReturned; over > 0 {
		out.Returned = out.Returned[over:]
		out.Lost += uint64(over)
	}
	return out
}

// Progress is the share of the current epoch's blocks trained.
func (l *Ledger) Progress(blocks Blocks) float64 {
	if blocks.N == 0 {
		return 0
	}
	return float64(l.Trained) / float64(blocks.N)
}

// MarshalBinary encodes the ledger, little-endian:
//
//	magic "SKLEDG1\0", round, epoch, next, trained, lost (uint64 each),
//	G (uint16), G times (length uint8, ID bytes), R (uint32),
//	R times (epoch, position) (uint64 each)
func (l *Ledger) MarshalBinary() ([]byte, error) {
	if len(l.Group) > MaxLedgerGroup || len(l.Returned) > MaxReturned {
		return nil, fmt.Errorf("data: ledger of %d members and %d returned slots exceeds its bounds: %w", len(l.Group), len(l.Returned), ErrInvalidConfig)
	}
	b := append([]byte(nil), ledgerMagic...)
	for _, v := range []uint64{l.Round, l.Epoch, l.Next, l.Trained, l.Lost} {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(l.Group)))
	for _, id := range l.Group {
		if len(id) == 0 || len(id) > 255 {
			return nil, fmt.Errorf("data: ledger member ID of %d bytes: %w", len(id), ErrInvalidConfig)
		}
		b = append(b, byte(len(id)))
		b = append(b, id...)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(l.Returned)))
	for _, s := range l.Returned {
		b = binary.LittleEndian.AppendUint64(b, s.Epoch)
		b = binary.LittleEndian.AppendUint64(b, s.Pos)
	}
	return b, nil
}

// UnmarshalBinary decodes a ledger, checking every count against the
// bytes left before it allocates; the group must be sorted without
// duplicates.
func (l *Ledger) UnmarshalBinary(b []byte) error {
	bad := func(what string) error { return fmt.Errorf("data: ledger: %s: %w", what, ErrDataFormat) }
	if len(b) < len(ledgerMagic)+5*8+2 || string(b[:8]) != ledgerMagic {
		return bad("bad magic or too short")
	}
	var out Ledger
	p := b[8:]
	u := make([]uint64, 5)
	for i := range u {
		u[i], p = binary.LittleEndian.Uint64(p), p[8:]
	}
	out.Round, out.Epoch, out.Next, out.Trained, out.Lost = u[0], u[1], u[2], u[3], u[4]
	g := int(binary.LittleEndian.Uint16(p))
	p = p[2:]
	if g > MaxLedgerGroup || g > len(p) {
		return bad("group count out of range")
	}
	for range g {
		if len(p) < 1 || int(p[0]) == 0 || len(p) < 1+int(p[0]) {
			return bad("truncated member ID")
		}
		id := string(p[1 : 1+int(p[0])])
		if n := len(out.Group); n > 0 && out.Group[n-1] >= id {
			return bad("group not sorted")
		}
		out.Group = append(out.Group, id)
		p = p[1+int(p[0]):]
	}
	if len(p) < 4 {
		return bad("truncated")
	}
	r := int64(binary.LittleEndian.Uint32(p))
	p = p[4:]
	if r > MaxReturned || int64(len(p)) != 16*r {
		return bad(fmt.Sprintf("%d returned slots in %d bytes", r, len(p)))
	}
	out.Returned = make([]Slot, r)
	for i := range out.Returned {
		out.Returned[i] = Slot{binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:])}
		p = p[16:]
	}
	*l = out
	return nil
}

// Check reports whether the ledger fits blocks: positions within an epoch.
func (l *Ledger) Check(blocks Blocks) error {
	if l.Next > blocks.N || l.Trained > blocks.N {
		return fmt.Errorf("data: ledger at position %d (trained %d) of an epoch of %d blocks: %w", l.Next, l.Trained, blocks.N, ErrDataFormat)
	}
	for _, s := range l.Returned {
		if s.Pos >= blocks.N || s.Epoch > l.Epoch {
			return fmt.Errorf("data: ledger returns slot (%d, %d) outside epochs <= %d of %d blocks: %w", s.Epoch, s.Pos, l.Epoch, blocks.N, ErrDataFormat)
		}
	}
	return nil
}

// Digest is the SHA-256 of the ledger's encoding.
func (l *Ledger) Digest() [32]byte {
	b, err := l.MarshalBinary()
	if err != nil {
		return [32]byte{}
	}
	return sha256.Sum256(b)
}
