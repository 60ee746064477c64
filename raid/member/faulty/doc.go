// Package faulty is fault injection for members, in the manner of pebble's errorfs: a Member
// wraps any member.Member and fails, drops or delays the operations its Faults select, and a
// Volatile keeps writes in memory until Sync, so that killing the process — or, in-process,
// PowerCut — loses what a power cut would. Register makes them member kinds, faulty: and volatile:, which the daemon
// accepts wherever a member path goes; raid/raidtest uses the same types in-process. It is a
// testing aid, never a way to run an array.
//
// # Specs
//
// Once Register has run, member.Open (and so raid.OpenMember, Create, Assemble, AddSpare, a
// journal path and raid5d's command line) accepts a member spec, locked like PATH itself,
//
//	faulty:PATH?key=value&key=value...
//	volatile:PATH?key=value&...     (short for faulty:PATH?volatile&key=value&...)
//
// that opens PATH wrapped in fault injection, in the spirit of md's faulty personality and
// dm-flakey. It is a testing aid; its Name is PATH (member.SpecPath finds it, member.MapSpecPath
// rewrites it: the command line makes it absolute, a configuration file resolves it from its
// directory). A spec without a PATH, an unknown key or a bad value is an error naming the
// spec; a PATH that does not exist is fs.ErrNotExist, a missing member, as for a plain path.
// Keys (repeatable where it makes sense):
//
//	rfail=OFF+LEN  reads touching member bytes [OFF, OFF+LEN) fail with EIO
//	wfail=OFF+LEN  writes touching the range fail with EIO
//	drop=OFF+LEN   writes touching the range report success and write nothing
//	               (OFF and LEN take K, M, G, T suffixes, powers of 1024; "all" means the
//	               data area, from Register's dataOffset (raid.DataOffset, 1 MiB) to the
//	               end, so superblocks stay readable)
//	after=N        the first N operations matching a fault succeed (one count for all
//	               the spec's faults)
//	delay=DUR      every read and write first sleeps DUR (Go duration: 10ms); with ctl,
//	               only while FILE exists (a member that starts hanging after assembly)
//	ctl=FILE       faults (and delay) fire only while FILE exists: create or remove it to
//	               switch a running daemon's member between failing and working
//	volatile       writes and trims stay in the process's memory, in 4 KiB pages, until the
//	               member is synced; the sync writes them to PATH in a random order, then
//	               fdatasyncs. Killing the daemon (SIGKILL) then loses what a power cut would:
//	               everything unsynced, and any subset of a sync in progress
//	               (test/e2e_powercut_test.go). The volatile: spelling implies it (and
//	               refuses the key)
//
// For example faulty:/dev/shm/m1.img?wfail=all&ctl=/tmp/fail-m1 behaves until
// /tmp/fail-m1 is created, then fails every data write (and the array marks it faulty).
// In-process tests build the same wrappers directly: New and Member.Inject (Fault, with a
// count of its own per fault), SetDelay, SetHook, Count; NewVolatile (raidtest re-exports them).
//
// # Errors
//
// ErrInjected (errno EIO) from an injected fault; ErrClosed from a Volatile after Close,
// ErrPoweredOff between PowerCut and Reopen. A
// malformed spec is an error starting "faulty: member spec".
package faulty
