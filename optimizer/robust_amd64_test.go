package optimizer

import (
	"math"
	"math/rand/v2"
	"testing"
)

// median8AVX2 gives median8's Go loop's bits, coordinate by coordinate,
// on values of every kind (signed zeros, ties, infinities, subnormals,
// huge ones) and lengths that leave a tail to the Go loop.
func TestMedian8AsmBits(t *testing.T) {
	if !hasMedianAsm {
		t.Skip("no AVX2 on this CPU: median8 runs its Go loop only")
	}
	r := rand.New(rand.NewPCG(11, 12))
	draw := func() float32 {
		switch r.IntN(9) {
		case 0:
			return 0
		case 1:
			return float32(math.Copysign(0, -1))
		case 2:
			return float32(r.IntN(5) - 2)
		case 3:
			return float32(math.Inf(1 - 2*r.IntN(2)))
		case 4:
			return math.Float32frombits(uint32(r.IntN(1<<23)) | uint32(r.IntN(2))<<31) // subnormal
		case 5:
			return float32(r.NormFloat64() * 1e38)
		}
		return float32(r.NormFloat64())
	}
	for _, n := range []int{7, 8, 9, 64, 1003} {
		inputs := make([][]float32, 8)
		for j := range inputs {
			inputs[j] = make([]float32, n)
			for i := range inputs[j] {
				inputs[j][i] = draw()
			}
		}
		got, want := make([]float32, n), make([]float32, n)
		median8(got, inputs, 3)
		hasMedianAsm = false
		median8(want, inputs, 3)
		hasMedianAsm = true
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("n %d coordinate %d: %v (%#x), the Go loop gives %v (%#x)", n, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			}
		}
	}
}
