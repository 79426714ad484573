package optimizer

import (
	"slices"
	"testing"
)

func TestOrderByBandwidthFollowsFastLinks(t *testing.T) {
	// Two sites: a,b,c in one, d,e,f in another; fast inside a site, slow
	// across. A good ring crosses between sites exactly twice.
	site := map[PeerID]int{"a": 0, "b": 0, "c": 0, "d": 1, "e": 1, "f": 1}
	bw := func(x, y PeerID) float64 {
		if site[x] == site[y] {
			return 1000
		}
		return 10
	}
	group := []PeerID{"a", "b", "c", "d", "e", "f"}
	// Interleaved input order must not matter: the function sorts nothing
	// itself, but its result depends only on the set and bw.
	ring := OrderByBandwidth(bw)(group)
	crossings := 0
	for i := range ring {
		if site[ring[i]] != site[ring[(i+1)%len(ring)]] {
			crossings++
		}
	}
	if crossings != 2 {
		t.Errorf("ring %v crosses sites %d times, want 2", ring, crossings)
	}
	sorted := slices.Clone(ring)
	slices.Sort(sorted)
	if !slices.Equal(sorted, group) {
		t.Errorf("ring %v is not a permutation of %v", ring, group)
	}
	if again := OrderByBandwidth(bw)(group); !slices.Equal(again, ring) {
		t.Errorf("not deterministic: %v vs %v", again, ring)
	}
}
