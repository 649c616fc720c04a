// Package api is the wire contract between kl-relayd and its clients (kl-cni, kl-hook,
// kl-runtime, kl-ctl): JSON over HTTP on the daemon's unix socket. It holds the message
// types and a small client; it is not the daemon's implementation.
package api

import "github.com/kl-egress/kl/relayd/api/wire"

// The messages and constants live in package wire (so that short-lived clients can
// talk to the daemon without linking net/http); they are the same types here.

// DefaultSocket is where kl-relayd listens unless configured otherwise.
const DefaultSocket = wire.DefaultSocket

// Egress modes (SPEC §2).
const (
	ModeEnv         = wire.ModeEnv
	ModeProxy       = wire.ModeProxy
	ModeTransparent = wire.ModeTransparent
)

// LabelMode is the workload label/annotation that overrides the node's default mode.
const LabelMode = wire.LabelMode

// Workload is one registered sandbox or container: a network namespace the relay serves.
type Workload = wire.Workload

// Capture is a workload's capture table configuration, for a daemon that installs it
// (Workload.Capture).
type Capture = wire.Capture

// Listeners are the ports the relay opened inside a workload's netns.
type Listeners = wire.Listeners

// Registration is the daemon's answer to a register call, and an entry of List.
type Registration = wire.Registration

// Attachment is one CNI attachment of a sandbox (network and interface name).
type Attachment = wire.Attachment

// Detachment is what a CNI DEL releases: one attachment, and the netns it names.
type Detachment = wire.Detachment

// Deregistration is the daemon's answer to a deregister call.
type Deregistration = wire.Deregistration

// ErrorBody is what the daemon returns with a non-2xx status.
type ErrorBody = wire.ErrorBody

// Node-wide defaults shared by the daemon, kl-cni and the OCI wrapper and hook. Each is
// configurable; these are what a node gets when nothing says otherwise.
const (
	DefaultRedirectPort = wire.DefaultRedirectPort // transparent capture target inside each pod netns
	DefaultHTTPPort     = wire.DefaultHTTPPort     // proxy mode: HTTP CONNECT/forward proxy on the pod's loopback
	DefaultSOCKSPort    = wire.DefaultSOCKSPort    // proxy mode: SOCKS5 on the pod's loopback
	DefaultMark         = wire.DefaultMark         // SO_MARK on the relay's own sockets ("KL"); capture skips it
	DefaultRulesPath    = wire.DefaultRulesPath
	DefaultStateDir     = wire.DefaultStateDir
)
