package member

// Test hooks for the external tests.

// Remap's bound on a mapping's page tables (mapped.go).
const (
	PtRegion     = ptRegion
	RemapRegions = remapRegions
)

// Remaps returns how many times Touch has replaced m's mapping.
func Remaps(m *File) uint64 { return m.remaps.Load() }
