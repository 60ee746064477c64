package member

import "time"

// Reporter is a Member that says how it is doing beyond what the array counts itself: a remote
// member (raid/member/nbdmember) reports its server, its connections and the latency of its
// requests. The array's Status carries the Report of every member that has it, and status and
// the metrics show it, so that neither knows the kind. Report may be called at any time and
// concurrently with I/O, also on a member that failed; it reads counters and never waits for
// the member. Unlike the I/O capabilities it is looked up under wrappers (Base): reporting
// bypasses no fault injection.
type Reporter interface {
	Report() Report
}

// Report is what a Reporter says of itself, in terms any kind of remote member can fill in.
// A field the kind has nothing for stays zero.
type Report struct {
	// Kind is the member's kind, short ("nbd").
	Kind string
	// State is the link to the server as the kind sees it: LinkConnected, LinkReconnecting or
	// LinkDown.
	State string
	// Server is the name the member asks the server for (an NBD URI's export name; "" is the
	// server's default); Features what the server offers for it, in the kind's words (NBD's
	// transmission flags: flush, fua, trim, ...).
	Server   string
	Features []string
	// ServerName is the name the server itself reports for it (NBD_INFO_NAME: the export's
	// canonical name, also of the default export), "" where the server sends none.
	ServerName string
	// MinBlock, PreferredBlock and MaxBlock are the server's block sizes in bytes.
	MinBlock, PreferredBlock, MaxBlock int64
	// Conns is the number of connections open now; Reconnects how many times one was
	// re-established since the member was opened.
	Conns      int
	Reconnects uint64
	// InFlight is the number of requests sent (or waiting to be) and not yet answered.
	InFlight int64
	// Requests counts the requests answered since the member was opened, Errors those of
	// them that failed, and RequestTime their total time: RequestTime/Requests is the mean
	// latency since then, and two reports give it over the time between them.
	Requests, Errors uint64
	RequestTime      time.Duration
	// Latency is over the last interval of about LatencyWindow.
	Latency Latency
	// WriteBatches counts the system calls that sent requests, RequestsWritten the requests
	// they carried; ReplyReads the reads from the sockets, Replies the replies they carried
	// (all connections since the member was opened). Few requests or replies per system
	// call with many in flight is the unbatched mode of README's issue 17.
	WriteBatches, RequestsWritten uint64
	ReplyReads, Replies           uint64
}

// Latency is how long requests took over an interval.
type Latency struct {
	// Window is how long the interval was: the last one that ended (about LatencyWindow;
	// longer when no request and no report came at its end), or, before the first has
	// ended, the first so far.
	Window time.Duration
	// Requests answered in it, their mean time and the longest. Mean and Max are 0 when
	// Requests is 0.
	Requests  uint64
	Mean, Max time.Duration
}

// LatencyWindow is the interval a Report's Latency is meant to cover.
const LatencyWindow = 10 * time.Second

// The link states of Report.State.
const (
	LinkConnected    = "connected"    // requests are served
	LinkReconnecting = "reconnecting" // the connection broke; it is being re-established
	LinkDown         = "down"         // no connection, and none is being made: requests fail
)
