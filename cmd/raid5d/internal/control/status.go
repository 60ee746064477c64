package control

import "time"

// Member states (MemberStatus.State), as the array reports them.
const (
	StateActive     = "active"
	StateFaulty     = "faulty"
	StateSpare      = "spare"
	StateRebuilding = "rebuilding"
)

// Status is the running array as the daemon reports it; it is also the JSON that
// `raid5d status --json` prints.
type Status struct {
	// Source is "online" (a daemon answered) or "offline" (read from the members' superblocks);
	// the client sets it, the daemon leaves it empty.
	Source   string `json:"source,omitempty"`
	Daemon   Daemon `json:"daemon"`
	UUID     string `json:"uuid"`
	State    string `json:"state"` // clean, active, degraded, failed
	Dirty    bool   `json:"dirty"`
	Unclean  bool   `json:"unclean"` // assembled after an unclean shutdown
	Events   uint64 `json:"events"`
	Size     int64  `json:"size"` // bytes
	Level    int    `json:"level"`
	Disks    int    `json:"raid_disks"` // roles
	Chunk    int64  `json:"chunk"`
	Layout   string `json:"layout"`
	ReadOnly bool   `json:"read_only"`

	Members []MemberStatus `json:"members"` // by role, then faulty members and spares
	Missing []int          `json:"missing"` // roles with no working member

	Sync       *Progress `json:"sync,omitempty"`        // the rebuild, resync or scrub running now
	LastScrub  *Progress `json:"last_scrub,omitempty"`  // the last finished or stopped scrub
	LastResync *Progress `json:"last_resync,omitempty"` // the resync after an unclean shutdown, when it ended
	// LastRebuild: the last finished or stopped rebuild or re-add (ReAdd, Resynced).
	LastRebuild *Progress `json:"last_rebuild,omitempty"`

	// WriteHole: the array was assembled dirty and degraded, so parity of stripes being written
	// at the crash cannot be made consistent and the missing member's chunks there may be wrong.
	WriteHole bool `json:"write_hole"`
	// DirtyDegraded, offline only: serve refuses these members as they are (raid.ErrDirtyDegraded):
	// the array was not shut down cleanly, a role has no member, and stripes were being
	// written at the crash (write-intent regions set, or no bitmap), so their parity may be
	// torn and the missing member's chunks there cannot be rebuilt (the write hole). Until
	// the member is back, or with serve --force or --read-only. AtRisk is those array bytes.
	DirtyDegraded bool    `json:"dirty_degraded,omitempty"`
	AtRisk        []Range `json:"at_risk,omitempty"`
	// AutoReAdd: the away members serve --auto-re-add probes; absent without it.
	AutoReAdd *AutoReAdd `json:"auto_re_add,omitempty"`
	// SuperblocksBusy: a superblock update was under way (held up by a slow member, up to the
	// member timeout), so Events and the member list are from just before it.
	SuperblocksBusy bool    `json:"superblocks_busy,omitempty"`
	Bitmap          *Bitmap `json:"bitmap,omitempty"` // the write-intent bitmap, if the array has one
	// Consistency is the crash-consistency policy: bitmap, none or journal.
	Consistency string   `json:"consistency"`
	Journal     *Journal `json:"journal,omitempty"` // the write journal, with the journal policy

	SyncSpeedMin int64 `json:"sync_speed_min"` // bytes/s
	SyncSpeedMax int64 `json:"sync_speed_max"` // bytes/s

	Counters Counters `json:"counters"`
}

// Range is a span of array bytes.
type Range struct {
	Off int64 `json:"offset"`
	Len int64 `json:"length"`
}

// Bitmap is the write-intent bitmap's state.
type Bitmap struct {
	RegionBytes int64  `json:"region_bytes"` // array bytes per bit
	Regions     int    `json:"regions"`      // bits
	Set         int    `json:"set"`          // bits set now
	Flushes     uint64 `json:"flushes"`      // bitmap writes
	Waits       uint64 `json:"waits"`        // stripe writes that waited for one
}

// Journal is the write journal's state.
type Journal struct {
	Path        string `json:"path"`
	Size        int64  `json:"size"`        // ring bytes
	Used        int64  `json:"used"`        // ring bytes not yet reclaimed by a checkpoint
	Records     uint64 `json:"records"`     // records logged since assembly
	Commits     uint64 `json:"commits"`     // journal writes (one write and sync per group of records)
	Checkpoints uint64 `json:"checkpoints"` // members synced and the journal's tail moved
	FullWaits   uint64 `json:"full_waits"`  // writes that waited for a checkpoint because the ring was full
	Replayed    int    `json:"replayed"`    // records replayed at assembly
	Missing     bool   `json:"missing"`     // journal not found: assembled read-only
}

// Daemon says which daemon answered.
type Daemon struct {
	PID     int       `json:"pid"`
	Version string    `json:"version"`
	Export  string    `json:"export"`
	Address string    `json:"address"` // where it serves NBD
	Started time.Time `json:"started"`
}

