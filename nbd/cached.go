package nbd

import (
	"github.com/pojntfx/go-nbd/pkg/protocol"
)

// writeCached offers the WRITE h (no FUA), whose whole payload the buffered reader holds, to
// the device's WriteCached straight from that buffer, and reports whether the device took it.
// If it did, the payload is consumed and the reply is held back to go out with the next ones
// (deferReply), as a placed write's is: the reader answers the write itself, without a worker
// and without a request buffer. If not, nothing was consumed and the caller goes on as usual.
func (c *conn) writeCached(h *protocol.TransmissionRequestHeader) bool {
	p, err := c.br.Peek(int(h.Length))
	if err != nil || !c.cached.WriteCached(p, int64(h.Offset)) {
		return false
	}
	c.br.Discard(len(p)) // buffered: cannot fail
	// A request with no buffer, only for the reply and the in-flight bound, as a placed write's.
	hr := *h
	hr.Length = 0
	req, _ := c.acquire(&hr) // without a buffer to map, it cannot fail
	req.length = h.Length
	c.serving.Add(1)
	c.encodeHeader(req, 0, -1, nil)
	c.deferReply(req, c.br.Buffered())
	return true
}
