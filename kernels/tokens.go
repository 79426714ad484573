package kernels

import "slices"

// groups is the rows of a batch grouped by token, for the encoder's
// backward on the GPU (sk_encoder_backward_wte). packed holds, for one
// copy to the device, the u distinct tokens, u+1 offsets into order, and
// order: the row indices sorted by token, rows of one token in row order.
type groups struct {
	u      int
	packed []int32
}

// tokenGroups groups the rows of tokens by token.
func tokenGroups(tokens []int32) groups {
	n := len(tokens)
	order := make([]int32, n)
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(a, b int32) int { return int(tokens[a]) - int(tokens[b]) })
	var toks, starts []int32
	for k, r := range order {
		if k == 0 || tokens[r] != tokens[order[k-1]] {
			toks = append(toks, tokens[r])
			starts = append(starts, int32(k))
		}
	}
	starts = append(starts, int32(n))
	packed := make([]int32, 0, len(toks)+len(starts)+n)
	packed = append(append(append(packed, toks...), starts...), order...)
	return groups{u: len(toks), packed: packed}
}

func (g groups) toks() []int32   { return g.packed[:g.u] }
func (g groups) starts() []int32 { return g.packed[g.u : 2*g.u+1] }
func (g groups) order() []int32  { return g.packed[2*g.u+1:] }
