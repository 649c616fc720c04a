// Package cni is kl-cni, the CNI chained plugin (CNI 1.0 and 1.1, and the 0.3.0, 0.3.1
// and 0.4.0 versions that Calico and Flannel conflists still declare) that puts a pod
// under kl's egress capture when its sandbox is created. A prevResult of any of these
// versions is read through the cni library's converters and returned in the config's
// version, as the reference portmap and bandwidth plugins do. CHECK needs 0.4.0 or
// later, STATUS and GC 1.1.0 (the skel refuses them below).
//
// ADD, in transparent mode, registers the sandbox with kl-relayd together with its
// capture configuration: the relay installs the pod's nftables table (package netns; in
// one transaction with its kernel fast path decisions) and then opens its listeners
// inside the pod netns, and ADD returns only once both exist. The plugin thus costs one
// round trip on the unix socket; the netns work happens in the relay, a warm process,
// where it is several times cheaper than in a freshly started plugin (the way
// istio-cni's plugin hands the pod to its node agent). A relay that does not say it
// installed the table (an older kl-relayd) gets it installed by the plugin. In proxy
// mode ADD only registers; in env mode it does nothing. DEL undoes it (the plugin
// removes the table itself, so DEL works without the relay), CHECK verifies the table
// and the registration, STATUS asks whether the relay is reachable.
//
// A pod may be chained to several kl-cni networks (Multus, or a second interface): each
// (network, interface) is an attachment of the one registration of its sandbox, and the
// DEL of one releases only it; the relay keeps the listeners and the table while any is
// left, and tells DEL so.
//
// Failure is closed: when the registration fails (but for a 409: another registration
// serves the netns, and the table there is that one's), the plugin installs the capture
// table itself before it reports the error, and leaves it in place. Until the runtime tears the sandbox down (it calls DEL after a failed ADD) every
// TCP connection the pod attempts is redirected to a port where nothing listens and is
// refused: a pod can never run with its egress silently uncaptured, even under a runtime
// that ignored the error. A registration that times out here is not made later behind
// the plugin's back: kl-relayd abandons a registration whose client has gone by the
// time it gets to it, so the DEL that follows the failed ADD leaves nothing behind,
// whichever of the two the relay handles first.
//
// What is captured: TCP over IPv4 and IPv6 to anything but loopback, the cloud metadata
// addresses (169.254.0.0/16, fd00:ec2::254), fe80::/10 and the configured exclusions. Not captured: UDP (DNS passes as before); UDP
// to port 443 (QUIC) is rejected by default so clients fall back to TCP; other protocols
// (ICMP, SCTP) pass untouched.
//
// The plugin writes only the CNI protocol to stdout; logs go to stderr.
package cni

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api/wire"
)

// ErrPluginNotAvailable is the CNI 1.1 STATUS error code for "the plugin cannot serve
// ADDs now" (here: kl-relayd is unreachable).
const ErrPluginNotAvailable uint = 50

// HTTP statuses kl-relayd answers that the plugin tells apart (kl-cni does not link
// net/http; see package wire).
const (
	http400 = 400 // the request, e.g. a container id the relay refuses
	http404 = 404
	http409 = 409 // another registration holds the netns
)

// Relay is the part of the kl-relayd client the plugin uses (*wire.Client).
type Relay interface {
	Register(ctx context.Context, w wire.Workload) (wire.Registration, error)
	Deregister(ctx context.Context, id string) (wire.Deregistration, error)
	Detach(ctx context.Context, id string, d wire.Detachment) (wire.Deregistration, error)
	Get(ctx context.Context, id string) (wire.Registration, bool, error)
	Ping(ctx context.Context) error
	List(ctx context.Context) ([]wire.Registration, error)
}

// Plugin runs the CNI commands. The zero value is not usable; New returns the real one.
type Plugin struct {
	Backend  netns.Backend                                    // nftables; a fake in unit tests
	NewRelay func(socket string, timeout time.Duration) Relay // the daemon client
	Stdout   io.Writer                                        // the CNI protocol
	Log      *slog.Logger                                     // stderr
	Ctx      context.Context

	level *slog.LevelVar // Log's level, when New made it: the config's debug lowers it
}

