package relay

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/proxy"
	"github.com/kl-egress/kl/relayd/sockowner"
	"github.com/kl-egress/kl/relayd/upstream"
	"github.com/kl-egress/kl/rules"
)

// openProxy starts the proxy-mode servers on the pod's loopback.
func (r *Relay) openProxy(p *pod, w api.Workload) error {
	lh, err := r.listenIn(p, w.Netns, "tcp4", fmt.Sprintf("127.0.0.1:%d", r.o.HTTPPort))
	if err != nil {
		return err
	}
	ls, err := r.listenIn(p, w.Netns, "tcp4", fmt.Sprintf("127.0.0.1:%d", r.o.SOCKSPort))
	if err != nil {
		lh.Close()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.lns = []net.Listener{lh, ls}
	p.ls = api.Listeners{HTTP: r.o.HTTPPort, SOCKS: r.o.SOCKSPort}
	srv := &proxy.Server{Dial: r.proxyDial(p), Log: r.o.Log, Pipe: r.proxyPipe, ConnContext: proxyConnContext}
	for _, s := range []struct {
		ln    net.Listener
		serve func(context.Context, net.Listener) error
	}{{lh, srv.ServeHTTP}, {ls, srv.ServeSOCKS5}} {
		p.serve.Add(1)
		go func() {
			defer p.serve.Done()
			if err := s.serve(ctx, trackingListener{s.ln, p, r.ownerKey(p)}); err != nil {
				r.o.Log.Warn("proxy stopped", "workload", w.ID, "err", err)
			}
		}()
	}
	return nil
}

// proxyPipe carries an established proxy tunnel (CONNECT, SOCKS5, or an upgraded
// forwarded request) as a transparent flow is carried, with the idle timeout. The flow
// is active, and its bytes are counted under the exit its decision chose, from its dial
// (proxyDial) to the end of the copy: the copy's bytes are added to those the proxy
// wrote and read through the connection before it (what the client sent behind its
// CONNECT, a forwarded request's exchange before its upgrade).
func (r *Relay) proxyPipe(client, up net.Conn) {
	tc, metered := up.(*trackedConn)
	metered = metered && tc.finish != nil
	exit := "unknown"
	var done func(up, down int64)
	if metered {
		exit = tc.exit
		tc.piped.Store(true) // from here the copy's end finishes the flow, not a close
	} else {
		r.active.Add(1)
		defer r.active.Add(-1)
		done = r.o.Metrics.Start(exit)
	}
	upBytes, downBytes, err := r.pipe(proxy.Raw(client), proxy.Raw(up))
	// The copy closed the raw connections; closing the wrappers releases their tracking.
	_ = client.Close()
	if metered {
		tc.up.Add(upBytes)
		tc.down.Add(downBytes)
		_ = up.Close()
		tc.finish()
	} else {
		done(upBytes, downBytes)
		_ = up.Close()
	}
	if err != nil && r.o.Debug {
		r.o.Log.Debug("proxied flow ended", "exit", exit, "err", err)
	}
}

// trackingListener registers every accepted connection with its pod, so closing the
// workload ends its proxied connections too.
type trackingListener struct {
	net.Listener
	p        *pod
	onAccept func(*trackedConn) // prepares the connection before it is tracked
}

func (l trackingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, p: l.p}
		if l.onAccept != nil {
			l.onAccept(tc)
		}
		if l.p.track(tc) {
			return tc, nil
		}
		tc.Close()
	}
}

type trackedConn struct {
	net.Conn
	p    *pod
	exit string        // the exit a dialed connection goes through ("" for client connections)
	key  sockowner.Key // a client connection's tuple (for process lookups)
	// onClose runs once the connection is closed (every Close calls it: it must be
	// idempotent). Set before the connection is tracked.
	onClose func()

	// A dialed connection is one flow (meterFlow): up and down count the bytes written
	// to it and read from it through Read and Write (a forwarded exchange, the bytes
	// written ahead of a tunnel), and a tunnel's copy adds its own (proxyPipe). finish
	// counts the flow out once; it runs when the connection closes, or, once piped, when
	// the copy is over.
	up, down atomic.Int64
	piped    atomic.Bool
	finish   func()
}

func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.down.Add(int64(n))
	return n, err
}

func (c *trackedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.up.Add(int64(n))
	return n, err
}

// meterFlow makes dialed connection c a flow of its exit, active and counted in
// Shutdown's drain (which the caller joined) from now until finish; its bytes are counted
// then. Call it before c is tracked: closing the workload may close c at once.
func (r *Relay) meterFlow(c *trackedConn) {
	r.active.Add(1)
	done := r.o.Metrics.Start(c.exit)
	c.finish = sync.OnceFunc(func() {
		done(c.up.Load(), c.down.Load())
		r.active.Add(-1)
		r.flowWG.Done()
	})
	c.onClose = func() {
		if !c.piped.Load() {
			c.finish()
		}
	}
}

