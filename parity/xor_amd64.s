//go:build !purego

#include "textflag.h"

// func xorBlocksAVX2(dst *byte, srcs *[]byte, nsrc int, n int)
//
// dst[0:n] = srcs[0][0:n] ^ srcs[1][0:n] ^ ... ^ srcs[nsrc-1][0:n], in blocks of 256 bytes:
// each block of every source is loaded (into Y0-Y7) before the block of dst is stored, so dst
// may be one of the sources. n is a multiple of 256; nsrc ≥ 1.
TEXT ·xorBlocksAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ srcs+8(FP), SI
	MOVQ nsrc+16(FP), CX
	MOVQ n+24(FP), DX
	XORQ AX, AX

block:
	CMPQ AX, DX
	JAE  done
	MOVQ (SI), R8 // srcs[0]'s data pointer
	VMOVDQU (R8)(AX*1), Y0
	VMOVDQU 32(R8)(AX*1), Y1
	VMOVDQU 64(R8)(AX*1), Y2
	VMOVDQU 96(R8)(AX*1), Y3
	VMOVDQU 128(R8)(AX*1), Y4
	VMOVDQU 160(R8)(AX*1), Y5
	VMOVDQU 192(R8)(AX*1), Y6
	VMOVDQU 224(R8)(AX*1), Y7
	MOVQ $1, R9      // the next source
	LEAQ 24(SI), R10 // &srcs[1] (a slice header is 24 bytes)

source:
	CMPQ  R9, CX
	JAE   store
	MOVQ  (R10), R8
	VPXOR (R8)(AX*1), Y0, Y0
	VPXOR 32(R8)(AX*1), Y1, Y1
	VPXOR 64(R8)(AX*1), Y2, Y2
	VPXOR 96(R8)(AX*1), Y3, Y3
	VPXOR 128(R8)(AX*1), Y4, Y4
	VPXOR 160(R8)(AX*1), Y5, Y5
	VPXOR 192(R8)(AX*1), Y6, Y6
	VPXOR 224(R8)(AX*1), Y7, Y7
	ADDQ  $24, R10
	INCQ  R9
	JMP   source

store:
	VMOVDQU Y0, (DI)(AX*1)
	VMOVDQU Y1, 32(DI)(AX*1)
	VMOVDQU Y2, 64(DI)(AX*1)
	VMOVDQU Y3, 96(DI)(AX*1)
	VMOVDQU Y4, 128(DI)(AX*1)
	VMOVDQU Y5, 160(DI)(AX*1)
	VMOVDQU Y6, 192(DI)(AX*1)
	VMOVDQU Y7, 224(DI)(AX*1)
	ADDQ    $256, AX
	JMP     block

done:
	VZEROUPPER
	RET