// New returns the plugin as the kl-cni binary runs it.
func New(ctx context.Context, stdout, stderr io.Writer, debugLog bool) *Plugin {
	level := &slog.LevelVar{}
	level.Set(slog.LevelWarn)
	if debugLog {
		level.Set(slog.LevelDebug)
	}
	return &Plugin{
		Backend:  nil,
		NewRelay: func(s string, t time.Duration) Relay { return &wire.Client{Socket: s, Timeout: t} },
		Stdout:   stdout,
		Log:      slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With("plugin", "kl-cni"),
		Ctx:      ctx,
		level:    level,
	}
}

// config reads stdin with read (parseConfig, or decodeLenient for DEL) and lowers the
// log's level when the config asks for debug.
func (p *Plugin) config(stdin []byte, read func([]byte) (*Config, error)) (*Config, error) {
	c, err := read(stdin)
	if err == nil && c.Debug && p.level != nil {
		p.level.Set(slog.LevelDebug)
	}
	return c, err
}

// Versions are the CNI spec versions kl-cni speaks.
var Versions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// Run is kl-cni's main: it dispatches on CNI_COMMAND, prints the result or the CNI error
// on stdout, and returns the error (the binary then exits 1).
func Run(ctx context.Context, _ []string) error {
	p := New(ctx, os.Stdout, os.Stderr, os.Getenv("KL_CNI_DEBUG") == "1")
	if e := skel.PluginMainFuncsWithError(p.Funcs(), Versions, "kl-cni: kl's CNI chained plugin for egress capture"); e != nil {
		if err := e.Print(); err != nil {
			fmt.Fprintln(os.Stderr, "kl-cni: write error:", err)
		}
		return e
	}
	return nil
}

// Funcs are the skel callbacks, each turning a panic into a CNI error.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{
		Add:    p.guard("ADD", p.Add),
		Del:    p.guard("DEL", p.Del),
		Check:  p.guard("CHECK", p.Check),
		Status: p.guard("STATUS", p.Status),
		GC:     p.guard("GC", p.GC),
	}
}

func (p *Plugin) guard(cmd string, fn func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) (err error) {
		defer func() {
			if r := recover(); r != nil {
				p.Log.Error("panic", "command", cmd, "panic", r, "stack", string(debug.Stack()))
				err = types.NewError(types.ErrInternal, fmt.Sprintf("kl-cni %s: internal error: %v", cmd, r), "")
			}
		}()
		return fn(args)
	}
}

func (p *Plugin) ctx() context.Context {
	if p.Ctx != nil {
		return p.Ctx
	}
	return context.Background()
}

func (p *Plugin) install(ns string, c netns.Capture) error {
	if p.Backend != nil {
		return netns.InstallWith(p.Backend, ns, c)
	}
	return netns.Install(ns, c)
}

func (p *Plugin) remove(ns string) error {
	if p.Backend != nil {
		return netns.RemoveWith(p.Backend, ns)
	}
	return netns.Remove(ns)
}

func (p *Plugin) verify(ns string, c netns.Capture) error {
	if p.Backend != nil {
		return netns.VerifyWith(p.Backend, ns, c)
	}
	return netns.Verify(ns, c)
}

func configError(err error) error {
	return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
}

