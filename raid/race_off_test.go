//go:build !race

package raid_test

const raceEnabled = false // see race_on_test.go
