//go:build invariants

package raid_test

// invariantsEnabled: under the invariants build tag the stripe cache checks each stripe's parity
// after writing it and panics on a mismatch, so tests that show stale parity on purpose skip.
const invariantsEnabled = true
