// Package member is the disks of an array as the raid package sees them: the Member interface
// and its contract, the optional capabilities a member may have, the file and block-device
// member (File), and the registry of member kinds by spec prefix (Register, Open).
//
// # Contract
//
// A Member is io.ReaderAt and io.WriterAt with three differences that the array relies on
// (the Member doc says them in full): ReadAt returns len(p) bytes or an error, never a short
// count that the caller would fill with zeroes (ReadFull and Readv turn one into
// ErrShortRead); Trim leaves zeroes; Size is fixed while the member is open. Every method may
// be called concurrently and none keeps the caller's buffer.
//
// # Capabilities
//
// A member may do more than Member says, in small interfaces the array finds by type
// assertion, each with a helper or a path that does without it: Vectored (Readv, Writev:
// one call per buffer without it), DSyncWriter (one durable write; else WriteAt and Sync),
// SizeChecker (SyncData: no check without it), Mapper (mapped reads; else ReadAt),
// HoleFinder (block status; else all data) and Wrapper (Base). File has all but Wrapper.
// Reporter (report.go) is for people rather than I/O: a remote member's server, link and
// latency, which the array's Status carries (found under wrappers) and status and the
// metrics show.
//
// # Kinds
//
// A member spec is a plain path (a file or block device: OpenFile) or starts with the prefix
// of a registered kind. Open, SpecPath and MapSpecPath dispatch on it, and the raid package
// opens every member, spare and journal through Open, so it knows no kind but plain paths
// and imports none. raid/member/faulty is one kind (faulty:PATH?..., volatile:PATH) and
// raid/member/nbdmember another (NBD exports: nbd://, nbds://, nbd+unix://, nbds+unix://);
// cmd/raid5d registers both.
//
// A spec of the form scheme://... that no registered kind's prefix starts is never a path:
// Open and MapSpecPath refuse it with an *UnknownKindError (ErrUnknownKind) naming it and the
// registered kinds, so a typo'd URI fails the assembly instead of being counted as a missing
// member (fs.ErrNotExist), and SpecPath is "" for it (no file is made).
//
// A new kind is one package, registered from cmd/raid5d; raid/member/nbdmember is the model:
//
//	// Register registers the kind for Prefixes (nbd://, nbds://, nbd+unix://, nbds+unix://).
//	// opts is called at every Open, so that a command sets the options from its flags after
//	// it has parsed them.
//	func Register(opts func() Options) {
//		k := member.Kind{Open: func(spec string, use member.Use) (member.Member, error) {
//			m, err := Open(spec, use, opts()) // parses the URI and its query keys
//			if err != nil {
//				return nil, err // not a nil *Member in a Member
//			}
//			return m, nil
//		}}
//		for _, p := range Prefixes {
//			member.Register(p, k)
//		}
//	}
//
// and cmd/raid5d (kinds.go) calls nbdmember.Register once, from init, with a function that
// returns the options its flags set. Options the kind takes are bound into its Open that
// way; per-member ones come from the spec (URI query keys). Its members' Name is the spec
// (the URI: what status shows and the configuration records), Size what the export says,
// and it keeps the Member contract: a short answer is an error, Trim leaves zeroes
// (WRITE_ZEROES where offered, else written zeroes), Sync is FLUSH, and a member that
// disappears mid-call returns an error within its deadline rather than hanging. It may add
// capabilities (nbdmember has DSyncWriter, as FUA or WRITE+FLUSH); it has no local file, so
// Kind.Path stays nil (SpecPath "": no lock, no file to make or compare), its MapPath maps
// only the local paths in the URI's query (socket=, tls-certificates=), and Use only says
// read-write or read-only.
//
// # Exclusive use
//
// OpenFile takes a flock(2) lock on the file or device node for as long as the member is
// open: exclusive for Exclusive, shared for Shared, none for Inspect; a block device opened
// Exclusive is opened with O_EXCL too. A member in use is ErrBusy in a *BusyError that names
// the holder. exclusive.go says why flock and not fcntl locks; raid's doc.go # Exclusive use
// says what the array does with it.
//
// # Direct I/O
//
// OpenFile opens members with O_DIRECT as SetDirect says (DirectAuto, the default: block
// devices; DirectOn: files too; DirectOff: none), bypassing the page cache. Direct I/O needs
// the memory, offset and length of every call aligned to the member's block: STATX_DIOALIGN's
// memory and offset alignments (the larger), else a block device's logical block size
// (BLKSSZGET), else 4096 (File.Direct says which). A call that is aligned goes to the device as
// it is; any other is carried through a bounce buffer (direct.go): the aligned blocks around
// its range are read into one, the bytes copied, and for a write the whole blocks written back,
// a block written only in part under a lock so that two such writes to one block cannot undo
// each other. So no call fails for its alignment (EINVAL); File.Bounced counts the ones that
// were bounced, and the array's own buffers (internal/aligned) are aligned so that only odd
// requests are. Sync is fdatasync as before: it also flushes a device's write cache. A direct
// member has no Mapping (mapped reads read the page cache it bypasses). Under DirectAuto a
// device that refuses O_DIRECT is used through the page cache; under DirectOn a file that
// cannot do direct I/O is ErrNoDirect.
//
// # Errors
//
// ErrShortRead and ErrShrunk (I/O, errno EIO) and ErrBusy and ErrNoDirect (opening). The raid package
// re-exports them as raid.ErrShortRead, raid.ErrMemberShrunk and raid.ErrMemberBusy, and
// its MemberError wraps them with the member's name and role.
package member
