//go:build !amd64 || purego

package parity

// haveBlocks says whether xorBlocks has a vector kernel here: not on this platform, where
// xorInto folds the sources in pairs with subtle.XORBytes.
const haveBlocks = false

func xorBlocks(dst []byte, srcs [][]byte, n int) { panic("parity: no xorBlocks kernel") }
