package data

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// Under churn (members joining, leaving, left out of rounds), the blocks
// trained in an epoch are each trained once and none is lost: every block
// of the epoch is eventually trained, exactly the slots of certified-group
// members count, and two members of one group never share a block unless
// both are outside the ledger's group.
func TestLedgerChurnTrainsEveryBlockOnce(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		b := Blocks{T: 7, PerBlock: 4, N: 97, Seed: seed}
		var l Ledger
		trained := map[uint64]int{} // block -> times counted, epoch 0
		pool := []string{}
		for i := range 12 {
			pool = append(pool, fmt.Sprintf("peer%02d", i))
		}
		live := slices.Clone(pool[:5])
		pending := func() bool {
			return l.Epoch == 0 || slices.ContainsFunc(l.Returned, func(s Slot) bool { return s.Epoch == 0 })
		}
		for round := uint64(1); pending(); round++ {
			if round > 1000 {
				t.Fatal("epoch never ends")
			}
			// Churn: someone joins or leaves now and then.
			if id := pool[rng.IntN(len(pool))]; rng.IntN(4) == 0 && !slices.Contains(live, id) {
				live = append(live, id)
			}
			if rng.IntN(5) == 0 && len(live) > 1 {
				i := rng.IntN(len(live))
				live = slices.Delete(live, i, i+1)
			}
			// Each live member trains its slot; some are left out of the
			// certified group.
			slots := map[string]Slot{}
			for _, id := range live {
				slots[id] = l.SlotOf(id, b)
			}
			var group []string
			for _, id := range live {
				if rng.IntN(6) != 0 {
					group = append(group, id)
				}
			}
			inLedger := map[string]bool{}
			for _, id := range l.Group {
				inLedger[id] = true
			}
			// Members of the ledger's group never share a slot.
			seen := map[Slot]string{}
			for _, id := range group {
				s := slots[id]
				if o, ok := seen[s]; ok && (inLedger[id] || inLedger[o]) {
					t.Fatalf("seed %d round %d: %s and %s share slot %v", seed, round, id, o, s)
				}
				seen[s] = id
			}
			for s := range seen {
				if s.Epoch == 0 {
					trained[b.Block(s)]++
				}
			}
			l = l.Advance(round, group, b)
			if err := l.Check(b); err != nil {
				t.Fatal(err)
			}
		}
		for blk := range b.N {
			if trained[blk] != 1 {
				t.Fatalf("seed %d: block %d trained %d times in epoch 0", seed, blk, trained[blk])
			}
		}
	}
}

func TestLedgerEncoding(t *testing.T) {
	l := Ledger{Round: 9, Group: []string{"a", "bb"}, Epoch: 2, Next: 5, Trained: 3, Returned: []Slot{{1, 4}, {2, 0}}}
	b, err := l.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got Ledger
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if got.Digest() != l.Digest() || got.Round != 9 || !slices.Equal(got.Group, l.Group) || !slices.Equal(got.Returned, l.Returned) {
		t.Fatalf("%+v", got)
	}
	unsorted := Ledger{Group: []string{"b", "a"}}
	b, _ = unsorted.MarshalBinary()
	if err := got.UnmarshalBinary(b); !errors.Is(err, ErrDataFormat) {
		t.Fatalf("unsorted group: %v", err)
	}
}

// The ledger's decoder is bounded and never panics; what decodes
// re-encodes to the same bytes.
func FuzzLedger(f *testing.F) {
	l := Ledger{Round: 9, Group: []string{"a", "bb"}, Epoch: 2, Next: 5, Returned: []Slot{{1, 4}}}
	b, _ := l.MarshalBinary()
	f.Add(b)
	f.Add([]byte(ledgerMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		var l Ledger
		if err := l.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrDataFormat) {
				t.Fatal(err)
			}
			return
		}
		got, err := l.MarshalBinary()
		if err != nil || string(got) != string(b) {
			t.Fatalf("re-encoding differs (%v)", err)
		}
	})
}

// A loader on a block draws exactly that block's windows, each once per
// PerBlock draws.
func TestLoaderUseBlock(t *testing.T) {
	tokens := make([]int32, 10*3*8)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	src := sliceSource(tokens)
	l, err := NewTokenLoader(src, Train, LoaderConfig{Seed: 1, Workers: 1, B: 2, T: 7})
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewBlocks(int64(len(tokens)), 7, 6, 1)
	if err != nil || b.N != 5 {
		t.Fatalf("%+v %v", b, err)
	}
	s := Slot{0, 3}
	l.UseBlock(b, s, 10)
	off, n := b.Range(s)
	seen := map[int32]bool{}
	in, tg := make([]int32, 14), make([]int32, 14)
	for step := 10; step < 13; step++ {
		if err := l.Batch(step, in, tg); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 14; i += 7 {
			if int64(in[i]) < off || int64(in[i]) >= off+n || in[i]%8 != 0 || tg[i] != in[i]+1 {
				t.Fatalf("window at %d outside block [%d, %d)", in[i], off, off+n)
			}
			seen[in[i]] = true
		}
	}
	if len(seen) != 6 {
		t.Fatalf("%d distinct windows of 6", len(seen))
	}
}

type sliceSource []int32

func (s sliceSource) Tokens(sp Split) int64 { return int64(len(s)) }
func (s sliceSource) ReadTokens(sp Split, dst []int32, off int64) error {
	copy(dst, s[off:])
	return nil
}
