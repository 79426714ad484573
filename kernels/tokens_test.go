package kernels

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// tokenGroups lists every row once, grouped by ascending token, rows of a
// token in row order, with offsets that delimit the groups.
func TestTokenGroups(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	var reused groupScratch
	for _, tc := range []struct{ n, vocab int }{{0, 5}, {1, 1}, {7, 3}, {1000, 50}, {300, 100000}, {1000, 50}, {2, 7}} {
		tokens := randomIDs(rng, tc.n, tc.vocab)
		g := reused.group(tokens, tc.vocab) // one scratch for every case, as on the GPU
		if fresh := tokenGroups(tokens, tc.vocab); !slices.Equal(g.packed, fresh.packed) || g.u != fresh.u {
			t.Fatalf("n %d: reused scratch %v, fresh %v", tc.n, g.packed, fresh.packed)
		}
		toks, starts, order := g.toks(), g.starts(), g.order()
		if len(order) != tc.n || len(starts) != g.u+1 || starts[g.u] != int32(tc.n) {
			t.Fatalf("n %d: %d rows, %d offsets ending at %d", tc.n, len(order), len(starts), starts[g.u])
		}
		seen := make([]bool, tc.n)
		for u := 0; u < g.u; u++ {
			if u > 0 && toks[u] <= toks[u-1] {
				t.Fatalf("tokens not ascending: %v", toks)
			}
			rows := order[starts[u]:starts[u+1]]
			if len(rows) == 0 || !slices.IsSorted(rows) {
				t.Fatalf("token %d: rows %v", toks[u], rows)
			}
			for _, r := range rows {
				if tokens[r] != toks[u] || seen[r] {
					t.Fatalf("row %d (token %d) in the group of %d", r, tokens[r], toks[u])
				}
				seen[r] = true
			}
		}
	}
}
