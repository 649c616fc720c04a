// Package rules is kl's rule engine: it loads, validates and compiles a rules file
// (dimension form, pattern form or PAC script) and answers one Decision per Flow.
//
// It is not a relay and does no I/O at decision time: whatever a decision needs to know
// about a flow (labels, image, process, hostname, destination) is gathered by the caller
// and handed in as a Flow. The caller can ask a compiled Policy which of those facts it
// will look at (NeedsProcess, NeedsHost) and skip the expensive lookups otherwise.
package rules

import (
	"maps"
	"net/netip"
	"slices"
	"time"
)

// Canonical exit names. A named exit (from the daemon's config) is any other name.
const (
	ExitDirect  = "direct" // alias "cluster"
	ExitProxy   = "proxy"
	ExitDeny    = "deny" // alias "block"
	ExitClient  = "client"
	ExitGateway = "gateway"
)

// Dimension says which part of the policy decided a flow.
type Dimension uint8

const (
	DimDefault Dimension = iota
	DimLabel
	DimImage
	DimProcess
	DimDomain
	DimCIDR
	DimPort
	DimGuard
	DimScript
	DimPattern
)

var dimNames = [...]string{
	DimDefault: "default",
	DimLabel:   "label",
	DimImage:   "image",
	DimProcess: "process",
	DimDomain:  "domain",
	DimCIDR:    "cidr",
	DimPort:    "port",
	DimGuard:   "guard",
	DimScript:  "script",
	DimPattern: "pattern",
}

func (d Dimension) String() string {
	if int(d) < len(dimNames) {
		return dimNames[d]
	}
	return "unknown"
}

// MarshalText makes a Dimension appear by name in JSON.
func (d Dimension) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText is the inverse of MarshalText.
func (d *Dimension) UnmarshalText(b []byte) error {
	for i, n := range dimNames {
		if n == string(b) {
			*d = Dimension(i)
			return nil
		}
	}
	return &Error{Code: CodeBadValue, Msg: "unknown dimension " + string(b)}
}

// Priority tiers of the dimension form (SPEC §4.1). Guard, script and pattern
// decisions report priority 0.
const (
	PriorityLabel   = 100
	PriorityImage   = 200
	PriorityProcess = 300
	PriorityDomain  = 400
	PriorityCIDR    = 500
	PriorityPort    = 600
	PriorityDefault = 999
)

// Process identifies the program that opened a connection. Known is false when the
// lookup was not done or failed; a process rule never matches an unknown process.
type Process struct {
	Known bool
	Comm  string // /proc/PID/comm
	Exe   string // basename of /proc/PID/exe
	Argv0 string // basename of argv[0]
}

// Flow is everything a decision may look at. Zero values mean "unknown".
type Flow struct {
	Labels map[string]string
	// LabelKeys, when not nil, holds exactly the keys of Labels, in any order (KeysOf),
	// so that a decision need not range over the map, which costs more than the rest of
	// a label lookup. A workload's labels do not change, so the relay builds it once
	// when the workload registers.
	LabelKeys []string
	Image     string
	Process   Process
	Host      string         // destination hostname, when known (proxy mode or sniffed)
	Dst       netip.AddrPort // destination address; Addr invalid when only Host is known
	Src       netip.Addr     // the workload's own address (PAC myIpAddress)
	At        time.Time      // flow timestamp (PAC Date)
	ID        uint64         // flow id (PAC Math.random seed)
}

// Decision is the engine's answer for one flow, and the body of its audit record.
type Decision struct {
	Exit      string    `json:"exit"`      // canonical: direct, proxy, deny, client, gateway or a named exit
	Rule      int       `json:"rule"`      // 1-based index in rules; 0 for default, guard and script
	Priority  int       `json:"priority"`  // 100..600, 999 default, 0 guard/script/pattern
	Dimension Dimension `json:"dimension"` // which part decided
	Note      string    `json:"note"`
	Directive string    `json:"directive,omitempty"` // script: the directive returned
	Proxy     string    `json:"proxy,omitempty"`     // script: the concrete proxy for the client side, as a URL (http://h:p, https://h:p, socks5://h:p)
	Reason    string    `json:"reason,omitempty"`    // script: why it failed closed
}

// KeysOf returns the keys of labels, sorted, for Flow.LabelKeys; nil for no labels.
func KeysOf(labels map[string]string) []string {
	if len(labels) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(labels))
}
