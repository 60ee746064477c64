module github.com/raid5d/raid5d

go 1.26.0

require (
	github.com/klauspost/reedsolomon v1.14.2
	github.com/pojntfx/go-nbd v0.3.2
	golang.org/x/sys v0.50.0
)

require github.com/klauspost/cpuid/v2 v2.3.0 // indirect
