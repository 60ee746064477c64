// Package aligned allocates byte slices whose first byte is aligned in memory, as direct I/O
// (O_DIRECT) needs of every buffer it reads into or writes from (raid/member # Direct I/O).
// The memory is ordinary garbage-collected memory: a slice is kept alive, and freed, like any
// other. Pure Go, no system calls, so that every layer that makes buffers reaching members
// (stripe/cache, raid, its bitmap and journal) may use it.
package aligned

import "unsafe"

// Align is the alignment Make gives: a page, which satisfies the memory alignment of direct
// I/O on every Linux block device and file system (their logical block size is at most a page
// in practice; a member that needs more says so and gets it from MakeAligned).
const Align = 4096

// Make returns a zeroed slice of n bytes (len = cap = n) whose first byte is at an address
// that is a multiple of Align.
func Make(n int) []byte { return MakeAligned(n, Align) }

// MakeAligned is Make for alignment align, a power of two.
func MakeAligned(n, align int) []byte {
	if align&(align-1) != 0 || align <= 0 {
		panic("aligned: alignment is not a power of two")
	}
	if n == 0 {
		return []byte{}
	}
	b := make([]byte, n)
	if Is(b, align) { // large allocations start on a page of the heap: the usual case
		return b
	}
	b = make([]byte, n+align-1)
	o := int(-uintptr(unsafe.Pointer(unsafe.SliceData(b)))) & (align - 1)
	return b[o : o+n : o+n]
}

// Is reports whether b's first byte is at a multiple of align (a power of two); an empty
// slice is aligned.
func Is(b []byte, align int) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))&uintptr(align-1) == 0
}
