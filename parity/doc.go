// Package parity is raid5d's parity math: computing P for a stripe, rebuilding one missing
// chunk, folding a read-modify-write delta into P, and verifying a stripe.
//
// # Format
//
// P is the plain XOR of the data chunks, byte for byte, exactly as Linux md's RAID-5 writes it.
// The Coder builds klauspost/reedsolomon with WithFastOneParityMatrix, whose single parity row
// is all ones, i.e. XOR. Encode and Reconstruct fold chunks together with crypto/subtle.XORBytes
// and the library's EncodeIdx (its vector XOR); Update and Verify use crypto/subtle.XORBytes.
// None of them allocates: the library's one-pass Encode allocates on every call, so it is not
// used (see xorAll).
//
// # Concurrency
//
// A Coder is immutable after New; all its methods may be called concurrently. Nothing here
// performs I/O, starts goroutines or keeps a reference to a caller's slice.
package parity
