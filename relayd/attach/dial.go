package attach

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/upstream"
)

// proxyError marks a dial that failed because of the proxy setting itself (unparsable or
// unsupported), not the network.
type proxyError struct{ err error }

func (e *proxyError) Error() string { return e.err.Error() }
func (e *proxyError) Unwrap() error { return e.err }

// dial connects to the flow's destination from this side's network: through the proxy
// the policy named (a PAC's `PROXY host:port`), else through the proxy this side's
// environment names for it, else directly. It returns the proxy used ("" for none).
func (c *Client) dial(ctx context.Context, h *Header, pacProxy string) (net.Conn, string, error) {
	t := upstream.Target{Host: h.Host, Addr: h.Dst, Port: h.Port}
	via := pacProxy
	if via == "" {
		var err error
		if via, err = c.envProxy(h); err != nil {
			return nil, "", &proxyError{err}
		}
	}
	if via == "" {
		conn, err := c.o.dialDest(ctx, "tcp", h.target())
		return conn, "", err
	}
	if !c.o.AllowLocal && h.namesThisMachine() {
		// The proxy would reach its own machine, often this one (a local corporate
		// proxy helper).
		return nil, "", errThisMachine
	}
	u, err := normalizeProxy(via)
	if err != nil {
		return nil, via, &proxyError{err}
	}
	d, err := upstream.New(u, c.o.ConnectTimeout, c.o.dialNet)
	if err != nil {
		return nil, via, &proxyError{err}
	}
	conn, err := d.Dial(ctx, t)
	return conn, d.String(), err
}

// errThisMachine refuses a destination on the attach side's own machine
// (netns.HostLocal). The attach side lends a workload its network (VPN, corporate
// network), not the services of the operator's own machine: whatever listens on its
// loopback only (a `kubectl proxy` with the operator's credentials, a local database, an
// agent's API) and, on a cloud machine, the metadata service and its credentials. The
// daemon's gateway exit refuses the node's own addresses with the same predicate. It
// names no address: it goes back to the daemon, into its log and audit records.
var errThisMachine = errors.New("destination is on this machine itself (loopback, link-local, unspecified or the metadata address): refused")

// namesThisMachine reports whether the header's destination is the machine itself by
// what it says: an address on it, or a name that means it (localhost). A name that
// resolves there is caught when it is dialled (destDialer).
func (h *Header) namesThisMachine() bool {
	if h.Host == "" {
		return h.Dst.IsValid() && netns.HostLocal(h.Dst.Addr())
	}
	host := strings.TrimSuffix(strings.ToLower(h.Host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return netns.HostLocal(a)
	}
	return false
}

// destDialer dials destinations directly, refusing every address on this machine unless
// allowLocal: each address a name resolves to is checked as it is dialled, so no answer
// of the operator's DNS can lead a flow into the machine itself.
func destDialer(timeout time.Duration, allowLocal bool) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if allowLocal {
		d := &net.Dialer{Timeout: timeout}
		return d.DialContext
	}
	d := &net.Dialer{Timeout: timeout, ControlContext: func(_ context.Context, _, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil || netns.HostLocal(ap.Addr()) {
			return errThisMachine
		}
		return nil
	}}
	return d.DialContext
}

// normalizeProxy maps the proxy URL forms of PAC results and environment variables onto
// those package upstream dials: http:// (CONNECT) and socks5://.
func normalizeProxy(raw string) (string, error) {
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("proxy %q does not parse", raw)
	}
	switch u.Scheme {
	case "http", "socks5":
	case "socks5h", "socks":
		u.Scheme = "socks5"
	default:
		return "", fmt.Errorf("proxy scheme %q is not supported here (http, socks5)", u.Scheme)
	}
	if u.Port() == "" {
		switch u.Scheme {
		case "http":
			u.Host = net.JoinHostPort(u.Hostname(), "80")
		default:
			u.Host = net.JoinHostPort(u.Hostname(), "1080")
		}
	}
	return u.String(), nil
}

// envProxy is the proxy this side's environment names for the flow's destination, as
// curl and Go programs would read it: HTTP_PROXY for port 80, HTTPS_PROXY for every
// other port (a TCP tunnel), ALL_PROXY when those are unset, NO_PROXY excluding.
func (c *Client) envProxy(h *Header) (string, error) {
	get := func(k string) string {
		if v := c.o.Getenv(k); v != "" {
			return v
		}
		return c.o.Getenv(strings.ToLower(k))
	}
	all := get("ALL_PROXY")
	cfg := httpproxy.Config{HTTPProxy: get("HTTP_PROXY"), HTTPSProxy: get("HTTPS_PROXY"), NoProxy: get("NO_PROXY")}
	if cfg.HTTPProxy == "" {
		cfg.HTTPProxy = all
	}
	if cfg.HTTPSProxy == "" {
		cfg.HTTPSProxy = all
	}
	if cfg.HTTPProxy == "" && cfg.HTTPSProxy == "" {
		return "", nil
	}
	scheme := "https"
	if h.Port == 80 {
		scheme = "http"
	}
	u, err := cfg.ProxyFunc()(&url.URL{Scheme: scheme, Host: h.target()})
	if err != nil {
		// Never fall back to a direct dial the operator's environment did not ask for.
		return "", fmt.Errorf("proxy environment: %w", err)
	}
	if u == nil {
		return "", nil
	}
	return u.String(), nil
}

// connectServer opens the TCP connection to the daemon's attach listener, through the
// proxy this side's environment names for https://SERVER when there is one (as kubectl
// reaches an API server), else directly. TLS runs end to end over it either way.
func (c *Client) connectServer(ctx context.Context) (net.Conn, error) {
	host, port, _ := net.SplitHostPort(c.o.Server)
	h := Header{Host: host}
	if p, err := strconv.Atoi(port); err == nil {
		h.Port = uint16(p)
	}
	via, err := c.envProxy(&h)
	if err != nil {
		return nil, err
	}
	if via == "" {
		return c.o.dialServer(ctx, "tcp", c.o.Server)
	}
	u, err := normalizeProxy(via)
	if err != nil {
		return nil, err
	}
	d, err := upstream.New(u, c.o.ConnectTimeout, c.o.dialServer)
	if err != nil {
		return nil, err
	}
	conn, err := d.Dial(ctx, upstream.Target{Host: host, Port: h.Port})
	if err != nil {
		return nil, fmt.Errorf("through %s: %w", d, err)
	}
	return conn, nil
}