// workload builds the registration for this sandbox.
func workload(args *skel.CmdArgs, c *Config, mode string) (wire.Workload, error) {
	pa := parseArgs(args.Args)
	w := wire.Workload{
		ID:          args.ContainerID,
		Netns:       args.Netns,
		Mode:        mode,
		Source:      "cni",
		Network:     c.Name,
		IfName:      args.IfName,
		Namespace:   pa.Namespace,
		Name:        pa.Name,
		Labels:      c.RuntimeConfig.Labels,
		Annotations: c.annotations(),
	}
	if c.PrevResult != nil {
		res, err := types100.NewResultFromResult(c.PrevResult)
		if err != nil {
			return w, fmt.Errorf("read prevResult: %w", err)
		}
		for _, ip := range res.IPs {
			// Addresses of the sandbox's own interfaces (skip the host side of a veth).
			if ip.Interface != nil && *ip.Interface >= 0 && *ip.Interface < len(res.Interfaces) &&
				res.Interfaces[*ip.Interface].Sandbox == "" {
				continue
			}
			if a, ok := netipFromIP(ip.Address.IP); ok {
				w.Addrs = append(w.Addrs, a)
			}
		}
	}
	return w, nil
}

// Add captures the sandbox. See the package documentation for the failure model.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	c, err := p.config(args.StdinData, parseConfig)
	if err != nil {
		return configError(err)
	}
	if c.PrevResult == nil {
		return configError(errors.New("kl-cni is a chained plugin: it needs a prevResult (put it after the main plugin in the conflist)"))
	}
	mode, err := c.podMode()
	if err != nil {
		return configError(err)
	}
	log := p.Log.With("container", args.ContainerID, "mode", mode)
	if mode != wire.ModeEnv {
		w, err := workload(args, c, mode)
		if err != nil {
			return types.NewError(types.ErrDecodingFailure, err.Error(), "")
		}
		start := time.Now()
		if mode == wire.ModeTransparent {
			w.Capture = c.wireCapture()
		}
		ctx, cancel := context.WithTimeout(p.ctx(), c.timeout)
		defer cancel()
		reg, err := p.NewRelay(c.Socket, c.timeout).Register(ctx, w)
		if err != nil {
			// Fail closed: the table is in place whatever went wrong (see the package doc);
			// DEL removes it. But not over a conflict: another registration serves the
			// netns, the table there is that registration's (its capture, its kernel
			// decisions), and the runtime's DEL that follows must leave it too (the relay
			// says so).
			var also string
			var he *wire.HTTPError
			if errors.As(err, &he) && he.Status == http409 {
				return types.NewError(types.ErrInternal, "kl-cni: register sandbox with kl-relayd: "+err.Error()+
					"; the netns and its capture stay that registration's", "")
			}
			if mode == wire.ModeTransparent {
				if ierr := p.install(args.Netns, c.capture()); ierr != nil {
					also = "; the capture table could not be installed either: " + ierr.Error()
				}
			}
			msg := "kl-cni: register sandbox with kl-relayd: " + err.Error() + also
			if errors.Is(err, wire.ErrUnreachable) {
				msg = fmt.Sprintf("kl-cni: kl-relayd is not reachable at %s; egress capture fails closed, the sandbox cannot start: %v%s", c.Socket, err, also)
				return types.NewError(types.ErrTryAgainLater, msg, "")
			}
			return types.NewError(types.ErrInternal, msg, "")
		}
		registered := time.Since(start)
		if mode == wire.ModeTransparent && !reg.Captured {
			// A relay that does not install tables: the listeners exist, the table goes in now.
			if err := p.install(args.Netns, c.capture()); err != nil {
				return types.NewError(types.ErrInternal, "kl-cni: install capture: "+err.Error(), "")
			}
		}
		log.Debug("captured", "by_relay", reg.Captured, "register", registered, "total", time.Since(start))
	}
	return p.print(c)
}

// print writes prevResult, unchanged, in the config's version.
func (p *Plugin) print(c *Config) error {
	r, err := c.PrevResult.GetAsVersion(c.CNIVersion)
	if err != nil {
		return types.NewError(types.ErrIncompatibleCNIVersion, err.Error(), "")
	}
	if err := r.PrintTo(p.Stdout); err != nil {
		return types.NewError(types.ErrIOFailure, err.Error(), "")
	}
	return nil
}

