package member

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// File's Mapper and MappedWriter: the file mapped into memory in full, for the array's mapped
// reads (raid/mapped.go says what keeps them correct) and its placed writes (raid/placed.go).
// The mapping is writable when the file is open for writing, read-only otherwise.

// maxMapped bounds the address space the members' mappings of one array take; an array whose
// members add up to more is not read through mappings.
const maxMapped = 16 << 40

// Mapping (Mapper) returns the member file mapped in full, mapping it at the first call, or nil
// if it cannot be mapped (empty, too big, or mmap refused) or must not be: a direct member's
// bytes are not in the page cache a mapping reads and writes, and its own I/O bypasses it.
// Close unmaps it. The caller only reads it: the array's placed writes, through
// WritableRange, are its one writer.
func (m *File) Mapping() []byte {
	m.mapOnce.Do(func() {
		if m.size <= 0 || m.size > maxMapped || m.direct {
			return
		}
		m.prot = unix.PROT_READ
		if fl, err := unix.FcntlInt(uintptr(m.fd), unix.F_GETFL, 0); err == nil && fl&unix.O_ACCMODE == unix.O_RDWR {
			m.prot |= unix.PROT_WRITE
		}
		p, err := unix.MmapPtr(m.fd, 0, nil, uintptr(m.size), m.prot, unix.MAP_SHARED)
		if err != nil {
			return
		}
		m.mapped = unsafe.Slice((*byte)(p), m.size)
		m.touched = make([]atomic.Uint64, (m.size+ptRegion*64-1)/(ptRegion*64))
		unix.Madvise(m.mapped, unix.MADV_RANDOM) // advice only: a failure changes nothing
	})
	return m.mapped
}

// ptRegion is the span of a mapping one page-table page maps: 512 entries of 4 KiB pages.
const ptRegion = 2 << 20

// remapRegions is how many ptRegions of a member's mapping may have been touched before Touch
// replaces the mapping (Remap). A mapping keeps a page-table page (4 KiB) for every region it
// has touched until it goes, which after a pass over a large member is memory: this bounds
// them to 4 MiB per member, a pass over 2 GiB of it. Each replacement costs a page fault for
// every page used again afterwards, so what is counted is regions, not bytes: the rule before
// (replace every member's mapping after 4 GiB served through them) replaced the mappings of an
// array whose clients keep to a few hundred MiB every few seconds under 48 KiB writes, and
// the faults that followed took ~5% of the daemon's CPU.
const remapRegions = 1024

// Touch (Mapper) records that the caller has used [off, off+n) of the mapping, and replaces
// the mapping (Remap) once remapRegions page-table regions have been touched since it was
// made; the error is Remap's. Touching a region again costs two atomic loads.
func (m *File) Touch(off, n int64) error {
	if n <= 0 || off < 0 || m.touched == nil || off+n > int64(len(m.mapped)) {
		return nil
	}
	fresh := int64(0)
	for r := off / ptRegion; r <= (off+n-1)/ptRegion; r++ {
		w, bit := &m.touched[r/64], uint64(1)<<(r%64)
		if w.Load()&bit == 0 && w.Or(bit)&bit == 0 {
			fresh++
		}
	}
	if fresh == 0 || m.nTouched.Add(fresh) < remapRegions || !m.remapMu.TryLock() {
		return nil
	}
	defer m.remapMu.Unlock()
	if m.nTouched.Load() < remapRegions {
		return nil // another caller has just replaced it
	}
	// Replace first, then forget: a region touched in between through the old mapping is
	// forgotten with page tables it no longer has.
	err := m.Remap()
	for i := range m.touched {
		m.touched[i].Store(0)
	}
	m.forgetResident(0, m.size) // found again, at a mincore per region
	m.nTouched.Store(0)
	m.remaps.Add(1)
	return err
}

// Remap (Mapper) replaces the member's mapping with a fresh one at the same address (MAP_FIXED),
// releasing the page tables the old one accumulated. Readers of the old one are unaffected: a
// page that faults afterwards finds the same file pages in the new mapping.
func (m *File) Remap() error {
	m.mapOnce.Do(func() {}) // no mapping made after this point races with us
	if m.mapped == nil {
		return nil
	}
	_, err := unix.MmapPtr(m.fd, 0, unsafe.Pointer(unsafe.SliceData(m.mapped)), uintptr(len(m.mapped)),
		m.prot, unix.MAP_SHARED|unix.MAP_FIXED)
	return err
}

