package cache

import "sync"

// freeList is a stack of values for reuse, with a sync.Pool's shape (New, Get, Put) but none of
// its losses: a sync.Pool is emptied by every GC, and misses now and then when a value is put
// on another P than it is taken on, or when several goroutines hold values at once; each miss
// on the write path was an allocation (a Pin, or a write-out's workspace with its scratch
// buffer: TestWriteAllocs). A freeList never drops what it holds, so it holds as many values as
// were ever out at once, and in steady state Get allocates nothing.
type freeList struct {
	New  func() any // makes a value when the list is empty
	mu   sync.Mutex // guards free
	free []any
}

// Get takes a value off the list, or makes one with New.
func (f *freeList) Get() any {
	f.mu.Lock()
	if n := len(f.free); n > 0 {
		x := f.free[n-1]
		f.free[n-1] = nil
		f.free = f.free[:n-1]
		f.mu.Unlock()
		return x
	}
	f.mu.Unlock()
	return f.New()
}

// Put puts x on the list.
func (f *freeList) Put(x any) {
	f.mu.Lock()
	f.free = append(f.free, x)
	f.mu.Unlock()
}