// Del releases the sandbox's attachment (CNI keys one by container id, network name and
// interface name; a pod chained to two kl-cni networks has two): the relay drops it and
// deregisters the sandbox only when it was the last. Deregister first (the listeners close, so for a moment the
// still-installed table refuses connections rather than letting them out), then remove
// the table: the relay removes the one it installed, the plugin removes it when the
// relay does not say it did. It succeeds when the netns is gone and when called twice.
// An unreachable relay does not block the teardown (the plugin removes the table and
// DEL succeeds, as an operator draining a node with the relay down expects): the relay
// drops registrations whose netns has disappeared, at its next sweep or restart.
// A config that ADD would refuse (one written by an older kl-cni that checked less, with
// a bad prevResult, or with fields of the wrong JSON type) does not block the teardown
// either: DEL uses only its socket and timeout, defaults for what does not decode, and
// warns. Nor does a relay that refuses the container id (it cannot have registered it)
// or does not know it.
//
// The plugin leaves the table when the relay says the netns is still served: by the
// sandbox's other attachments, or by another registration (the DEL of an ADD refused
// because that registration holds the netns). A relay that does not say (it predates
// attachments, or is unreachable) leaves the table to the plugin, as before.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	c, err := p.config(args.StdinData, decodeLenient)
	if err != nil {
		return configError(err)
	}
	log := p.Log.With("container", args.ContainerID)
	if err := errors.Join(c.dropped, c.validate()); err != nil {
		log.Warn("kl-cni config is invalid; DEL goes on with its socket and timeout", "socket", c.Socket, "timeout", c.timeout, "err", err)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(p.ctx(), c.timeout)
	defer cancel()
	det := wire.Detachment{Attachment: wire.Attachment{Network: c.Name, IfName: args.IfName}, Netns: args.Netns}
	dr, err := p.NewRelay(c.Socket, c.timeout).Detach(ctx, args.ContainerID, det)
	var he *wire.HTTPError
	switch {
	case err == nil:
	case errors.Is(err, wire.ErrUnreachable):
		log.Warn("kl-relayd unreachable at DEL; it drops the registration when the netns is gone", "err", err)
	case errors.As(err, &he) && (he.Status == http400 || he.Status == http404):
		log.Warn("kl-relayd does not know the sandbox (it refused the id or has no such registration); DEL goes on", "err", err)
	default:
		return types.NewError(types.ErrInternal, "kl-cni: deregister sandbox from kl-relayd: "+err.Error(), "")
	}
	if dr.NetnsServed {
		log.Debug("netns still served; its capture table stays", "served_by", dr.ServedBy)
	}
	if args.Netns != "" && !dr.TableRemoved && !dr.NetnsServed {
		if err := p.remove(args.Netns); err != nil {
			return types.NewError(types.ErrInternal, "kl-cni: "+err.Error(), "")
		}
	}
	log.Debug("released", "by_relay", dr.TableRemoved, "total", time.Since(start))
	return nil
}

// Check fails when the table, one of its rules or the registration is missing or wrong.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	c, err := p.config(args.StdinData, parseConfig)
	if err != nil {
		return configError(err)
	}
	if c.PrevResult == nil {
		return configError(errors.New("kl-cni CHECK needs a prevResult"))
	}
	mode, err := c.podMode()
	if err != nil {
		return configError(err)
	}
	if mode == wire.ModeEnv {
		return nil
	}
	if mode == wire.ModeTransparent {
		if err := p.verify(args.Netns, c.capture()); err != nil {
			return types.NewError(types.ErrInternal, "kl-cni CHECK: "+err.Error(), "")
		}
	}
	ctx, cancel := context.WithTimeout(p.ctx(), c.timeout)
	defer cancel()
	reg, found, err := p.NewRelay(c.Socket, c.timeout).Get(ctx, args.ContainerID)
	switch {
	case err != nil:
		return types.NewError(types.ErrTryAgainLater, "kl-cni CHECK: "+err.Error(), "")
	case !found:
		return types.NewError(types.ErrInternal, fmt.Sprintf("kl-cni CHECK: sandbox %s is not registered with kl-relayd", args.ContainerID), "")
	case reg.Workload.Netns != args.Netns:
		return types.NewError(types.ErrInternal, fmt.Sprintf("kl-cni CHECK: sandbox %s is registered with netns %s, not %s", args.ContainerID, reg.Workload.Netns, args.Netns), "")
	case reg.Workload.Mode != mode:
		return types.NewError(types.ErrInternal, fmt.Sprintf("kl-cni CHECK: sandbox %s is registered in mode %s, not %s", args.ContainerID, reg.Workload.Mode, mode), "")
	case len(reg.Attachments) > 0 && !slices.ContainsFunc(reg.Attachments, func(a wire.Attachment) bool {
		return a.Is(wire.Attachment{Network: c.Name, IfName: args.IfName})
	}):
		return types.NewError(types.ErrInternal, fmt.Sprintf("kl-cni CHECK: sandbox %s is not registered for network %s, interface %s", args.ContainerID, c.Name, args.IfName), "")
	}
	return nil
}

