package optimizer

// OrderByBandwidth returns a RingConfig.Order that arranges the group into a
// ring along fast links, from measured peer-to-peer bandwidth (PCCL solves
// this as a small travelling-salesman problem; a greedy tour improved by
// 2-opt is close at swarm sizes). bw(a, b) is the measured bandwidth from a
// to b in any unit, or 0 when unknown; unknown links are treated as the
// slowest. The result depends only on the group and bw, so every member that
// shares the measurements builds the same ring.
func OrderByBandwidth(bw func(a, b PeerID) float64) func([]PeerID) []PeerID {
	return func(group []PeerID) []PeerID {
		n := len(group)
		if n <= 3 {
			return group // every ring of 3 uses the same links
		}
		cost := make([][]float64, n)
		for i := range cost {
			cost[i] = make([]float64, n)
			for j := range cost[i] {
				if i != j {
					if b := bw(group[i], group[j]); b > 0 {
						cost[i][j] = 1 / b
					} else {
						cost[i][j] = 1e18
					}
				}
			}
		}
		// Greedy nearest neighbour from the first (smallest) ID.
		tour := []int{0}
		used := make([]bool, n)
		used[0] = true
		for len(tour) < n {
			last, best := tour[len(tour)-1], -1
			for j := 0; j < n; j++ {
				if !used[j] && (best < 0 || cost[last][j] < cost[last][best]) {
					best = j
				}
			}
			used[best] = true
			tour = append(tour, best)
		}
		// 2-opt: reverse segments while that lowers the tour's cost.
		tourCost := func(t []int) float64 {
			var c float64
			for i := range t {
				c += cost[t[i]][t[(i+1)%n]]
			}
			return c
		}
		for improved := true; improved; {
			improved = false
			for i := 1; i < n-1; i++ {
				for j := i + 1; j < n; j++ {
					cand := append([]int(nil), tour...)
					for a, b := i, j; a < b; a, b = a+1, b-1 {
						cand[a], cand[b] = cand[b], cand[a]
					}
					if tourCost(cand) < tourCost(tour)-1e-12 {
						tour, improved = cand, true
					}
				}
			}
		}
		out := make([]PeerID, n)
		for i, k := range tour {
			out[i] = group[k]
		}
		return out
	}
}
