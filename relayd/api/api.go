// Package api is the wire contract between kl-relayd and its clients (kl-cni, kl-hook,
// kl-runtime, kl-ctl): JSON over HTTP on the daemon's unix socket. It holds the message
// types and a small client; it is not the daemon's implementation.
package api

import (
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
	Network     string            `json:"network,omitempty"` // source "cni": the CNI network (conflist name), for GC
	Namespace   string            `json:"namespace,omitempty"`
	Name        string            `json:"name,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Image       string            `json:"image,omitempty"`
	Addrs       []netip.Addr      `json:"addrs,omitempty"` // the workload's own addresses
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
