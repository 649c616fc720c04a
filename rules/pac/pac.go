// Package pac runs PAC scripts (FindProxyForURL) for kl's rule engine: compiled once,
// evaluated in a pool of sandboxed goja runtimes with a hard per-call deadline, and
// mapped to a route with the directive table of SPEC §4.3.
//
// The sandbox has no ambient authority: no modules, timers, network or DNS. The PAC
// built-ins are implemented natively in Go (no backtracking regex engine), dnsResolve
// only answers with the destination the caller already knows, and Date and Math.random
// are derived from the flow so every hop computes the same answer. Any failure (an
// exception, a result of the wrong type, the deadline) decides deny.
// Calls are independent: a runtime is sealed once the script's top-level code has run,
// so that nothing a call does reaches the next one (state.go says how, and what a
// script that assigns its globals gets).
//
// A call runs on one of two paths, chosen once per script at load (Script.Path). A
// script that provably reaches nothing goja's Interrupt cannot stop (only the PAC
// built-ins, cheap string methods, Math, /re/.test with regexes Go's linear regexp
// runs, and no eval, Function, constructor, RegExp, replace, repeat, join, sort...)
// runs inline, on the caller's goroutine, interrupted at its deadline; realistic PAC
// files do. Any other script is handed to a runtime's own goroutine, and a runtime
// stuck past the deadline (say, in a backtracking regex) is abandoned while the caller
// gets deny. An inline call whose input grows past the inline bounds (8 KiB strings,
// also those + builds, 1 KiB regex inputs) is run again on the hand-off path.
//
// It is not a rule engine: package rules decides what a Result means for a flow.
package pac

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"
)

// MaxScriptBytes bounds the size of a script's source text.
const MaxScriptBytes = 1 << 20

// Defaults for Options.
const (
	DefaultDeadline     = 50 * time.Millisecond
	DefaultMaxAbandoned = 8
)

// Options configure a compiled script. The zero value is usable.
type Options struct {
	// Deadline bounds one evaluation (default 50ms). Past it the call decides deny.
	Deadline time.Duration
	// Location is the time zone of the script's Date and of the time built-ins
	// without "GMT" (default UTC, never the host's zone).
	Location *time.Location
	// MaxAbandoned bounds the runtimes left behind by evaluations that did not stop
	// at their deadline (stuck in native code such as the script's own RegExp). When
	// that many are still running, further calls fail fast with deny rather than
	// start more (default 8).
	MaxAbandoned int
	// Log receives alert() messages at debug level (nil: discarded). They may name
	// the destination, so they are never logged above debug.
	Log *slog.Logger

	// setupDelay slows the setting up of every runtime (tests: a busy machine).
	setupDelay time.Duration
}

// Call is one evaluation of FindProxyForURL: the facts a flow carries.
type Call struct {
	Host   string     // destination host name, or the address as text when only that is known
	Scheme string     // URL scheme handed to the script; "https" when empty
	Port   uint16     // destination port; a non-default port appears in the URL
	Dst    netip.Addr // the destination address, if known (dnsResolve answers with it)
	MyIP   netip.Addr // the workload's own address (myIpAddress)
	At     time.Time  // the flow's timestamp: the script's Date and the time built-ins (zero: the Unix epoch, never the clock)
	Seed   uint64     // seeds Math.random for this call
}

// Result is what a script decided.
type Result struct {
	Exit      string // "direct" | "deny" | "client" | "gateway" | "" (= use the file's default)
	Directive string // the first directive as returned (trimmed), "" for null/undefined/empty
	Proxy     string // concrete proxy for PROXY/HTTPS/SOCKS/SOCKS5 host:port, as a URL
	Failed    bool   // script failure (exception, non-string result, deadline): Exit is "deny"
	Reason    string // why it failed
}

// CompileError is a script refused at load time. Code is "E_SCRIPT" or "E_TOO_LARGE";
// Line is the 1-based line in the script (0 when unknown). A syntax error also has its
// 1-based Column, which Msg names too ("Unexpected token } (column 3)"), so that
// callers that keep only Msg and Line still show it.
type CompileError struct {
	Code   string
	Line   int
	Column int
	Msg    string
}

// at is Msg's mention of the column, "" when unknown.
func (e *CompileError) at() string {
	if e.Column <= 0 {
		return ""
	}
	return fmt.Sprintf(" (column %d)", e.Column)
}

func (e *CompileError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s: %s (script line %d)", e.Code, e.Msg, e.Line)
	}
	return e.Code + ": " + e.Msg
}

// Error codes of CompileError, the same strings as package rules' reason codes.
const (
	CodeScript   = "E_SCRIPT"
	CodeTooLarge = "E_TOO_LARGE"
)