// Status reports whether kl-relayd answers (CNI 1.1).
func (p *Plugin) Status(args *skel.CmdArgs) error {
	c, err := p.config(args.StdinData, parseConfig)
	if err != nil {
		return configError(err)
	}
	ctx, cancel := context.WithTimeout(p.ctx(), c.timeout)
	defer cancel()
	if err := p.NewRelay(c.Socket, c.timeout).Ping(ctx); err != nil {
		return types.NewError(ErrPluginNotAvailable, fmt.Sprintf("kl-relayd is not ready at %s", c.Socket), err.Error())
	}
	return nil
}

// GC (CNI 1.1) releases this network's attachments that the runtime no longer lists as
// valid (container id and interface name): their DEL never reached the relay. A
// sandbox is deregistered with its last attachment; its table went with its netns.
// Attachments of other networks, and registrations of the OCI hook, are left alone. A
// registration that records no attachments (a relay that predates them) is compared by
// its network and container id, as before.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	c, err := p.config(args.StdinData, parseConfig)
	if err != nil {
		return configError(err)
	}
	type key struct{ id, ifname string }
	validID := map[string]bool{}
	valid := map[key]bool{}
	for _, a := range c.ValidAttachments {
		validID[a.ContainerID] = true
		valid[key{a.ContainerID, a.IfName}] = true
	}
	stale := func(id string, a wire.Attachment) bool {
		if a.Network != c.Name {
			return false
		}
		if a.IfName == "" { // an older kl-cni registered it without its interface
			return !validID[id]
		}
		return !valid[key{id, a.IfName}]
	}
	// Each call gets its own bound (the config's timeout is per call): a long list of
	// stale sandboxes must not run the later deregistrations out of time.
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(p.ctx(), c.timeout) }
	relay := p.NewRelay(c.Socket, c.timeout)
	ctx, cancel := call()
	regs, err := relay.List(ctx)
	cancel()
	if err != nil {
		return types.NewError(types.ErrTryAgainLater, "kl-cni GC: "+err.Error(), "")
	}
	var errs []error
	for _, r := range regs {
		w := r.Workload
		if w.Source != "cni" {
			continue
		}
		if len(r.Attachments) == 0 {
			if w.Network != c.Name || validID[w.ID] {
				continue
			}
			ctx, cancel := call()
			_, err := relay.Deregister(ctx, w.ID)
			cancel()
			if err != nil {
				errs = append(errs, err)
				continue
			}
			p.Log.Info("gc: deregistered stale sandbox", "container", w.ID)
			continue
		}
		for _, a := range r.Attachments {
			if !stale(w.ID, a) {
				continue
			}
			ctx, cancel := call()
			_, err := relay.Detach(ctx, w.ID, wire.Detachment{Attachment: a})
			cancel()
			if err != nil {
				errs = append(errs, err)
				continue
			}
			p.Log.Info("gc: released stale attachment", "container", w.ID, "ifname", a.IfName)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, "kl-cni GC: "+err.Error(), "")
	}
	return nil
}
