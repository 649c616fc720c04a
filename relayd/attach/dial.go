package attach

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
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
	if !c.o.AllowLocal {
		// The proxy would reach its own machine, often this one (a local corporate
		// proxy helper). It resolves the name itself, so a name this side cannot tell
		// apart from an address is not handed to it either.
		if h.namesThisMachine() {
			return nil, "", errThisMachine
		}
		if !h.proxyNameable() {
			return nil, "", errNotHostName
		}
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

// errNotHostName refuses, on the way to a proxy, a destination name that is neither an
// address nor a well-formed host name ("1.2.3.4.5", "256.1", "a b"): the proxy resolves
// it, and a resolver more lenient than this side's parsing could take it for an address
// of its own machine. It is refused with E_LOCAL, like a destination that names it.
var errNotHostName = errors.New("destination name is neither an address nor a well-formed host name, and a proxy could take it for its own machine: refused")

// localNames are the names that mean the machine itself in the hosts files of common
// systems, beyond localhost and *.localhost.
var localNames = []string{"localhost.localdomain", "ip6-localhost", "ip6-loopback"}

// hostname is this machine's own name, which resolves to one of its addresses
// (127.0.1.1 on Debian) on the machine itself, where a proxy helper often runs.
var hostname = func() string {
	h, _ := os.Hostname()
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// namesThisMachine reports whether the header's destination is the machine itself by
// what it says: an address on it, in any of the forms a resolver takes for an address
// (inet_aton's "127.1", "2130706433", "0x7f000001", "0177.0.0.1" as well as the usual
// ones), or a name that means it (localhost, the machine's own name). A name that
// resolves there is caught when it is dialled directly (destDialer); a proxy resolves it
// out of this side's sight.
func (h *Header) namesThisMachine() bool {
	if h.Host == "" {
		return h.Dst.IsValid() && netns.HostLocal(h.Dst.Addr())
	}
	host := strings.TrimSuffix(strings.ToLower(h.Host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") || slices.Contains(localNames, host) {
		return true
	}
	if hn := hostname(); hn != "" {
		short, _, _ := strings.Cut(hn, ".")
		if host == hn || host == short {
			return true
		}
	}
	if a, ok := hostAddr(host); ok {
		return netns.HostLocal(a)
	}
	return false
}

// proxyNameable reports whether the header's destination may be handed to a proxy as it
// is: an address (netip's forms or inet_aton's), or a well-formed host name whose last
// label is not all digits (RFC 3696 §2), so that no resolver takes it for an address.
func (h *Header) proxyNameable() bool {
	if h.Host == "" {
		return true
	}
	host := strings.TrimSuffix(h.Host, ".")
	if _, ok := hostAddr(host); ok {
		return true
	}
	if host == "" || len(host) > 253 {
		return false
	}
	labels := strings.Split(host, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return false
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	return strings.ContainsFunc(last, func(r rune) bool { return r < '0' || r > '9' })
}

// hostAddr parses host as an address: an IP literal (IPv6 in brackets too), or an IPv4
// address in any form inet_aton(3) takes, which is what getaddrinfo, and with it most
// proxies, does with a name before asking DNS.
func hostAddr(host string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")); err == nil {
		return a, true
	}
	return parseInetAton(host)
}

// parseInetAton parses s as inet_aton(3) does: one to four parts separated by dots, each
// decimal, octal (a leading 0) or hexadecimal (a leading 0x), the last part filling the
// bytes the others left ("127.1" is 127.0.0.1, "2130706433" and "0x7f000001" are too).
// It does not take inet_aton's trailing blank and junk: a host with a blank is refused
// on the way to a proxy anyway (proxyNameable).
func parseInetAton(s string) (netip.Addr, bool) {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		v, ok := atonPart(p)
		if !ok {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	// Every part but the last is one byte; the last fills the rest.
	var a uint64
	for _, v := range vals[:len(vals)-1] {
		if v > 0xff {
			return netip.Addr{}, false
		}
		a = a<<8 | v
	}
	restBits := 8 * (4 - (len(vals) - 1))
	last := vals[len(vals)-1]
	if last >= 1<<restBits {
		return netip.Addr{}, false
	}
	a = a<<restBits | last
	return netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}), true
}

// atonPart parses one part of an inet_aton address: decimal, octal after a leading 0,
// hexadecimal after 0x (which alone is 0, as in glibc). Values past 32 bits fail.
func atonPart(p string) (uint64, bool) {
	if p == "" || p[0] < '0' || p[0] > '9' {
		return 0, false
	}
	base, digits := uint64(10), p
	if p[0] == '0' && len(p) > 1 {
		if p[1] == 'x' || p[1] == 'X' {
			base, digits = 16, p[2:]
		} else {
			base, digits = 8, p[1:]
		}
	}
	var v uint64
	for i := 0; i < len(digits); i++ {
		var d uint64
		switch c := digits[i]; {
		case '0' <= c && c <= '9':
			d = uint64(c - '0')
		case base == 16 && 'a' <= c && c <= 'f':
			d = uint64(c-'a') + 10
		case base == 16 && 'A' <= c && c <= 'F':
			d = uint64(c-'A') + 10
		default:
			return 0, false
		}
		if d >= base {
			return 0, false
		}
		if v = v*base + d; v > 0xffffffff {
			return 0, false
		}
	}
	return v, true
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
