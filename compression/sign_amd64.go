package compression

import "golang.org/x/sys/cpu"

// hasSignAsm says decodeSign runs signBlocksAVX2 over its whole blocks.
var hasSignAsm = cpu.X86.HasAVX2

// signBlocksAVX2 decodes nb whole blocks of per bytes of sign bits each
// (8*per values): block b's values are its scale (the float32 bits at
// scales[4b:], little-endian) with the sign bit of masks[byte][j] for
// bit j of each byte, 8 values a byte.
//
//go:noescape
func signBlocksAVX2(dst *float32, scales *byte, bits *byte, nb, per int, masks *[256][8]uint32)

// signBlocksAsm is decodeSign's whole blocks (block a multiple of 8,
// bits at least their bytes long, scales checked) by signBlocksAVX2: how
// many it did.
func signBlocksAsm(dst []float32, scales []byte, bits []byte, block int) int {
	nb := len(dst) / block
	if nb == 0 || block%8 != 0 {
		return 0
	}
	_ = scales[4*nb-1]
	_ = bits[nb*block/8-1]
	signBlocksAVX2(&dst[0], &scales[0], &bits[0], nb, block/8, &signMasks)
	return nb
}
