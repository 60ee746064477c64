package stripe

// UnitSize is the unit of a stripe's state in the write-back cache (package stripe/cache): each
// 4 KiB of a cached chunk is up to date or not, dirty or not, and held in the head's own buffer
// or referenced in a pinned caller buffer.
const UnitSize = 4 << 10

// MemberOp is one member read or write in stripe Stripe. Off is an offset in the member's data
// area. A read fills Buf; a write only reads it. A write with Vec set writes the buffers of Vec
// one after another from Off instead (Buf unused): one vectored call where the member can,
// each buffer within one chunk; such a write may span the Stripes consecutive stripes from
// Stripe (0 counts as 1). Whoever builds an op sets its stripes; the array derives the
// write-intent bitmap's regions and the journal's records from them (Span), never from Off.
type MemberOp struct {
	Role    int
	Buf     []byte
	Off     int64
	Write   bool
	Vec     [][]byte
	Stripe  int64
	Stripes int64
}

// Span returns the stripes the op lies in: n consecutive stripes from s0.
func (op *MemberOp) Span() (s0, n int64) { return op.Stripe, max(op.Stripes, 1) }
