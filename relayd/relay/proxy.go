package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/proxy"
	"github.com/kl-egress/kl/relayd/upstream"
	"github.com/kl-egress/kl/rules"
)

// openProxy starts the proxy-mode servers on the pod's loopback.
func (r *Relay) openProxy(p *pod, w api.Workload) error {
	lh, err := r.o.listen(w.Netns, "tcp4", fmt.Sprintf("127.0.0.1:%d", r.o.HTTPPort))
	if err != nil {
		return err
	}
	ls, err := r.o.listen(w.Netns, "tcp4", fmt.Sprintf("127.0.0.1:%d", r.o.SOCKSPort))
	if err != nil {
		lh.Close()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.lns = []net.Listener{lh, ls}
	p.ls = api.Listeners{HTTP: r.o.HTTPPort, SOCKS: r.o.SOCKSPort}
	dial := r.proxyDial(p)
	for _, s := range []struct {
		ln    net.Listener
		serve func(context.Context, net.Listener, proxy.DialFunc, *slog.Logger) error
	}{{lh, proxy.ServeHTTP}, {ls, proxy.ServeSOCKS5}} {
		p.serve.Add(1)
		go func() {
			defer p.serve.Done()
			if err := s.serve(ctx, trackingListener{s.ln, p}, dial, r.o.Log); err != nil {
				r.o.Log.Warn("proxy stopped", "workload", w.ID, "err", err)
			}
		}()
	}
	return nil
}

// trackingListener registers every accepted connection with its pod, so closing the
// workload ends its proxied connections too.
type trackingListener struct {
	net.Listener
	p *pod
}

func (l trackingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.p.track(c) {
			return &trackedConn{Conn: c, p: l.p}, nil
		}
		c.Close()
	}
}

type trackedConn struct {
	net.Conn
	p *pod
}

func (c *trackedConn) Close() error {
	c.p.untrack(c.Conn)
	return c.Conn.Close()
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
		w := p.w.Load()
		id := r.flowSeq.Add(1)
		r.total.Add(1)
		port := t.Port
		if port == 0 {
			port = t.Addr.Port()
		}
		dst := netip.AddrPortFrom(t.Addr.Addr().Unmap(), port)
		f := rules.Flow{Labels: w.Labels, Image: w.Image, Host: t.Host, Dst: dst, At: time.Now(), ID: id}
		d := r.o.Policy().Decide(&f)
		r.o.Metrics.Decided(d.Exit, d.Dimension.String(), d.Rule, time.Since(f.At))
		if r.o.Debug {
			r.o.Log.Debug("decision", "workload", w.ID, "flow", id, "host", t.Host, "dst", dst, "exit", d.Exit, "rule", d.Rule, "dimension", d.Dimension.String())
		}
		denied := &proxy.Denied{Rule: d.Rule, Dimension: d.Dimension.String(), Exit: d.Exit, Note: d.Note}
		var dial DialFunc
		switch d.Exit {
		case rules.ExitDeny:
			r.count(rules.ExitDeny)
			r.record(d, f.At, "")
			return nil, denied
		case rules.ExitDirect:
			dial = func(ctx context.Context, w *api.Workload, _ Dest) (net.Conn, error) {
				return r.o.dial(ctx, w.Netns, r.o.Mark, "tcp", t.String())
			}
		default:
			dial = r.o.Exits[d.Exit]
		}
		if dial == nil {
			r.count("refused")
			r.o.Log.Warn("flow refused: exit not available in this relay", "workload", w.ID, "flow", id, "exit", d.Exit, "rule", d.Rule)
			r.record(d, f.At, unavailable(d.Exit))
			return nil, denied
		}
		r.count(d.Exit)
		dctx, cancel := context.WithTimeout(ctx, r.o.ConnectTimeout)
		defer cancel()
		dialStart := time.Now()
		c, err := dial(dctx, w, Dest{Addr: dst, Host: t.Host, Port: port})
		r.o.Metrics.Dialed(d.Exit, time.Since(dialStart), err)
		if err != nil {
			r.record(d, f.At, audit.Reason(err))
			if r.o.Debug {
				return nil, err
			}
			return nil, redactedError{err}
		}
		r.record(d, f.At, "")
		if !p.track(c) {
			c.Close()
			return nil, ErrClosed
		}
		return &trackedConn{Conn: c, p: p}, nil
	}
}

// redactedError keeps a dial error's kind (errors.Is still sees ECONNREFUSED, timeouts,
// upstream.ErrAuth ...) but not its text, which names the destination.
type redactedError struct{ err error }

func (e redactedError) Error() string {
	var oe *net.OpError
	if errors.As(e.err, &oe) && oe.Err != nil {
		return "dial: " + oe.Err.Error()
	}
	return "dial failed (details hidden; enable debug)"
}

func (e redactedError) Unwrap() error { return e.err }