// CopyMapped (Mapper) copies the member's bytes at off into p from its mapping and reports whether it
// could: false if the member is not mapped, the range is outside it, a page faults (a read
// error, or a page wholly past the end of a file truncated under the array), or the range ran
// past the end of the file (covers): the caller then reads with pread, which reports
// the error (ErrShortRead for the end of the file). The fault arrives as a signal that the
// runtime turns into a panic for this goroutine only (SetPanicOnFault) and that is recovered
// here.
func (m *File) CopyMapped(p []byte, off int64) (ok bool) {
	mp := m.Mapping()
	if off < 0 || off > int64(len(mp))-int64(len(p)) || len(p) == 0 {
		return false
	}
	defer func(old bool) {
		debug.SetPanicOnFault(old)
		if recover() != nil {
			ok = false
		}
	}(debug.SetPanicOnFault(true))
	copy(p, mp[off:])
	return m.covers(mp, off+int64(len(p)))
}

// covers reports whether the range of the mapping mp that ends at end lay within the file, as
// a mapped read must know before it uses the range: a file truncated under the array leaves
// the page its new end falls in mapped, reading as zeroes past that end (the pages after it
// fault, which the caller catches). So the range's last byte is loaded again (not taken from
// a copy, which may load its tail first): not zero, the file reached past it then; zero, the
// file's size now (fstat) must cover the range. It may fault.
func (m *File) covers(mp []byte, end int64) bool {
	if m.grown.Load() {
		return false // grown back by a write: the caller's pread reports it (readGuard)
	}
	if mp[end-1] != 0 || (end <= m.tailOff && m.reachesTail()) {
		return true
	}
	now, err := m.sizeNow()
	return err == nil && now >= end
}

// pageSize is the size of a page of memory, the tail mapping's length.
var pageSize = int64(unix.Getpagesize())

// mapTail maps a regular file's last page on its own (tail), for reachesTail. Without it (mmap
// refused, a block device) reachesTail asks fstat.
func (m *File) mapTail() {
	if m.block || m.size <= 0 {
		return
	}
	m.tailOff = (m.size - 1) &^ (pageSize - 1)
	p, err := unix.MmapPtr(m.fd, m.tailOff, nil, uintptr(pageSize), unix.PROT_READ, unix.MAP_SHARED)
	if err == nil {
		m.tail = unsafe.Slice((*byte)(p), pageSize)
	}
}

// unmapTail removes the tail mapping; the caller guarantees nothing reads it any more.
func (m *File) unmapTail() error {
	if m.tail == nil {
		return nil
	}
	err := unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(m.tail)), uintptr(pageSize))
	m.tail = nil
	return err
}

// reachesTail reports whether the file still reaches into its last page (its size is past
// tailOff): a load from the tail mapping, which faults (and is caught: false) once the file has
// been truncated below that page — the kernel removes the pages past a file's new end from
// every mapping of it before the truncation returns, and a page past the end faults rather
// than map again. A load costs a few nanoseconds where an fstat is a system call; the first
// one after the page left memory is a page fault. Without the mapping it asks fstat.
func (m *File) reachesTail() (ok bool) {
	if m.tail == nil {
		now, err := m.sizeNow()
		return err == nil && now > m.tailOff
	}
	defer func(old bool) {
		debug.SetPanicOnFault(old)
		if recover() != nil {
			ok = false
		}
	}(debug.SetPanicOnFault(true))
	atomic.LoadUint32((*uint32)(unsafe.Pointer(unsafe.SliceData(m.tail)))) // not optimised away
	return true
}

// unmap removes the mapping; the caller guarantees nothing reads it any more.
func (m *File) unmap() error {
	m.mapOnce.Do(func() {})
	if m.mapped == nil {
		return nil
	}
	err := unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(m.mapped)), uintptr(len(m.mapped)))
	m.mapped = nil
	return err
}

// Resident reports whether every page of b, a slice of a mapping, is in the page cache. vec is
// scratch space, grown as needed and returned.
func Resident(b []byte, vec []byte) (bool, []byte) {
	vec, err := pagesInMemory(b, vec)
	if err != nil {
		return false, vec
	}
	for _, v := range vec {
		if v&1 == 0 {
			return false, vec
		}
	}
	return true, vec
}

// pagesInMemory is mincore: for each page b touches, in order, a byte whose bit 0 says whether
// it is in memory. vec is scratch space, grown as needed and returned.
func pagesInMemory(b []byte, vec []byte) ([]byte, error) {
	const page = 4096
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := start &^ (page - 1)
	hi := (start + uintptr(len(b)) + page - 1) &^ (page - 1)
	n := int((hi - lo) / page)
	if cap(vec) < n {
		vec = make([]byte, n)
	}
	vec = vec[:n]
	_, _, errno := unix.Syscall(unix.SYS_MINCORE, lo, hi-lo, uintptr(unsafe.Pointer(unsafe.SliceData(vec))))
	if errno != 0 {
		return vec, errno
	}
	return vec, nil
}

