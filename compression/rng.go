package compression

// Stochastic rounding draws its noise from a counter-based generator: the
// 64-bit word for the pair of elements (2p, 2p+1) of a tensor is
// mix64(key + p*golden) with key = mix64(seed ^ golden), where p counts from
// the start of the tensor. Noise therefore depends only on (seed, element
// index), never on chunking or worker count.
//
// Element 2p uses the low 32 bits of the word, element 2p+1 the high 32 bits.
// Chunks and blocks start at multiples of 8, so a pair never straddles them.

const golden = 0x9E3779B97F4A7C15

// mix64 is the splitmix64 finalizer.
func mix64(z uint64) uint64 {
	z ^= z >> 30
	z *= 0xbf58476d1ce4e5b9
	z ^= z >> 27
	z *= 0x94d049bb133111eb
	return z ^ z>>31
}

func rngKey(seed uint64) uint64 { return mix64(seed ^ golden) }

// pairBits returns the 64 noise bits of pair p.
func pairBits(key uint64, p uint64) uint64 { return mix64(key + p*golden) }

// unit24 maps the top 24 bits of a 32-bit word to [0, 1).
func unit24(w uint32) float32 { return float32(w>>8) * (1.0 / (1 << 24)) }
