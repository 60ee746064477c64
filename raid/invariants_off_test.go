//go:build !invariants

package raid_test

const invariantsEnabled = false // see invariants_on_test.go