func (c *trackedConn) Close() error {
	c.p.untrack(c)
	err := c.Conn.Close()
	if c.onClose != nil {
		c.onClose()
	}
	return err
}

// clientKey carries a proxy client connection's owner-lookup key in its requests' context.
type clientKey struct{}

// ownerKey marks each proxy client connection with its tuple, so a policy with process
// rules can find the program that connected; the owner is looked up once per connection
// (kept-alive requests reuse it) and forgotten when the connection closes, also when the
// workload goes away. The netns path is the pod's when the connection is made (a
// registration may move it to another path of the same netns: Refresh).
func (r *Relay) ownerKey(p *pod) func(*trackedConn) {
	return func(tc *trackedConn) {
		k := sockowner.Key{Netns: p.w.Load().Netns, Src: addrPort(tc.RemoteAddr()), Dst: addrPort(tc.LocalAddr())}
		tc.key = k
		tc.onClose = sync.OnceFunc(func() { r.o.Owners.Forget(k) })
	}
}

// proxyConnContext hands a client connection's tuple to its requests' dials.
func proxyConnContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*trackedConn); ok && tc.key.Netns != "" {
		return context.WithValue(ctx, clientKey{}, tc.key)
	}
	return ctx
}

// NetConn exposes the TCP connection (for splice and CloseWrite).
func (c *trackedConn) NetConn() net.Conn { return c.Conn }

func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// proxyDial decides one proxied request and dials its exit. The proxies know the
// hostname exactly (CONNECT, SOCKS5 domain addresses, the Host of a forwarded request).
func (r *Relay) proxyDial(p *pod) proxy.DialFunc {
	return func(ctx context.Context, t upstream.Target) (net.Conn, error) {
		// A proxied flow counts in Shutdown's drain from its request until its exit's
		// connection closes (the forwarded exchange is over and the connection is not
		// kept) or, for a tunnel, its copy ends, as a transparent flow counts from its
		// accept (meterFlow).
		if !r.join() {
			return nil, ErrClosed
		}
		joined := true // until the dialed connection's close takes over
		defer func() {
			if joined {
				r.flowWG.Done()
			}
		}()
		w := p.w.Load()
		id := r.flowSeq.Add(1)
		r.total.Add(1)
		port := t.Port
		if port == 0 {
			port = t.Addr.Port()
		}
		dst := netip.AddrPortFrom(t.Addr.Addr().Unmap(), port)
		f := rules.Flow{Labels: w.Labels, LabelKeys: w.labelKeys, Image: w.Image, Host: t.Host, Dst: dst, At: time.Now(), ID: id}
		pol := r.o.Policy()
		if pn, ok := pol.(processNeeder); ok && pn.NeedsProcess() {
			if k, ok := ctx.Value(clientKey{}).(sockowner.Key); ok {
				f.Process = r.owner(k, w.ID, id)
			}
		}
		// A name whose address could change the decision (cidr rules, the pattern form,
		// the metadata guard before a gateway) is resolved once here and decided for every address it has (decideEach); a direct
		// dial then tries the addresses that were checked, and no exit looks the name up
		// again unless the name itself decided (NameDecided).
		var checked []netip.AddrPort // the resolved addresses the decision holds for, in dial order
		var resolveErr error
		var d rules.Decision
		decided := false
		if an, ok := pol.(addrNeeder); ok && t.Host != "" && !dst.Addr().IsValid() && an.NeedsAddr() {
			rctx, cancel := context.WithTimeout(ctx, r.o.ConnectTimeout)
			addrs, err := r.o.resolve(rctx, t.Host)
			cancel()
			if err == nil && len(addrs) == 0 {
				err = &net.DNSError{Err: "no addresses", Name: t.Host, IsNotFound: true}
			}
			if err != nil {
				resolveErr = err
			} else {
				d, checked = decideEach(pol, &f, addrs, port)
				dst, decided = f.Dst, true
			}
		}
		if !decided {
			d = pol.Decide(&f)
		}
		r.o.Metrics.Decided(d.Exit, d.Dimension.String(), d.Rule, time.Since(f.At))
		if r.o.Debug {
			r.o.Log.Debug("decision", "workload", w.ID, "flow", id, "host", t.Host, "dst", dst, "exit", d.Exit, "rule", d.Rule, "dimension", d.Dimension.String())
		}
		denied := &proxy.Denied{Rule: d.Rule, Dimension: d.Dimension.String(), Exit: d.Exit, Note: d.Note}
		var dial DialFunc
		switch d.Exit {
		case rules.ExitDeny:
			r.deny(d, &f)
			return nil, denied
		case rules.ExitDirect:
			dial = func(ctx context.Context, w *api.Workload, _ Dest) (net.Conn, error) {
				switch {
				case resolveErr != nil:
					return nil, resolveErr // the same lookup would fail again
				case len(checked) > 0:
					// No second lookup: the addresses that were checked, in order.
					return netns.DialFirst(ctx, checked, func(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
						return r.dialAddrIn(ctx, p, w.Netns, ap)
					})
				case dst.Addr().IsValid():
					return r.dialAddrIn(ctx, p, w.Netns, dst)
				}
				return r.dialIn(ctx, p, w.Netns, t.String())
			}
		default:
			dial = r.o.Exits[d.Exit]
			switch {
			case NameDecided(pol, &f, d):
				// The exit resolves the name itself.
			case dst.Addr().IsValid():
				f.Host = "" // the address that was checked, not the name (see NameDecided)
				if exit := dial; exit != nil && len(checked) > 1 {
					// Every address that was checked, in order, as a direct dial tries
					// them: the far side may not reach the first one the resolver gave.
					// Each attempt is its own flow to its own address (FlowFrom): a
					// next hop that dials the flow it is handed (the attach side) must
					// not be handed the first address every time.
					dial = func(ctx context.Context, w *api.Workload, _ Dest) (net.Conn, error) {
						return netns.DialFirst(ctx, checked, func(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
							g := f
							g.Dst = ap
							return exit(withDecision(ctx, &g, &d, pol, p.ns), w, Dest{Addr: ap, Port: port})
						})
					}
				}
			case resolveErr != nil && !destinationFree(d) && dial != nil:
				// The name did not resolve here, so the address rules never saw an
				// address, and the decision (a port rule, the default, `*`) is one they
				// could have preempted: the far side would resolve the name to an address
				// nothing checked. Fail as a direct dial of it fails.
				dial = func(context.Context, *api.Workload, Dest) (net.Conn, error) { return nil, resolveErr }
			}
			// Otherwise no address is known and none could change the decision (the
			// policy has no address rules, or a label, image or process rule decided):
			// the exit gets the name, the only destination there is.
		}
		if dial == nil {
			r.unavailable(d, &f, w.ID)
			return nil, denied
		}
		r.count(d.Exit)
		dctx, cancel := context.WithTimeout(ctx, r.o.ConnectTimeout)
		defer cancel()
		dialStart := time.Now()
		c, err := dial(withDecision(dctx, &f, &d, pol, p.ns), &w.Workload, Dest{Addr: dst, Host: f.Host, Port: port})
		r.o.Metrics.Dialed(d.Exit, time.Since(dialStart), err)
		if err != nil {
			r.record(d, &f, audit.Reason(err))
			if r.o.Debug {
				return nil, err
			}
			// The text loses the destination; errors.Is/As still see the whole chain, so
			// the proxies answer 504, SOCKS 0x05 or 0x04 as the cause says.
			return nil, audit.Redacted(err)
		}
		// Tracked before the record, as carry does: a workload closed while the exit
		// was being dialed gets no tunnel, and its record says so.
		// From here the connection's close counts the flow out (meterFlow).
		tc := &trackedConn{Conn: c, p: p, exit: d.Exit}
		r.meterFlow(tc)
		joined = false
		if !p.track(tc) {
			tc.Close()
			r.record(d, &f, errCut.Error())
			return nil, ErrClosed
		}
		r.record(d, &f, "")
		return tc, nil
	}
}

