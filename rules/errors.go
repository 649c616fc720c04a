package rules

import "fmt"

// Code is a stable reason code for a refused policy. Codes are part of kl's interface:
// they appear in `kl-ctl lint`, `kl-ctl status`, the daemon's log and the CNI/hook
// errors, and are documented in docs/reason-codes.md. Never renumber or rename one.
type Code string

// The reason codes. docs/reason-codes.md explains each one.
const (
	CodeUnreadable     Code = "E_UNREADABLE"       // the file cannot be read
	CodeTooLarge       Code = "E_TOO_LARGE"        // the file or script is over its size bound
	CodeSyntax         Code = "E_SYNTAX"           // not valid YAML
	CodeUnknownKey     Code = "E_UNKNOWN_KEY"      // a key kl does not know, at the top level or in a rule
	CodeNoMatch        Code = "E_NO_MATCH"         // a rule without a match field
	CodeMultiMatch     Code = "E_MULTI_MATCH"      // a rule with more than one match field
	CodeMixedForms     Code = "E_MIXED_FORMS"      // dimension and pattern rules in one file
	CodeBadAction      Code = "E_BAD_ACTION"       // an unknown action, route or default
	CodeBadExit        Code = "E_BAD_EXIT"         // an exit name the daemon's config does not define
	CodeBadLabel       Code = "E_BAD_LABEL"        // a malformed label selector
	CodeBadGlob        Code = "E_BAD_GLOB"         // a malformed image, process or domain glob
	CodeBadCIDR        Code = "E_BAD_CIDR"         // a malformed prefix or address
	CodeBadPort        Code = "E_BAD_PORT"         // a malformed port or port range
	CodeBadPattern     Code = "E_BAD_PATTERN"      // a malformed HOST[:PORT] pattern
	CodeBadMode        Code = "E_BAD_MODE"         // an unknown egress mode
	CodeBadValue       Code = "E_BAD_VALUE"        // a value of the wrong YAML type
	CodeGatewayOff     Code = "E_GATEWAY_DISABLED" // gateway used without KL_EGRESS_GATEWAY=1, or a gateway URL
	CodeClientDetached Code = "E_CLIENT_DETACHED"  // client route in a policy for detached use
	CodeScript         Code = "E_SCRIPT"           // the PAC script does not compile or lacks FindProxyForURL
)

// Error is a refused policy. Rule is the 1-based index of the offending rule (0 when
// the problem is not in a rule) and Line its line in the file (0 when unknown).
type Error struct {
	Code Code
	Rule int
	Line int
	Msg  string
}

func (e *Error) Error() string {
	s := string(e.Code) + ": "
	if e.Rule > 0 {
		s += fmt.Sprintf("rule %d: ", e.Rule)
	}
	s += e.Msg
	if e.Line > 0 {
		s += fmt.Sprintf(" (line %d)", e.Line)
	}
	return s
}
