// Package loadgen is the engine of `raid5d bench`: a load generator that can prove every byte
// it wrote, and check a device after a crash against a log of what it wrote.
//
// # Data
//
// A Pool of incompressible bytes (PCG) is filled once at start. Every 4 KiB unit written (every
// block, for blocks below 4 KiB) starts with a 32-byte header — magic, generation, device
// offset, seed, writer — ending in a CRC-32C of the whole unit (see header.go). Each worker
// owns a region of the pool and sends its writes straight from it, rotating through the region
// and rewriting only the headers in place; the CRC of every unit's payload is precomputed, so a
// 4 KiB write costs a header and a 28-byte CRC update (BenchmarkStamp: ~16 ns per 4 KiB on
// this machine's 2 cores, against ~180 ns to verify a unit read back, BenchmarkVerify). This is
// lesson 3 of the design: the generator must never be the bottleneck.
//
// # Generations and verification
//
// With Verify or a VerifyLog, every block has a generation (its number of writes this run) and
// at most one request in flight: a worker claims a block (an atomic flag) before its I/O and
// releases it after, so a read of a block knows exactly which generation it must find. A
// writing run with Verify then reads the region back.
//
// # The verify log and Check
//
// With VerifyLog, Run first reads the region and records a CRC per unit (the baseline), then
// logs each write before sending it (in the kernel before the request is on the wire), each
// acknowledgement, and each FLUSH sent and acknowledged, fsync'ing the log after each
// acknowledged FLUSH (see vlog.go). ReadLog replays it into, per block, the highest generation
// known durable (acknowledged with FUA, or acknowledged before an acknowledged FLUSH — on any
// connection when the server advertises CAN_MULTI_CONN, else on the same one) and the highest
// generation sent. Check then reads the device back and accepts, per unit: the durable
// generation or a later one sent; any generation sent, or the baseline, when none is durable;
// the baseline for blocks never written.
//
// # Concurrency
//
// Run starts Jobs × IODepth worker goroutines (one Device per job, called IODepth at a time)
// and a progress ticker, and waits for all of them before it returns. Check starts iodepth
// readers and waits for them.
//
// # Caveats
//
// Units are assumed atomic: a device that tears a 4 KiB unit in a crash fails Check with a
// checksum mismatch, which is the intended verdict for a RAID that must not tear sectors. Two
// runs with the same seed can be confused for each other on a block (the default seed is random).
// A verify log costs one write(2) per I/O; use it for crash tests, not for peak numbers.
package loadgen
