// Package wire holds the messages of kl-relayd's API (JSON over HTTP on the daemon's
// unix socket) and Client, a small client for it that does not link net/http.
//
// Package api re-exports every type and constant here under the same names; most code
// uses api. Short-lived processes that sit on a latency budget import wire instead:
// kl-cni runs once per pod sandbox operation, and net/http (with crypto/tls, x509 and
// their package initialisation) is a measurable share of such a process's start-up.
package wire

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// DefaultSocket is where kl-relayd listens unless configured otherwise.
const DefaultSocket = "/run/kl/relayd.sock"

// Egress modes (SPEC §2).
const (
	ModeEnv         = "env"
	ModeProxy       = "proxy"
	ModeTransparent = "transparent"
)

// LabelMode is the workload label/annotation that overrides the node's default mode.
const LabelMode = "kl.egress.mode"

// Workload is one registered sandbox or container: a network namespace the relay serves.
type Workload struct {
	ID          string            `json:"id"`                // sandbox or container id; the registration key
	Netns       string            `json:"netns"`             // path of the network namespace, e.g. /var/run/netns/x or /proc/PID/ns/net
	Mode        string            `json:"mode"`              // transparent or proxy
	Source      string            `json:"source"`            // "cni" or "hook"
	Network     string            `json:"network,omitempty"` // source "cni": the CNI network (conflist name) of the latest ADD
	IfName      string            `json:"ifname,omitempty"`  // source "cni": the ADD's interface (CNI_IFNAME); with Network, its Attachment
	Namespace   string            `json:"namespace,omitempty"`
	Name        string            `json:"name,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Image       string            `json:"image,omitempty"`
	Addrs       []netip.Addr      `json:"addrs,omitempty"` // the workload's own addresses
	// Capture, on a transparent workload, asks the daemon to install the workload's
	// capture table itself, before it opens the listeners (kl-cni sets it: the daemon, a
	// warm process, programs the netns faster than a freshly started plugin, and in one
	// transaction with the kernel fast path's decisions). Registration.Captured says
	// whether it did; a caller that asked and does not see it installs the table itself.
	Capture *Capture `json:"capture,omitempty"`
}

// Capture is the capture table's configuration as the wire carries it (the netns
// package's Capture; see netns.Capture for the meaning of each field).
type Capture struct {
	RedirectPort uint16         `json:"redirectPort"`
	Mark         uint32         `json:"mark"`
	IPv6         bool           `json:"ipv6"`
	RejectQUIC   bool           `json:"rejectQUIC"`
	ExcludeCIDRs []netip.Prefix `json:"excludeCIDRs,omitempty"`
	ExcludePorts []uint16       `json:"excludePorts,omitempty"`
}

// Listeners are the ports the relay opened inside a workload's netns.
type Listeners struct {
	Redirect uint16 `json:"redirect"`        // transparent capture target (IPv4 and IPv6)
	HTTP     uint16 `json:"http,omitempty"`  // proxy mode: HTTP CONNECT and forward proxy on loopback
	SOCKS    uint16 `json:"socks,omitempty"` // proxy mode: SOCKS5 on loopback
}

// Registration is the daemon's answer to a register call, and an entry of List.
type Registration struct {
	Workload  Workload  `json:"workload"`
	Listeners Listeners `json:"listeners"`
	Since     time.Time `json:"since"`
	// Captured is true when the daemon installed the workload's capture table for this
	// registration (the workload asked with Workload.Capture).
	Captured bool `json:"captured,omitempty"`
	// Attachments are the CNI attachments served by this registration: every ADD for the
	// id in the same netns adds its own (Workload.Network and IfName). A DEL that names
	// one releases only it; the registration goes with the last. Empty for registrations
	// of the OCI hook and of a kl-cni or kl-relayd that predates them.
	Attachments []Attachment `json:"attachments,omitempty"`
}

// Attachment is one CNI attachment of a sandbox: CNI keys an attachment by container id,
// network name and interface name, and a pod chained to two kl-cni networks (Multus, or a
// second interface) has two under one container id and one netns.
type Attachment struct {
	Network string `json:"network"`
	IfName  string `json:"ifname,omitempty"`
}

// Is says whether recorded attachment a is the one b names: the same network and
// interface, or the same network where a has no interface (an older kl-cni's ADD sent
// none).
func (a Attachment) Is(b Attachment) bool {
	return a.Network == b.Network && (a.IfName == b.IfName || a.IfName == "")
}

// Detachment is what a CNI DEL releases (Client.Detach): one attachment of a sandbox,
// and the netns it names, so the daemon can say whether that netns is still served.
type Detachment struct {
	Attachment
	Netns string // CNI_NETNS; empty when the runtime no longer has it
}

// Deregistration is the daemon's answer to a deregister call.
type Deregistration struct {
	// TableRemoved is true when the daemon removed the capture table it had installed
	// for the workload (Registration.Captured), or found its netns gone.
	TableRemoved bool `json:"tableRemoved,omitempty"`
	// NetnsServed is true when the netns the DEL named is still served after it: by
	// other attachments of the same registration (which the DEL left in place), or by
	// another registration whose netns it is (the DEL of an ADD that was refused with a
	// conflict). Its capture table is then that registration's: the caller leaves it.
	NetnsServed bool `json:"netnsServed,omitempty"`
	// ServedBy is the id of the registration that serves it.
	ServedBy string `json:"servedBy,omitempty"`
}

// ErrorBody is what the daemon returns with a non-2xx status.
type ErrorBody struct {
	Error string `json:"error"`
}

// Node-wide defaults shared by the daemon, kl-cni and the OCI wrapper and hook. Each is
// configurable; these are what a node gets when nothing says otherwise.
const (
	DefaultRedirectPort uint16 = 15001  // transparent capture target inside each pod netns
	DefaultHTTPPort     uint16 = 15080  // proxy mode: HTTP CONNECT/forward proxy on the pod's loopback
	DefaultSOCKSPort    uint16 = 15081  // proxy mode: SOCKS5 on the pod's loopback
	DefaultMark         uint32 = 0x4b4c // SO_MARK on the relay's own sockets ("KL"); capture skips it
	DefaultRulesPath           = "/etc/kl/rules.yaml"
	DefaultStateDir            = "/var/lib/kl"
)

// ErrUnreachable wraps every failure to reach the daemon at all, so callers that must
// fail closed (kl-cni ADD, kl-hook) can say so precisely.
var ErrUnreachable = errors.New("kl-relayd unreachable")

// HTTPError is a well-formed refusal from the daemon.
type HTTPError struct {
	Status int
	Msg    string
}

func (e *HTTPError) Error() string { return fmt.Sprintf("kl-relayd: %s (HTTP %d)", e.Msg, e.Status) }
