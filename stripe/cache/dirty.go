package cache

// Dirty reports whether any stripe of [s0, s0+n) has a cache head with dirty units: data
// newer than what the members hold. A caller that holds those stripes' locks gets an exact
// answer: no write or write-out of them can be under way, and every write that returned has
// either left its units dirty or reached the members. Without the locks it is a hint, which
// may be stale by the time it returns. It takes only Cache.mu, so it may be called under a
// stripe lock (the cache's lock order), and costs a map lookup per stripe, or a walk of the
// heads when the range holds more stripes than the cache has heads.
func (c *Cache) Dirty(s0, n int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n <= int64(len(c.heads)) {
		for s := s0; s < s0+n; s++ {
			if h := c.heads[s]; h != nil && h.dirty {
				return true
			}
		}
		return false
	}
	for s, h := range c.heads {
		if s >= s0 && s < s0+n && h.dirty {
			return true
		}
	}
	return false
}
