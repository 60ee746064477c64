// Package parity is raid5d's parity math: computing P for a stripe, rebuilding one missing
// chunk, folding a read-modify-write delta into P, and verifying a stripe.
//
// # Format
//
// P is the plain XOR of the data chunks, byte for byte, exactly as Linux md's RAID-5 writes it.
// Every operation is one XOR of several chunks into one (xorInto): on amd64 with AVX2 a small
// assembly kernel (xor_amd64.s) that loads every source byte once and stores every result
// byte once, 256 bytes at a time; elsewhere, and for tails shorter than 256 bytes,
// crypto/subtle.XORBytes folds the sources in pairs. Nothing allocates.
//
// # Concurrency
//
// A Coder is immutable after New; all its methods may be called concurrently. Nothing here
// performs I/O, starts goroutines or keeps a reference to a caller's slice.
package parity
