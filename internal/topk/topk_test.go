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

// Top keeps exactly the k largest keys of a stream, for every k (more than
// the stream too), on random, sorted and reversed streams, and Reset
// starts over.
func TestTop(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var top Top
	for _, n := range []int{1, 2, 3, 10, 100, 1000} {
		base := make([]uint64, n)
		for i := range base {
			base[i] = r.Uint64()>>8<<8 | uint64(i) | 1<<63 // distinct, non-zero
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
			for _, k := range []int{1, 2, n / 2, n - 1, n, n + 3} {
				if k < 1 {
					continue
				}
				top.Reset(k)
				for _, key := range in {
					if key > top.Floor() {
						top.Push(key)
					}
				}
				got := slices.Clone(top.Keys())
				slices.Sort(got)
				slices.Reverse(got)
				if w := want[:min(k, n)]; !slices.Equal(got, w) {
					t.Fatalf("n %d %s k %d: %v, want %v", n, order, k, got, w)
				}
			}
		}
	}
}

// BenchmarkTop streams 4096 random keys into a Top of 32 (a support
// chunk's momentum coordinates), against Largest over the same keys.
func BenchmarkTop(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	keys := make([]uint64, 4096)
	for i := range keys {
		keys[i] = r.Uint64() | 1
	}
	b.Run("top", func(b *testing.B) {
		var top Top
		for range b.N {
			top.Reset(32)
			floor := top.Floor()
			for _, k := range keys {
				if k > floor {
					top.Push(k)
					floor = top.Floor()
				}
			}
		}
	})
	b.Run("largest", func(b *testing.B) {
		buf := make([]uint64, len(keys))
		for range b.N {
			copy(buf, keys)
			Largest(buf, 32)
		}
	})
}
