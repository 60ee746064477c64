package loadgen

import (
	"math/rand/v2"
	"slices"
	"sync"
)

// crashDev is an in-memory Device whose writes are volatile until flushed, like a disk with a
// write cache: Crash returns what survives a power cut. With loseFlushed it also drops the first
// write of every flush (a device that lies about durability), remembering where.
type crashDev struct {
	mu          sync.Mutex // guards everything below
	cur         []byte     // what reads see
	durable     []byte     // what survives a crash
	dirty       map[int64]int
	loseFlushed bool
	lost        []int64 // offsets of flushed writes dropped by loseFlushed
	readHook    func(p []byte, off int64)
}

func newCrashDev(size int) *crashDev {
	return &crashDev{cur: make([]byte, size), durable: make([]byte, size), dirty: map[int64]int{}}
}

func (d *crashDev) ReadAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	n := copy(p, d.cur[off:])
	hook := d.readHook
	d.mu.Unlock()
	if hook != nil {
		hook(p, off)
	}
	return n, nil
}

func (d *crashDev) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dirty[off] = len(p)
	return copy(d.cur[off:], p), nil
}

func (d *crashDev) WriteAtFUA(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.dirty, off)
	copy(d.durable[off:], p)
	return copy(d.cur[off:], p), nil
}

func (d *crashDev) Flush() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	offs := make([]int64, 0, len(d.dirty))
	for off := range d.dirty {
		offs = append(offs, off)
	}
	slices.Sort(offs)
	for i, off := range offs {
		n := d.dirty[off]
		if d.loseFlushed && i == 0 {
			d.lost = append(d.lost, off)
		} else {
			copy(d.durable[off:off+int64(n)], d.cur[off:])
		}
		delete(d.dirty, off)
	}
	return nil
}

// crash returns a device holding what survived: the durable image plus, for each unflushed
// write, a random choice per 4 KiB of its new contents or the old (writes may tear between
// units, not inside one).
func (d *crashDev) crash(rng *rand.Rand) *crashDev {
	d.mu.Lock()
	defer d.mu.Unlock()
	img := append([]byte(nil), d.durable...)
	for off, n := range d.dirty {
		for u := off; u < off+int64(n); u += 4096 {
			if rng.IntN(2) == 0 {
				e := min(u+4096, off+int64(n))
				copy(img[u:e], d.cur[u:e])
			}
		}
	}
	nd := newCrashDev(len(img))
	copy(nd.cur, img)
	copy(nd.durable, img)
	return nd
}
