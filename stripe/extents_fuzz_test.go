package stripe

import (
	"testing"
)

// maxFuzzOff keeps off+n far from int64 overflow; arrays are far smaller than 2^50 bytes.
const maxFuzzOff = 1 << 50

// FuzzExtents proves, for any geometry and request, that Extents tiles [off, off+n) exactly,
// one piece per chunk touched, each consistent with Map, never on the stripe's parity member.
func FuzzExtents(f *testing.F) {
	// members, chunk exponent (chunk = 4 KiB << exp), algorithm, off, n
	f.Add(uint8(0), uint8(0), uint8(0), uint64(0), uint64(0))
	f.Add(uint8(0), uint8(0), uint8(0), uint64(0), uint64(1))
	f.Add(uint8(1), uint8(2), uint8(2), uint64(16<<10-1), uint64(2))
	f.Add(uint8(1), uint8(2), uint8(2), uint64(48<<10), uint64(48<<10))
	f.Add(uint8(2), uint8(4), uint8(3), uint64(3*(64<<10)-512), uint64(5*(64<<10)+1024))
	f.Add(uint8(29), uint8(10), uint8(1), uint64(1<<40+7), uint64(100<<20))
	f.Add(uint8(29), uint8(0), uint8(2), uint64(31*4096*5-1), uint64(31*4096*3+2))
	f.Add(uint8(255), uint8(255), uint8(255), uint64(1<<63), uint64(1<<63))
	f.Fuzz(func(t *testing.T, m, exp, a uint8, off, n uint64) {
		members := MinMembers + int(m)%(MaxMembers-MinMembers+1)
		chunk := int64(MinChunk) << (exp % 11) // 4 KiB .. 4 MiB
		alg := Algorithm(a % 4)
		l, err := NewLayout(members, chunk, alg)
		if err != nil {
			t.Fatalf("NewLayout(%d, %d, %v): %v", members, chunk, alg, err)
		}
		o := int64(off % maxFuzzOff)
		// Up to three stripes and a bit: at most 3·31+2 extents, however small the chunk.
		ln := int64(n % uint64(3*l.StripeSize()+2*chunk+1))
		checkExtents(t, l, o, ln)
	})
}

func checkExtents(t *testing.T, l Layout, off, n int64) {
	t.Helper()
	chunk := l.ChunkSize()
	ext := l.Extents(nil, off, n)
	if n == 0 {
		if len(ext) != 0 {
			t.Fatalf("%v: Extents(%d, 0) = %+v, want none", l, off, ext)
		}
		return
	}
	first, last := off/chunk, (off+n-1)/chunk
	if int64(len(ext)) != last-first+1 {
		t.Fatalf("%+v: Extents(%d, %d) has %d pieces, the request touches %d chunks", l, off, n, len(ext), last-first+1)
	}
	var next int64
	for i, e := range ext {
		a := off + e.BufOff // array offset of the piece
		switch {
		case e.BufOff != next:
			t.Fatalf("%+v: extent %d BufOff %d, want %d (contiguous)", l, i, e.BufOff, next)
		case e.Len <= 0:
			t.Fatalf("%+v: extent %d Len %d", l, i, e.Len)
		case a%chunk+e.Len > chunk:
			t.Fatalf("%+v: extent %d [%d, %d) crosses a chunk boundary", l, i, a, a+e.Len)
		case i > 0 && a%chunk != 0:
			t.Fatalf("%+v: extent %d starts mid-chunk at %d", l, i, a)
		case i < len(ext)-1 && (a+e.Len)%chunk != 0:
			t.Fatalf("%+v: extent %d ends mid-chunk at %d", l, i, a+e.Len)
		}
		next += e.Len
		loc := l.Map(a)
		if loc.Stripe != e.Stripe || loc.Data != e.Data || loc.Member != e.Member || loc.MemberOff != e.MemberOff {
			t.Fatalf("%+v: extent %d %+v disagrees with Map(%d) = %+v", l, i, e, a, loc)
		}
		end := l.Map(a + e.Len - 1)
		if end.Stripe != e.Stripe || end.Data != e.Data || end.Member != e.Member || end.MemberOff != e.MemberOff+e.Len-1 {
			t.Fatalf("%+v: extent %d %+v: its last byte maps to %+v", l, i, e, end)
		}
		if e.Member == l.ParityMember(e.Stripe) || e.Member == loc.Parity {
			t.Fatalf("%+v: extent %d %+v names the parity member %d", l, i, e, loc.Parity)
		}
		if m := l.DataMember(e.Stripe, e.Data); e.Member != m {
			t.Fatalf("%+v: extent %d %+v: DataMember(%d, %d) = %d", l, i, e, e.Stripe, e.Data, m)
		}
		if d := l.DataIndex(e.Stripe, e.Member); d != e.Data {
			t.Fatalf("%+v: extent %d %+v: DataIndex = %d", l, i, e, d)
		}
		// Member offset and array offset describe the same byte: stripe s, data index d,
		// byte k of the chunk is array byte (s·(N-1)+d)·chunk + k and member byte s·chunk + k.
		if e.MemberOff/chunk != e.Stripe || (e.Stripe*int64(l.DataMembers())+int64(e.Data))*chunk+e.MemberOff%chunk != a {
			t.Fatalf("%+v: extent %d %+v is not array offset %d", l, i, e, a)
		}
	}
	if next != n {
		t.Fatalf("%+v: extents cover %d bytes, want %d", l, next, n)
	}
}
