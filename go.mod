module github.com/raid5d/raid5d

go 1.26.0

require (
	github.com/klauspost/cpuid/v2 v2.3.0 // indirect
	github.com/klauspost/reedsolomon v1.14.2 // indirect
	github.com/pojntfx/go-nbd v0.3.2 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
