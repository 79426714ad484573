#include "textflag.h"

// func signBlocksAVX2(dst *float32, scales *byte, bits *byte, nb, per int, masks *[256][8]uint32)
//
// For each of nb blocks: its scale broadcast to 8 lanes, then for each of
// its per bytes of bits, the 8 values scale XOR masks[byte] (the sign bit
// where a bit is 0), stored: what decodeSign's Go loop computes, 8
// values an instruction.
TEXT ·signBlocksAVX2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ scales+8(FP), SI
	MOVQ bits+16(FP), DX
	MOVQ nb+24(FP), CX
	MOVQ per+32(FP), R8
	MOVQ masks+40(FP), R9

block:
	TESTQ CX, CX
	JZ    done
	VPBROADCASTD (SI), Y0
	MOVQ  R8, R10

octet:
	MOVBQZX (DX), AX
	SHLQ    $5, AX
	VPXOR   (R9)(AX*1), Y0, Y1
	VMOVDQU Y1, (DI)
	ADDQ    $32, DI
	INCQ    DX
	DECQ    R10
	JNZ     octet
	ADDQ    $4, SI
	DECQ    CX
	JMP     block

done:
	VZEROUPPER
	RET
