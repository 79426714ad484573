package topk

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// Largest returns exactly the k largest keys, for every k, on random,
// sorted and reversed inputs.
func TestLargest(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 3, 10, 100, 1000} {
		base := make([]uint64, n)
		for i := range base {
			base[i] = r.Uint64()>>8<<8 | uint64(i) // distinct
		}
		for _, order := range []string{"random", "sorted", "reversed"} {
			in := slices.Clone(base)
			switch order {
			case "sorted":
				slices.Sort(in)
			case "reversed":
				slices.Sort(in)
				slices.Reverse(in)
			}
			want := slices.Clone(in)
			slices.Sort(want)
			slices.Reverse(want)
			for _, k := range []int{1, 2, n / 2, n - 1, n} {
				if k < 1 || k > n {
					continue
				}
				got := slices.Clone(Largest(slices.Clone(in), k))
				slices.Sort(got)
				slices.Reverse(got)
				if !slices.Equal(got, want[:k]) {
					t.Fatalf("n %d %s k %d: %v, want %v", n, order, k, got, want[:k])
				}
			}
		}
	}
}