// decideEach decides flow f for every address its name resolved to, in the resolver's
// order, and returns the flow's decision and the addresses it holds for; f.Dst is left
// at the first of them (the denied one when the flow is denied).
//
// One denied address denies the flow. Deciding per address and dialing only the allowed
// ones would keep the relay's own dial off the denied address, but a name that also
// points somewhere the policy forbids is not one to carry: an exit handed the name picks
// among its addresses on its own, and whether the flow goes out would hang on the order
// of a DNS answer that its owner chooses. Otherwise the first address's decision is the
// flow's, and only the addresses decided exactly the same way are kept: an address
// another rule sends to another exit is not dialed through this one.
func decideEach(pol Decider, f *rules.Flow, addrs []netip.Addr, port uint16) (rules.Decision, []netip.AddrPort) {
	var d rules.Decision
	var same []netip.AddrPort
	for i, a := range addrs {
		f.Dst = netip.AddrPortFrom(a.Unmap(), port)
		di := pol.Decide(f)
		if di.Exit == rules.ExitDeny {
			return di, nil
		}
		if i == 0 {
			d = di
		}
		if di == d {
			same = append(same, f.Dst)
		}
	}
	f.Dst = same[0]
	return d, same
}

// destinationFree reports whether d came from a tier that is walked before any rule on
// the destination (label, image, process): any address would have been decided the same.
func destinationFree(d rules.Decision) bool {
	switch d.Dimension {
	case rules.DimLabel, rules.DimImage, rules.DimProcess:
		return true
	}
	return false
}
