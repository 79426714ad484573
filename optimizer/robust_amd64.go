package optimizer

import "golang.org/x/sys/cpu"

// hasMedianAsm says median8 runs median8AVX2 over whole groups of 8
// coordinates.
var hasMedianAsm = cpu.X86.HasAVX2

// median8AVX2 is median8's median (t = 3) of n coordinates, n a multiple
// of 8, 8 coordinates a pass: in[j] is contribution j's first value.
//
//go:noescape
func median8AVX2(out *float32, in *[8]*float32, n int)

// median8Asm is median8AVX2 on the first len(out)&^7 coordinates, the
// count it did.
func median8Asm(out []float32, inputs [][]float32) int {
	n := len(out) &^ 7
	if n == 0 {
		return 0
	}
	var in [8]*float32
	for j := range in {
		in[j] = &inputs[j][:n][0]
	}
	median8AVX2(&out[0], &in, n)
	return n
}
