// Package parity is raid5d's parity math: computing P for a stripe, rebuilding one missing
// chunk, folding a read-modify-write delta into P, and verifying a stripe.
//
// # Format
//
// P is the plain XOR of the data chunks, byte for byte, exactly as Linux md's RAID-5 writes it.
// Encoding runs on klauspost/reedsolomon with WithFastOneParityMatrix (whose single parity row
// is all ones, i.e. XOR); the single-chunk paths (rebuild, update) use crypto/subtle.XORBytes.
//
// # Concurrency
//
// A Coder is immutable after New; all its methods may be called concurrently. Nothing here
// performs I/O, starts goroutines or keeps a reference to a caller's slice.
package parity