// InFile (Mapper) is covers with a fault caught (false): a file truncated since the caller
// checked the range's pages were resident.
func (m *File) InFile(mp []byte, end int64) (ok bool) {
	defer func(old bool) {
		debug.SetPanicOnFault(old)
		if recover() != nil {
			ok = false
		}
	}(debug.SetPanicOnFault(true))
	return m.covers(mp, end)
}

// WritableRange (MappedWriter) returns mp[off:off+n] of the writable mapping mp when every page
// of it is in memory, on tmpfs too (so that no store allocates a page: a hole on a full tmpfs
// would fault); else nil. Whether the file still covers the range is the caller's to check
// after its stores (Covers): before them it would prove nothing.
//
// A mincore per call cost 10% of the daemon's CPU on 48 KiB placed writes (one per member per
// write), so what it finds is remembered per residentRegion: a region found wholly in memory
// is taken to stay so until the file's own Trim punches a hole in it, Covers finds the file
// shorter, or the mapping is replaced (Touch, after 2 GiB touched). Pages can still leave memory
// meanwhile (reclaim, swap), but not become holes: a store to one reads it back, it allocates
// nothing. Only a hole punched from outside the daemon (which holds the file exclusively) goes
// unseen, and a store into it on a full tmpfs faults, which the caller meets as an error of
// its copy (the NBD server's readv: EFAULT, the write not acknowledged). A region found in
// memory has its pages mapped at once (MADV_POPULATE_READ; within the page-table region the
// caller Touches), as a fault per page was 10-20% of the CPU of a daemon's first pass over
// its members under 48 KiB placed writes.
func (m *File) WritableRange(off, n int64) []byte {
	mp := m.Mapping()
	if mp == nil || m.prot&unix.PROT_WRITE == 0 || off < 0 || n <= 0 || off > int64(len(mp))-n {
		return nil
	}
	if !m.knownResident(off, n) && !m.findResident(mp, off, n) {
		return nil
	}
	return mp[off : off+n]
}

// residentRegion is the unit in which WritableRange remembers what mincore found.
const residentRegion = 1 << 20

// knownResident reports whether every region [off, off+n) touches is known to be in memory.
func (m *File) knownResident(off, n int64) bool {
	for r := off / residentRegion; r <= (off+n-1)/residentRegion; r++ {
		if m.inMemory[r/64].Load()&(1<<(r%64)) == 0 {
			return false
		}
	}
	return true
}

// findResident asks mincore about the regions [off, off+n) touches, remembers those wholly in
// memory, and reports whether [off, off+n) is.
func (m *File) findResident(mp []byte, off, n int64) bool {
	const page = 4096
	lo := off / residentRegion * residentRegion
	hi := min((off+n+residentRegion-1)/residentRegion*residentRegion, int64(len(mp)))
	vp := residentVecs.Get().(*[]byte)
	defer residentVecs.Put(vp)
	gen := m.forgets.Load()
	vec, err := pagesInMemory(mp[lo:hi], *vp)
	*vp = vec
	if err != nil {
		return false
	}
	in := true
	for i, v := range vec {
		if p0 := lo + int64(i)*page; v&1 == 0 && p0 < off+n && p0+page > off {
			in = false
			break
		}
	}
	for r := lo; r < hi; r += residentRegion {
		whole := true
		for _, v := range vec[(r-lo)/page : (min(r+residentRegion, hi)-lo+page-1)/page] {
			whole = whole && v&1 != 0
		}
		if whole {
			k := r / residentRegion
			m.inMemory[k/64].Or(1 << (k % 64))
			if m.forgets.Load() != gen { // a Trim may have punched it after mincore looked
				m.inMemory[k/64].And(^uint64(1 << (k % 64)))
				continue
			}
			// Its pages mapped in one call, not one fault at a time as the stores and
			// mapped reads meet them (advice only: a failure changes nothing).
			unix.Madvise(mp[r:min(r+residentRegion, hi)], unix.MADV_POPULATE_READ)
		}
	}
	return in
}

// forgetResident forgets what WritableRange found about the regions [off, off+n) touches.
func (m *File) forgetResident(off, n int64) {
	if m.inMemory == nil || n <= 0 {
		return
	}
	m.forgets.Add(1)
	for r := off / residentRegion; r <= min(off+n-1, m.size-1)/residentRegion; r++ {
		m.inMemory[r/64].And(^uint64(1 << (r % 64)))
	}
}

// Covers (MappedWriter) reports whether the file covers [0, end) now (reachesTail, else
// fstat); when it does not, what WritableRange found is forgotten.
func (m *File) Covers(end int64) bool {
	if end <= m.tailOff && m.reachesTail() {
		return true
	}
	now, err := m.sizeNow()
	if err == nil && now >= end {
		return true
	}
	m.forgetResident(0, m.size)
	return false
}

var residentVecs = sync.Pool{New: func() any { return new([]byte) }}