// MemberStatus is one member of the running array.
type MemberStatus struct {
	Path        string `json:"path"`
	Role        int    `json:"role"`  // the role it holds or is rebuilt into; -1 for an idle spare
	State       string `json:"state"` // active, faulty, spare, rebuilding
	Events      uint64 `json:"events"`
	Device      string `json:"device_uuid"`
	ReadErrors  uint64 `json:"read_errors"`
	WriteErrors uint64 `json:"write_errors"`
	// Direct: opened with O_DIRECT (serve --direct), not through the page cache; false for a
	// remote member and in an offline report.
	Direct bool `json:"direct"`
	// Remote is a remote member's server and link; absent for local members.
	Remote *Remote `json:"remote,omitempty"`
}

// Remote is what a remote member (an NBD export) says of its server and its link.
type Remote struct {
	Kind           string   `json:"kind"`   // nbd
	State          string   `json:"state"`  // connected, reconnecting, down
	Export         string   `json:"export"` // the export's name on its server, as the URI asks for it ("": the default)
	Flags          []string `json:"flags"`  // the server's transmission flags: flush, fua, trim, write_zeroes, multi_conn, ...
	MinBlock       int64    `json:"min_block"`
	PreferredBlock int64    `json:"preferred_block"`
	MaxBlock       int64    `json:"max_block"`
	Connections    int      `json:"connections"`
	Reconnects     uint64   `json:"reconnects"`
	InFlight       int64    `json:"in_flight"`       // requests sent and not yet answered
	Requests       uint64   `json:"requests"`        // answered since the member was opened
	Errors         uint64   `json:"request_errors"`  // of them, failed
	RequestSeconds float64  `json:"request_seconds"` // their total time
	Latency        Latency  `json:"latency"`         // over the last interval (about 10 s)
	// ServerName is the name the server reports for the export (NBD_INFO_NAME: its canonical
	// name, also of the default export ""); absent where the server sends none.
	ServerName string `json:"server_name,omitempty"`
}

// Latency is how long a remote member's requests took over an interval.
type Latency struct {
	WindowSeconds float64 `json:"window_seconds"` // how long the interval was
	Requests      uint64  `json:"requests"`       // answered in it
	MeanSeconds   float64 `json:"mean_seconds"`
	MaxSeconds    float64 `json:"max_seconds"`
}

// AutoReAdd is serve --auto-re-add at work: the away remote members it probes.
type AutoReAdd struct {
	Members []AutoReAddMember `json:"members"`
}

// AutoReAddMember is one away member that --auto-re-add probes.
type AutoReAddMember struct {
	Member string     `json:"member"`
	Probes int        `json:"probes"`
	Next   *time.Time `json:"next,omitempty"`  // the next probe; absent when refused
	Error  string     `json:"error,omitempty"` // why the last probe did not re-add it
	// Refused: it answered but cannot be re-added (another array's, stale beyond the
	// bitmap, its role taken): no longer probed, left to the operator.
	Refused bool `json:"refused"`
}

// Progress is a rebuild or scrub, running or finished.
type Progress struct {
	Kind        string  `json:"kind"` // rebuild, check or repair
	Role        int     `json:"role"` // rebuild: the role being rebuilt; -1 otherwise
	Done        int64   `json:"done"` // bytes of member data area
	Total       int64   `json:"total"`
	BytesPerSec float64 `json:"bytes_per_sec"`
	ETASeconds  float64 `json:"eta_seconds"`
	Mismatches  int64   `json:"mismatches"`            // check/repair: stripes whose parity did not match
	MismatchAt  []int64 `json:"mismatch_at,omitempty"` // the first (at most 100) such stripes
	Resumed     int64   `json:"resumed"`               // rebuild: the checkpoint it resumed from (bytes), 0 if none
	ReAdd       bool    `json:"re_add,omitempty"`      // rebuild: a re-add's (only the bitmap's regions are resynced)
	Resynced    int64   `json:"resynced"`              // rebuild: bytes written onto the member so far
	Err         string  `json:"error,omitempty"`       // why it stopped early, if it did
}

// Percent is Done as a percentage of Total (0 when Total is 0).
func (p *Progress) Percent() float64 {
	if p.Total <= 0 {
		return 0
	}
	return 100 * float64(p.Done) / float64(p.Total)
}

// Counters are the array's cumulative I/O counters.
type Counters struct {
	FullStripeWrites   uint64 `json:"full_stripe_writes"`
	RMWWrites          uint64 `json:"rmw_writes"`
	RCWWrites          uint64 `json:"rcw_writes"`
	MemberBytesRead    uint64 `json:"member_bytes_read"`
	MappedBytesRead    uint64 `json:"mapped_bytes_read"` // of MemberBytesRead, sent from the members' mappings
	MemberBytesWritten uint64 `json:"member_bytes_written"`
	MappedBytesWritten uint64 `json:"mapped_bytes_written"` // of MemberBytesWritten, copied into the members' mappings
	PlacedBytes        uint64 `json:"placed_bytes"`         // client bytes read from the socket straight into the members
	CopiedBytes        uint64 `json:"bytes_copied"`
	CacheHits          uint64 `json:"cache_hits"`
	CacheMisses        uint64 `json:"cache_misses"`
	CacheEvictions     uint64 `json:"cache_evictions"`
	WriteThroughs      uint64 `json:"write_throughs"`
	CacheStripes       int    `json:"cache_stripes"`
}
