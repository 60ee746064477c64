package nbdmember

// MaskFlags clears transmission flags the server advertised, as a server that lacks them
// would: the tests of the fallbacks (FUA, WRITE_ZEROES, FLUSH) use it.
func (m *Member) MaskFlags(f uint16) { m.flags &^= f }

// MaskServerFlags clears f from every handshake's flags from now on (Open's and reconnects'),
// until the function it returns is called.
func MaskServerFlags(f uint16) (restore func()) {
	testHookMaskFlags = f
	return func() { testHookMaskFlags = 0 }
}

// Reconnects is how many times m has reconnected.
func Reconnects(m *Member) int64 { return m.reconnects.Load() }

// Conns is how many connections m's current generation has.
func Conns(m *Member) int { return len(m.cur.Load().list()) }
