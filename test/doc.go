// Package test holds raid5d's end-to-end tests: TestMain builds the real binary once, and each
// test makes its own array of sparse member files in a temporary directory, serves it on a unix
// socket and drives it with real NBD clients (nbdinfo, qemu-io, fio's nbd engine, nbdfuse with a
// loop device, ext4 and mount) and with a hand-written wire client for malformed traffic.
//
// There is no code here outside the _test.go files; this file only documents the package.
//
// # Environment
//
//   - RAID5D_REQUIRE_TOOLS=1 turns every "tool missing" or "not root" skip into a failure. CI
//     sets it (the Makefile passes it through when CI is set).
//   - RAID5D_E2E_BIN=/path/to/raid5d runs the tests against that binary instead of building
//     ./cmd/raid5d (a release build, or a binary built with other flags).
//   - RAID5D_E2E_STANDIN=nbdkit is a developer aid: instead of building and serving raid5d, the
//     tests serve the array's data from `nbdkit file` (with the blocksize-policy filter, so it
//     advertises the same block sizes). It proves the harness and the client flows without the
//     daemon; raid5d-only checks (create, status, degraded members, log lines) are skipped or
//     logged, never passed silently.
//
// # Hosts
//
// The tests of members on other hosts (e2e_netns_test.go) run in a lab of network namespaces
// made with ip(8) from iproute2 (netns_test.go): a host per member running nbdkit or
// nbd-server on its file, the raid5d host, and a client host running fio, qemu-io, raid5d
// bench or nbdfuse (under nsenter --net, so that its FUSE mount is the test's), joined by veth pairs in 10.157.0.0/16 (traffic stays in the lab's namespaces). They
// need root (CAP_SYS_ADMIN) and skip without it (fail under RAID5D_REQUIRE_TOOLS=1). A test
// removes every namespace and veth it made and stops every process it started there, by PID;
// the namespaces of a test binary that died before its cleanups (a -timeout) are removed by
// the next one. RAID5D_CRASH_ROUNDS also sets TestNetnsCrashLoop's rounds (4).
//
// # Time and size
//
// Arrays are four 64 MiB sparse members with 64 KiB chunks (189 MiB of data); fio jobs write
// 16 MiB per job and carry a runtime bound. The whole package is meant to finish in a few
// minutes on two cores.
package test
