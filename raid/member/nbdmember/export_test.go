package nbdmember

// MaskFlags clears transmission flags the server advertised, as a server that lacks them
// would: the tests of the fallbacks (FUA, WRITE_ZEROES, FLUSH) use it.
func (m *Member) MaskFlags(f uint16) { m.flags &^= f }
