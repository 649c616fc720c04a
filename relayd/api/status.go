package api

import "time"

// Status is the daemon's answer to GET /v1/status (kl-ctl status).
type Status struct {
	Ready      bool        `json:"ready"`
	StartedAt  time.Time   `json:"startedAt"`
	Rules      RulesStatus `json:"rules"`
	Workloads  int         `json:"workloads"`
	Flows      FlowStats   `json:"flows"`
	FDs        int         `json:"fds"`     // open file descriptors of the daemon
	FDLimit    uint64      `json:"fdLimit"` // its RLIMIT_NOFILE soft limit
	Goroutines int         `json:"goroutines"`
	Hits       []RuleHit   `json:"hits,omitempty"` // decisions per rule and dimension (rule 0: the default, the guard or a script) since HitsSince
	// HitsSince is when the counts of Hits and KernelHits started: the load of the rules
	// whose numbers they use (counts of earlier rules would name other rules).
	HitsSince time.Time  `json:"hitsSince,omitzero"`
	Recent    []Decision `json:"recent,omitempty"` // the most recent decision records, oldest first
	// FastPath says whether the kernel fast path is on; Kernel is its state per
	// transparent workload, by id; KernelHits counts the flows it decided per rule (they
	// are in Hits too).
	FastPath   bool           `json:"fastPath"`
	Kernel     []KernelStatus `json:"kernel,omitempty"`
	KernelHits []RuleHit      `json:"kernelHits,omitempty"`
	// Attach lists the live `kl-ctl attach` sessions that carry `client` flows; nil when
	// the attach listener is off.
	Attach []AttachSession `json:"attach,omitempty"`
	// Audit is the audit file's health; nil from a daemon that predates it.
	Audit *AuditStatus `json:"audit,omitempty"`
}

// AuditStatus says how many decision records never reached the audit file, and why the
// file is failing now, if it is. Every record still counts in Hits and Recent.
type AuditStatus struct {
	Path    string `json:"path,omitempty"`  // the audit file; empty when records are kept in memory only
	Dropped uint64 `json:"dropped"`         // records not written to the file since the daemon started
	Error   string `json:"error,omitempty"` // the write failure going on, if any (cleared once a write succeeds)
}

// AttachSession is one live attach session: who holds it, for which workloads, and what
// it has carried.
type AttachSession struct {
	ID         string    `json:"id"`
	Credential string    `json:"credential"`       // the credential's name in the daemon's attach settings
	Client     string    `json:"client,omitempty"` // what the client says it is (kl-ctl version, host)
	Remote     string    `json:"remote"`           // the session's remote address
	Scope      string    `json:"scope"`            // the workloads it may carry
	Since      time.Time `json:"since"`
	Policy     string    `json:"policy"` // hash of the policy it holds
	Flows      uint64    `json:"flows"`
	Refused    uint64    `json:"refused"`
}

// KernelStatus is how much of one workload's policy its own nftables table decides (the
// kernel fast path): flows those entries match are decided, and audited, without the relay.
type KernelStatus struct {
	ID            string   `json:"id"`
	Share         float64  `json:"kernelShare"`   // fraction of the plan's entries the kernel decides
	Entries       int      `json:"entries"`       // plan entries (the metadata guard excluded)
	KernelEntries int      `json:"kernelEntries"` // of which the kernel decides
	AllKernel     bool     `json:"allKernel"`     // no flow of the workload reaches the relay
	Flows         uint64   `json:"kernelFlows"`   // kernel-decided flows recorded
	Lost          uint64   `json:"lostEvents"`    // conntrack event socket failures (the watcher reopened it; events may be lost)
	Overruns      uint64   `json:"eventOverruns"` // event socket overruns (the kernel resends the NEW events: late, not lost)
	Late          uint64   `json:"lateRecords"`   // records made from a DESTROY event (the NEW one could not be delivered in time)
	Unknown       uint64   `json:"unknownMarks"`  // kernel-decided flows not recorded: marked by a table whose ids this daemon does not know (a previous kl-relayd's)
	Generation    uint8    `json:"generation"`
	Policy        string   `json:"policy"`          // hash of the rules the installed plan came from
	Error         string   `json:"error,omitempty"` // the last install's failure (the previous table stays)
	Plan          []string `json:"plan,omitempty"`  // the entries in words (small plans only)
}

// RuleHit counts the decisions one rule made.
type RuleHit struct {
	Rule      int    `json:"rule"`
	Dimension string `json:"dimension"`
	Count     uint64 `json:"count"`
}

// Decision is one audit record: never the destination, payload or identity (SPEC §5).
type Decision struct {
	At        time.Time `json:"at"`
	Rule      int       `json:"rule"`
	Priority  int       `json:"priority"`
	Dimension string    `json:"dimension"`
	Exit      string    `json:"exit"`
	Note      string    `json:"note,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	Path      string    `json:"path,omitempty"`
}

// RulesStatus describes the live rules and the last attempt to load them.
type RulesStatus struct {
	Path          string    `json:"path"`
	Hash          string    `json:"hash"`                // sha256 of the live rules' bytes, hex
	LoadedAt      time.Time `json:"loadedAt"`            // when the live rules were loaded
	LastError     string    `json:"lastError,omitempty"` // the last failed load, if it came after the live rules
	LastErrorCode string    `json:"lastErrorCode,omitempty"`
	LastErrorAt   time.Time `json:"lastErrorAt,omitzero"`
}

// FlowStats counts relayed flows since the daemon started.
type FlowStats struct {
	Active int64             `json:"active"`
	Total  uint64            `json:"total"`
	ByExit map[string]uint64 `json:"byExit,omitempty"` // decisions by exit; "refused" counts flows no exit could carry
}
