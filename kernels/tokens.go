package kernels

// groups is the rows of a batch grouped by token, for the encoder's
// backward on the GPU (sk_encoder_backward_wte). packed holds, for one
// copy to the device, the u distinct tokens in ascending order, u+1
// offsets into order, and order: the row indices grouped by token, rows of
// one token in row order.
type groups struct {
	u      int
	packed []int32
}

// tokenGroups groups the rows of tokens (each in [0, vocab)) by token: a
// counting sort, stable, in O(len(tokens) + vocab).
func tokenGroups(tokens []int32, vocab int) groups {
	var s groupScratch
	return s.group(tokens, vocab)
}

// groupScratch is the memory of tokenGroups, kept between calls (the GPU's
// encoder backward runs it every step); the groups it returns are valid
// until its next call.
type groupScratch struct{ count, packed []int32 }

func (s *groupScratch) group(tokens []int32, vocab int) groups {
	n := len(tokens)
	if cap(s.count) < vocab+1 {
		s.count = make([]int32, vocab+1)
	}
	count := s.count[:vocab+1]
	clear(count)
	for _, t := range tokens {
		count[t+1]++
	}
	u := 0
	for t := 1; t <= vocab; t++ {
		if count[t] > 0 {
			u++
		}
		count[t] += count[t-1] // count[t]: the first slot of token t
	}
	if cap(s.packed) < 2*u+1+n {
		s.packed = make([]int32, 2*min(n, vocab)+1+n) // room for any batch of n
	}
	packed := s.packed[:2*u+1+n]
	toks, starts, order := packed[:u], packed[u:2*u+1], packed[2*u+1:]
	k := 0
	for t := 0; t < vocab; t++ {
		if count[t+1] > count[t] {
			toks[k], starts[k] = int32(t), count[t]
			k++
		}
	}
	starts[u] = int32(n)
	for r, t := range tokens {
		order[count[t]] = int32(r)
		count[t]++
	}
	return groups{u: u, packed: packed}
}

func (g groups) toks() []int32   { return g.packed[:g.u] }
func (g groups) starts() []int32 { return g.packed[g.u : 2*g.u+1] }
func (g groups) order() []int32  { return g.packed[2*g.u+1:] }
