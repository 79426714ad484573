#include "textflag.h"

// CMPX(a, b) is a compare-exchange of two registers of 8 ordered keys:
// a takes the lanes' minima, b their maxima.
#define CMPX(a, b) VPMINSD a, b, Y8; VPMAXSD a, b, b; VMOVDQA Y8, a

// KEY(r) maps 8 float32 bits to orderedKey's int32 keys in place (and
// keys back to float bits: the map is its own inverse): a negative
// value's magnitude bits are flipped.
#define KEY(r) VPSRAD $31, r, Y8; VPSRLD $1, Y8, Y8; VPXOR Y8, r, r

// func median8AVX2(out *float32, in *[8]*float32, n int)
//
// For each of 8 coordinates at a time: the 8 contributions' values as
// ordered keys, median8's sorting network on them (less its last layer:
// (1,2) and (5,6) touch neither middle position, and (3,4) only orders
// the two, whose mean below is the same bits either way: +0 + a is a,
// or +0 where a is -0, and a sum of two float64s commutes), and the two
// middle values' mean as median8 computes it: in float64, (+0 + a + b)
// / 2, rounded to float32. The same operations on the same values, lane
// by lane, so the same bits.
TEXT ·median8AVX2(SB), NOSPLIT, $0-24
	MOVQ out+0(FP), DI
	MOVQ in+8(FP), AX
	MOVQ n+16(FP), CX
	MOVQ 0(AX), R8
	MOVQ 8(AX), R9
	MOVQ 16(AX), R10
	MOVQ 24(AX), R11
	MOVQ 32(AX), R12
	MOVQ 40(AX), R13
	MOVQ 48(AX), SI
	MOVQ 56(AX), DX
	SHLQ $2, CX // bytes
	XORQ BX, BX
	MOVQ $0x4000000000000000, AX // 2.0
	VMOVQ AX, X10
	VPBROADCASTQ X10, Y10
	VXORPD Y11, Y11, Y11 // +0

loop:
	CMPQ BX, CX
	JGE  done
	VMOVDQU (R8)(BX*1), Y0
	VMOVDQU (R9)(BX*1), Y1
	VMOVDQU (R10)(BX*1), Y2
	VMOVDQU (R11)(BX*1), Y3
	VMOVDQU (R12)(BX*1), Y4
	VMOVDQU (R13)(BX*1), Y5
	VMOVDQU (SI)(BX*1), Y6
	VMOVDQU (DX)(BX*1), Y7
	KEY(Y0)
	KEY(Y1)
	KEY(Y2)
	KEY(Y3)
	KEY(Y4)
	KEY(Y5)
	KEY(Y6)
	KEY(Y7)
	CMPX(Y0, Y2)
	CMPX(Y1, Y3)
	CMPX(Y4, Y6)
	CMPX(Y5, Y7)
	CMPX(Y0, Y4)
	CMPX(Y1, Y5)
	CMPX(Y2, Y6)
	CMPX(Y3, Y7)
	CMPX(Y0, Y1)
	CMPX(Y2, Y3)
	CMPX(Y4, Y5)
	CMPX(Y6, Y7)
	CMPX(Y2, Y4)
	CMPX(Y3, Y5)
	CMPX(Y1, Y4)
	CMPX(Y3, Y6)
	KEY(Y3)
	KEY(Y4)
	// Lanes 0-3: s = +0 + a, s = s + b, s / 2, to float32.
	VCVTPS2PD X3, Y12
	VCVTPS2PD X4, Y13
	VADDPD    Y12, Y11, Y12
	VADDPD    Y13, Y12, Y12
	VDIVPD    Y10, Y12, Y12
	VCVTPD2PSY Y12, X12
	// Lanes 4-7.
	VEXTRACTF128 $1, Y3, X3
	VEXTRACTF128 $1, Y4, X4
	VCVTPS2PD X3, Y13
	VCVTPS2PD X4, Y14
	VADDPD    Y13, Y11, Y13
	VADDPD    Y14, Y13, Y13
	VDIVPD    Y10, Y13, Y13
	VCVTPD2PSY Y13, X13
	VINSERTF128 $1, X13, Y12, Y12
	VMOVUPS   Y12, (DI)(BX*1)
	ADDQ      $32, BX
	JMP       loop

done:
	VZEROUPPER
	RET
