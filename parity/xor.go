package parity

import "crypto/subtle"

// blockSize is the unit of xorBlocks' vector kernel (xor_amd64.s: eight 32-byte registers).
const blockSize = 256

// xorInto sets dst to the XOR of srcs (at least two, each at least len(dst) long) in one pass
// where the CPU has the vector kernel (AVX2): every byte of every source is loaded once and
// every byte of dst stored once, where folding the sources in pairs reads and writes dst
// once per source after the second (a 3+1 stripe: 64 KiB read and 32 KiB written per 16 KiB
// of parity against 48 and 16). dst may be one of the sources (at the same offset): the
// kernel loads a block of every source before it stores the block. The tail shorter than a
// block, and CPUs without the kernel, go through subtle.XORBytes pairwise.
func xorInto(dst []byte, srcs [][]byte) {
	n := len(dst)
	done := 0
	if haveBlocks && n >= blockSize {
		done = n &^ (blockSize - 1)
		xorBlocks(dst, srcs, done)
	}
	if done == n {
		return
	}
	d := dst[done:]
	subtle.XORBytes(d, srcs[0][done:n], srcs[1][done:n])
	for _, s := range srcs[2:] {
		subtle.XORBytes(d, d, s[done:n])
	}
}
