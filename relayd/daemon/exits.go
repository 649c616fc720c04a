package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/config"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/relayd/upstream"
	"github.com/kl-egress/kl/rules"
)

type nsKey struct{}

// buildExits turns the configured upstreams into the relay's exits: `proxy`, every named
// exit, and `gateway` when the operator opted in. The connection to an upstream is made from the workload's own netns with the
// relay's mark, like a direct dial, so it follows the pod's network and is not captured
// again.
//
// The upstreams are also returned as Handshakers: the relay's event loops carry a flow
// to an upstream at a literal address themselves (relay.Options.Upstreams).
func buildExits(cfg *config.Config) (map[string]relay.DialFunc, map[string]upstream.Handshaker, error) {
	base := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if h := relay.NetnsFrom(ctx); h != nil {
			return h.Dial(ctx, cfg.Mark, network, addr) // the netns the relay holds open
		}
		ns, _ := ctx.Value(nsKey{}).(string)
		return netns.Dial(ctx, ns, cfg.Mark, network, addr)
	}
	exits := map[string]relay.DialFunc{}
	ups := map[string]upstream.Handshaker{}
	add := func(name string, u config.Upstream) error {
		var opts []upstream.Option
		if u.Pipeline {
			opts = append(opts, upstream.Pipeline())
		}
		d, err := upstream.New(u.URL, u.ConnectTimeout, base, opts...)
		if err != nil {
			return fmt.Errorf("exit %s (%s): %w", name, config.Redact(u.URL), err)
		}
		if hs, ok := d.(upstream.Handshaker); ok {
			ups[name] = hs
		}
		exits[name] = func(ctx context.Context, w *api.Workload, dst relay.Dest) (net.Conn, error) {
			ctx = context.WithValue(ctx, nsKey{}, w.Netns)
			// The upstream resolves dst.Host when it is set, which the relay does only
			// when the name decided the flow; otherwise it gets the address the policy
			// checked, never a name the workload merely claimed (SNI, Host).
			return d.Dial(ctx, upstream.Target{Host: dst.Host, Addr: dst.Addr, Port: dst.Port})
		}
		return nil
	}
	if cfg.Gateway {
		// The operator opted in (KL_EGRESS_GATEWAY=1): the node's own network, i.e. the
		// daemon's netns. Without the opt-in a policy naming gateway is refused at load.
		// As for an upstream, a name is dialed only when it decided the flow.
		node, err := netns.Open("") // the daemon's own netns: no descriptor, no setns
		if err != nil {
			return nil, nil, err
		}
		exits[rules.ExitGateway] = func(ctx context.Context, _ *api.Workload, dst relay.Dest) (net.Conn, error) {
			return dialGateway(ctx, node, cfg.Mark, dst)
		}
	}
	if cfg.Proxy != nil {
		if err := add(rules.ExitProxy, *cfg.Proxy); err != nil {
			return nil, nil, err
		}
	}
	for _, name := range cfg.ExitNames() {
		if err := add(name, cfg.Exits[name]); err != nil {
			return nil, nil, err
		}
	}
	return exits, ups, nil
}

// errOnNode refuses a gateway destination on the node itself. It names no address: it
// ends up in audit records.
var errOnNode = errors.New("gateway: destination is on the node itself (loopback, link-local, cloud metadata or unspecified): refused")

// dialGateway dials dst from the daemon's own netns, the node's network. A destination
// on the node itself is refused, also when a name resolves to one: loopback (services
// that listen on the node's loopback only: kubelet's healthz, containerd's debug,
// whatever an operator bound to 127.0.0.1), link-local (169.254.169.254, the cloud
// metadata service and the node's credentials), fd00:ec2::254 (the same over IPv6) and
// unspecified addresses (netns.HostLocal). A pod reaches
// none of them from its own netns, and the gateway must not lend it the node's. (The
// node's own network addresses stay reachable, as they are from any pod.) A name is
// resolved here once and its addresses are tried in order.
func dialGateway(ctx context.Context, node *netns.Handle, mark uint32, dst relay.Dest) (net.Conn, error) {
	addrs := []netip.Addr{dst.Addr.Addr()}
	if dst.Host != "" {
		var err error
		if addrs, err = net.DefaultResolver.LookupNetIP(ctx, "ip", dst.Host); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	var off []netip.AddrPort
	for _, a := range addrs {
		if a = a.Unmap(); !netns.HostLocal(a) {
			off = append(off, netip.AddrPortFrom(a, dst.Port))
		}
	}
	if len(off) == 0 {
		return nil, errOnNode
	}
	return netns.DialFirst(ctx, off, func(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
		return node.DialAddrPort(ctx, mark, ap)
	})
}
