//go:build !purego

package parity

import "golang.org/x/sys/cpu"

// haveBlocks says whether xorBlocks has a vector kernel here.
var haveBlocks = cpu.X86.HasAVX2

//go:noescape
func xorBlocksAVX2(dst *byte, srcs *[]byte, nsrc int, n int)

// xorBlocks sets dst[:n] to the XOR of srcs[i][:n], n a multiple of blockSize (see xorInto).
func xorBlocks(dst []byte, srcs [][]byte, n int) {
	xorBlocksAVX2(&dst[0], &srcs[0], len(srcs), n)
}
