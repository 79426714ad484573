#include "textflag.h"

// func fwhtAVX2(a *float32, n int)
//
// The Walsh-Hadamard transform of a[0:n] in place, n a power of two >= 8,
// stage by stage as the textbook loop: a[j], a[j+h] = a[j]+a[j+h],
// a[j]-a[j+h] for h = 1, 2, 4, ... Stages 1, 2 and 4 work within one
// register of 8 values: t is the register with each value's partner,
// s = x+t and d = t-x, and the upper value of each pair takes d (its
// partner minus itself: a[j]-a[j+h]), the lower one s. Stages 8 and up
// pair whole registers, two stages a pass (stage4) while they fit.
TEXT ·fwhtAVX2(SB), NOSPLIT, $0-16
	MOVQ a+0(FP), DI
	MOVQ n+8(FP), CX

	MOVQ DI, SI
	MOVQ CX, DX
	SHRQ $3, DX

inreg:
	VMOVUPS (SI), Y0
	// h = 1: partners [1 0 3 2 ...], upper lanes 1 3 5 7
	VPERMILPS $0xB1, Y0, Y1
	VADDPS    Y1, Y0, Y2
	VSUBPS    Y0, Y1, Y3
	VBLENDPS  $0xAA, Y3, Y2, Y0
	// h = 2: partners [2 3 0 1 ...], upper lanes 2 3 6 7
	VPERMILPS $0x4E, Y0, Y1
	VADDPS    Y1, Y0, Y2
	VSUBPS    Y0, Y1, Y3
	VBLENDPS  $0xCC, Y3, Y2, Y0
	// h = 4: partners across the two halves, upper lanes 4-7
	VPERM2F128 $0x01, Y0, Y0, Y1
	VADDPS     Y1, Y0, Y2
	VSUBPS     Y0, Y1, Y3
	VBLENDPS   $0xF0, Y3, Y2, Y0
	VMOVUPS   Y0, (SI)
	ADDQ      $32, SI
	DECQ      DX
	JNZ       inreg

	MOVQ $8, BX // h, in values

	// Stages h and 2h in one pass while 4h <= n: of each 4 values a, b,
	// c, d at j, j+h, j+2h, j+3h, stage h makes a+b, a-b, c+d, c-d and
	// stage 2h pairs the first with the third and the second with the
	// fourth: the same operations in the same order as two passes, with
	// half the loads and stores.
stage4:
	MOVQ BX, AX
	SHLQ $2, AX // 4h
	CMPQ AX, CX
	JG   stage
	MOVQ BX, R8
	SHLQ $2, R8 // h in bytes
	MOVQ DI, SI // the block's start
	MOVQ CX, R9 // values left

block4:
	MOVQ BX, R10
	SHRQ $3, R10
	MOVQ SI, R11
	LEAQ (SI)(R8*2), R12

quad:
	VMOVUPS (R11), Y0
	VMOVUPS (R11)(R8*1), Y1
	VMOVUPS (R12), Y2
	VMOVUPS (R12)(R8*1), Y3
	VADDPS  Y1, Y0, Y4 // a+b
	VSUBPS  Y1, Y0, Y5 // a-b
	VADDPS  Y3, Y2, Y6 // c+d
	VSUBPS  Y3, Y2, Y7 // c-d
	VADDPS  Y6, Y4, Y0
	VSUBPS  Y6, Y4, Y2
	VADDPS  Y7, Y5, Y1
	VSUBPS  Y7, Y5, Y3
	VMOVUPS Y0, (R11)
	VMOVUPS Y1, (R11)(R8*1)
	VMOVUPS Y2, (R12)
	VMOVUPS Y3, (R12)(R8*1)
	ADDQ    $32, R11
	ADDQ    $32, R12
	DECQ    R10
	JNZ     quad

	LEAQ (SI)(R8*4), SI
	SUBQ AX, R9
	JNZ  block4

	SHLQ $2, BX
	JMP  stage4

	// At most one stage is left, alone.
stage:
	CMPQ BX, CX
	JGE  done
	MOVQ BX, R8
	SHLQ $2, R8 // h in bytes
	MOVQ DI, SI // the block's start
	MOVQ CX, R9 // values left

block:
	MOVQ BX, R10
	SHRQ $3, R10
	MOVQ SI, R11

pair:
	VMOVUPS (R11), Y0
	VMOVUPS (R11)(R8*1), Y1
	VADDPS  Y1, Y0, Y2
	VSUBPS  Y1, Y0, Y3
	VMOVUPS Y2, (R11)
	VMOVUPS Y3, (R11)(R8*1)
	ADDQ    $32, R11
	DECQ    R10
	JNZ     pair

	LEAQ (SI)(R8*2), SI
	SUBQ BX, R9
	SUBQ BX, R9
	JNZ  block

	SHLQ $1, BX
	JMP  stage

done:
	VZEROUPPER
	RET
