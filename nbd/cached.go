package nbd

import (
	"github.com/pojntfx/go-nbd/pkg/protocol"
	"github.com/raid5d/raid5d/nbd/internal/wire"
)

// writeCached offers the WRITE req (its payload read, about to go to a worker) to the device's
// WriteCached, pinned first under stable pages, and reports whether the device took it; then
// its reply is held back to go out with the next ones (deferReply), as a placed write's is,
// and the reader goes on with the next request. If not, the caller hands req to a worker,
// which writes it as usual (still pinned: the pin is counted once).
func (c *conn) writeCached(req *request) bool {
	if c.cached == nil || req.typ != wire.CmdWrite || req.length == 0 || req.flags&wire.CmdFlagFUA != 0 {
		return false
	}
	p := req.buf.mem[:req.length]
	var release func()
	if c.pinned != nil {
		req.buf.pin(c.srv.debugImmutable)
		req.pinned = true
		release = req.buf.release
	}
	if !c.cached.WriteCached(p, int64(req.off), release) {
		return false
	}
	c.encodeHeader(req, 0, -1, nil)
	c.deferReply(req)
	return true
}

// admitsNow reports whether the request h can be read and admitted without waiting: its
// payload, if any, is in the buffered reader, and neither the connection's in-flight bounds
// nor the server-wide budget would hold acquire up (the reader alone adds to them, so they
// cannot close meanwhile, save the budget that other connections share). Then the replies
// held back need not go out first.
func (c *conn) admitsNow(h *protocol.TransmissionRequestHeader) bool {
	if len(c.placed.deferred) == 0 {
		return false // nothing to hold back
	}
	n := int64(0)
	if h.Type == wire.CmdRead || h.Type == wire.CmdWrite {
		n = int64(h.Length)
	}
	if h.Type == wire.CmdWrite && int64(c.br.Buffered()) < n {
		return false
	}
	if n > 0 && c.srv.mem.wouldWait(min(n, payloadPiece)) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inflight < c.srv.maxInFlightReqs && (n == 0 || c.inflightBytes == 0 || c.inflightBytes+n <= c.srv.maxInFlightBytes)
}
