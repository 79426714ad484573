package data

import "testing"

func TestPermutationIsBijection(t *testing.T) {
	sizes := []uint64{1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 63, 64, 65, 100, 1000, 4097}
	seeds := []uint64{0, 1, 42, 0xdeadbeef, ^uint64(0)}
	for _, n := range sizes {
		for _, seed := range seeds {
			for epoch := uint64(0); epoch < 3; epoch++ {
				p := NewPermutation(n, seed, epoch)
				seen := make([]bool, n)
				for i := uint64(0); i < n; i++ {
					v := p.At(i)
					if v >= n {
						t.Fatalf("n=%d seed=%d epoch=%d: At(%d) = %d out of range", n, seed, epoch, i, v)
					}
					if seen[v] {
						t.Fatalf("n=%d seed=%d epoch=%d: value %d hit twice", n, seed, epoch, v)
					}
					seen[v] = true
				}
			}
		}
	}
}

func TestPermutationDiffersBySeedAndEpoch(t *testing.T) {
	const n = 1000
	base := NewPermutation(n, 7, 0)
	tests := []struct {
		name string
		p    Permutation
	}{
		{"next epoch", NewPermutation(n, 7, 1)},
		{"far epoch", NewPermutation(n, 7, 1<<40)},
		{"other seed", NewPermutation(n, 8, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			same := 0
			for i := uint64(0); i < n; i++ {
				if tt.p.At(i) == base.At(i) {
					same++
				}
			}
			// A random permutation has about one fixed point relative to another.
			if same > 20 {
				t.Fatalf("%d of %d positions equal to the base permutation", same, n)
			}
		})
	}
	// Not the identity either.
	fixed := 0
	for i := uint64(0); i < n; i++ {
		if base.At(i) == i {
			fixed++
		}
	}
	if fixed > 20 {
		t.Fatalf("%d of %d fixed points: permutation looks like the identity", fixed, n)
	}
	if again := NewPermutation(n, 7, 0); again != base {
		t.Fatal("NewPermutation is not deterministic")
	}
}

func TestPermutationAtPanicsOutOfRange(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("At(n) did not panic")
		}
	}()
	NewPermutation(10, 1, 0).At(10)
}
