package nbd

import (
	"math/bits"
	"sync"
	"unsafe"
)

// Request buffers come from size classes of powers of two, 4 KiB to 32 MiB, each a sync.Pool.
// Buffers are page-aligned. A buffer belongs to exactly one request from getBuffer until
// putBuffer, which the server calls only after that request's reply has been written and the
// Device call given the buffer has returned.
const (
	pageSize    = 4096
	minBufShift = 12
	maxBufShift = 25
)

var bufPools [maxBufShift - minBufShift + 1]sync.Pool // of *[]byte, full length of the class

// getBuffer returns a buffer of at least n bytes (len = cap = its size class). Sizes above the
// largest class are allocated and not pooled.
func getBuffer(n int) *[]byte {
	if n > 1<<maxBufShift {
		b := alignedSlice(n)
		return &b
	}
	class := 0
	if n > 1<<minBufShift {
		class = bits.Len(uint(n-1)) - minBufShift
	}
	if v := bufPools[class].Get(); v != nil {
		return v.(*[]byte)
	}
	b := alignedSlice(1 << (class + minBufShift))
	return &b
}

// putBuffer returns b to its pool; buffers of no class are dropped.
func putBuffer(b *[]byte) {
	c := cap(*b)
	if c < 1<<minBufShift || c > 1<<maxBufShift || c&(c-1) != 0 {
		return
	}
	*b = (*b)[:c]
	bufPools[bits.Len(uint(c))-1-minBufShift].Put(b)
}

// alignedSlice allocates n bytes starting on a page boundary. Go's allocator already aligns
// power-of-two sizes from 4 KiB up; the fallback costs one page more.
func alignedSlice(n int) []byte {
	b := make([]byte, n)
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%pageSize == 0 {
		return b
	}
	b = make([]byte, n+pageSize-1)
	off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(b))) % pageSize)
	return b[off : off+n : off+n]
}
