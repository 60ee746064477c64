//go:build !race

package cache

const raceEnabled = false // see race_on_test.go
