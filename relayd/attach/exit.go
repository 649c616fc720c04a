package attach

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/rules"
)

// Exit is the relay's `client` exit backed by this server's sessions:
//
//	exits[rules.ExitClient] = srv.Exit()
//
// A flow the relay decided keeps its decision and the policy that took it (relay.FlowFrom,
// relay.PolicyFrom); any other is decided here with the live policy (the exit is handed
// only the destination). Either way it goes to dst's address when it has one. It is
// carried over the newest session allowed to carry the workload; with no such session the
// flow is refused, never sent another way.
func (s *Server) Exit() relay.DialFunc {
	return func(ctx context.Context, w *api.Workload, dst relay.Dest) (net.Conn, error) {
		if f, d, ok := relay.FlowFrom(ctx); ok {
			// The relay's own flow and decision: the attach side re-decides exactly what
			// the relay decided, same timestamp and id, under the same policy. The
			// address is the one this dial is for: the relay tries each address a name
			// was checked for in turn, and the attach side must not dial the first
			// every time.
			if dst.Addr.IsValid() {
				f.Dst = dst.Addr
			}
			by, _ := relay.PolicyFrom(ctx).(*rules.Policy)
			return s.dial(ctx, w, f, &d, by)
		}
		f := rules.Flow{Labels: w.Labels, Image: w.Image, Host: dst.Host, Dst: dst.Addr}
		if !dst.Addr.IsValid() {
			f.Dst = netip.AddrPortFrom(netip.Addr{}, dst.Port)
		}
		if !dst.Addr.IsValid() && dst.Host == "" {
			return nil, &net.OpError{Op: "attach", Net: "tcp", Err: fmt.Errorf("flow without a destination")}
		}
		return s.Dial(ctx, w, f, nil)
	}
}

// Off is the `client` exit of a daemon whose attach listener is not configured: every
// client flow is refused with the reason, since no session can exist.
func Off() relay.DialFunc {
	return func(context.Context, *api.Workload, relay.Dest) (net.Conn, error) {
		return nil, &net.OpError{Op: "attach", Net: "tcp", Err: fmt.Errorf("%w (the attach listener is off)", ErrNoSession)}
	}
}
