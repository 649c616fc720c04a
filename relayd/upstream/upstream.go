// Package upstream dials a destination through one configured upstream proxy: an HTTP
// proxy (CONNECT, optional Basic auth) or a SOCKS5 proxy (RFC 1928, optional RFC 1929
// username/password). When the destination's hostname is known it is handed to the
// upstream, which resolves it; otherwise the IP address is sent.
//
// It is not a policy layer and never falls back: a Dialer talks to exactly one upstream,
// and when that upstream is down, refuses the credentials or refuses the destination, the
// dial fails with an error saying which upstream and why. Errors never contain the
// destination (they end up in audit records and logs, which must not hold it).
//
// The negotiation itself is a Handshake, which does no I/O: a Dialer drives it over a
// blocking connection, and an event loop that carries connections without goroutines
// gets it from the Dialer (a Handshaker) and drives it over a non-blocking socket.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Target is one destination. Host is preferred when set (the upstream resolves it); Addr
// is used otherwise. Port is always set (when zero, Addr's port is used).
type Target struct {
	Host string
	Addr netip.AddrPort
	Port uint16
}

func (t Target) port() uint16 {
	if t.Port == 0 && t.Addr.IsValid() {
		return t.Addr.Port()
	}
	return t.Port
}

// hostOnly is the host part: Host when set, else the address (unmapped, zone kept).
func (t Target) hostOnly() string {
	if t.Host != "" {
		return t.Host
	}
	if t.Addr.IsValid() {
		return t.Addr.Addr().Unmap().String()
	}
	return ""
}

// String is the host:port form used for dialing and in CONNECT requests (IPv6 in
// brackets).
func (t Target) String() string {
	return net.JoinHostPort(t.hostOnly(), strconv.Itoa(int(t.port())))
}

// Valid reports whether the target names a host or an address, and a port.
func (t Target) Valid() bool { return t.hostOnly() != "" && t.port() != 0 }

// DialFunc opens the TCP connection to the upstream itself (the relay passes one that
// creates the socket in the right netns with its mark).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Dialer reaches targets through one upstream.
type Dialer interface {
	Dial(ctx context.Context, t Target) (net.Conn, error)
	// String names the upstream as scheme://host:port, never with credentials.
	String() string
}

// Sentinel errors a caller can test with errors.Is; the returned errors wrap them with
// the upstream's name and the details.
var (
	// ErrAuth: the upstream refused our credentials, or wants credentials we lack.
	ErrAuth = errors.New("authentication failed")
	// ErrRefused: the upstream answered but would not connect to the target (an HTTP
	// status other than 2xx, or a SOCKS reply other than success).
	ErrRefused = errors.New("refused by upstream")
	// ErrProtocol: the upstream's answer was not valid for its protocol.
	ErrProtocol = errors.New("protocol error")
	// ErrTarget: the target cannot be expressed (no host or port, name too long).
	ErrTarget = errors.New("bad target")
)

// Option changes how New's Dialer speaks to its upstream.
type Option func(*options)

type options struct{ pipeline bool }

// Pipeline saves a round trip per connection. A socks5 upstream's Dialer sends its
// greeting, credentials and CONNECT request in one write instead of waiting for each
// answer: one round trip instead of two (three with credentials); only for servers that
// read a request sent ahead of their answer, as Dante does (microsocks does not, and
// every dial through it then times out). An http upstream's Handshake lets its caller send
// the tunnel's first bytes (a TLS ClientHello, an HTTP request) in the same write as the
// CONNECT request instead of after the answer (EarlyData); only for proxies that forward
// bytes sent ahead of their answer, as Squid does. Dial has no such bytes: through it, an
// http upstream's CONNECT goes alone.
func Pipeline() Option { return func(o *options) { o.pipeline = true } }

// DefaultConnectTimeout is used when New is given a timeout of zero or less.
const DefaultConnectTimeout = 10 * time.Second

// New parses rawURL (http://[user:pass@]host:port or socks5://[user:pass@]host:port) and
// returns a Dialer for it. connectTimeout bounds the TCP connect plus the handshake.
// base opens the TCP connection to the upstream; nil uses a plain net.Dialer.
func New(rawURL string, connectTimeout time.Duration, base DialFunc, opts ...Option) (Dialer, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	u, err := ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("upstream %w", err)
	}
	host, _, err := net.SplitHostPort(u.Host)
	name := u.Scheme + "://" + u.Host
	if err != nil || host == "" {
		return nil, fmt.Errorf("upstream %s: want host:port after the scheme", name)
	}
	if connectTimeout <= 0 {
		connectTimeout = DefaultConnectTimeout
	}
	if base == nil {
		var d net.Dialer
		base = d.DialContext
	}
	c := common{
		name:    name,
		addr:    u.Host,
		timeout: connectTimeout,
		base:    base,
	}
	if u.User != nil {
		c.user = u.User.Username()
		c.pass, c.hasPass = u.User.Password()
		c.hasUser = true
	}
	switch u.Scheme {
	case "http":
		d := &httpDialer{common: c, pipeline: o.pipeline}
		if c.hasUser {
			d.auth = proxyAuthorization(c.user, c.pass)
		}
		return d, nil
	case "socks5":
		if len(c.user) > 255 || len(c.pass) > 255 {
			return nil, fmt.Errorf("upstream %q: socks5 username and password are limited to 255 bytes", c.name)
		}
		if c.hasUser && c.user == "" {
			return nil, fmt.Errorf("upstream %q: empty socks5 username", c.name)
		}
		d := &socksDialer{common: c, pipeline: o.pipeline}
		if c.hasUser {
			d.auth = userPassRequest(c.user, c.pass)
		}
		return d, nil
	case "":
		return nil, fmt.Errorf("upstream %s: missing scheme (want http:// or socks5://)", c.name)
	default:
		return nil, fmt.Errorf("upstream %s: unsupported scheme %q (want http:// or socks5://)", c.name, u.Scheme)
	}
}

// encodeHint is the likely cause of an upstream URL that does not parse as
// scheme://host:port.
const encodeHint = "; percent-encode any '/', '?', '#', '@' or '%' in the user name or password"

// ParseURL parses an upstream URL and checks that it is scheme://[user:pass@]host:port
// and nothing more. Its errors start with "url" and never quote the URL or any part of
// it that may hold credentials: a password with an unencoded '/', '?' or '#' ends the
// authority early and lands in the path, query or fragment (or in url.Parse's own
// message), and the "host:port" before it is then the user name and the start of the
// password. The scheme is not checked.
func ParseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("url does not parse" + encodeHint)
	}
	switch {
	case u.Opaque != "" || u.Host == "":
		return nil, errors.New("url: want scheme://host:port")
	case u.Path != "" && u.Path != "/":
		return nil, errors.New("url has a path (want scheme://host:port)" + encodeHint)
	case u.RawQuery != "" || u.ForceQuery:
		return nil, errors.New("url has a query (want scheme://host:port)" + encodeHint)
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return nil, errors.New("url has a fragment (want scheme://host:port)" + encodeHint)
	}
	// A port that is no number may be the start of a password ("http://u:pw/"): not
	// quoted either, nor the host before it.
	if port := u.Port(); port != "" {
		if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
			return nil, errors.New("url: bad port (want 1 to 65535)" + encodeHint)
		}
	}
	return u, nil
}

type common struct {
	name    string // scheme://host:port, no credentials
	addr    string // host:port of the upstream
	timeout time.Duration
	base    DialFunc
	user    string
	pass    string
	hasUser bool
	hasPass bool
}

func (c *common) String() string { return c.name }

// Addr is the upstream's host:port as configured.
func (c *common) Addr() string { return c.addr }

// Timeout bounds the TCP connect plus the handshake.
func (c *common) Timeout() time.Duration { return c.timeout }

func (c *common) errorf(format string, args ...any) error {
	return fmt.Errorf("upstream %s: "+format, append([]any{c.name}, args...)...)
}

// connect dials the upstream and arms the handshake deadline: the returned cleanup must
// be called once the handshake is done (it clears the deadline and reports whether the
// context expired meanwhile). bound is the time connect and handshake have in all, for
// the words of a timeout (Handshake.bound).
func (c *common) connect(ctx context.Context, bound time.Duration) (net.Conn, context.Context, func() error, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	conn, err := c.base(ctx, "tcp", c.addr)
	if err != nil {
		err = c.errorf("connect: %w", dialReason(ctx.Err(), bound, err))
		cancel()
		return nil, nil, nil, err
	}
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	// A cancelled parent context interrupts the handshake too.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	done := func() error {
		stopped := stop()
		cancel()
		if !stopped {
			return ctx.Err()
		}
		return conn.SetDeadline(time.Time{})
	}
	return conn, ctx, done, nil
}

// dialReason makes a connect failure say why in words, keeping the original error in the
// chain (errors.Is still finds ECONNREFUSED or a deadline). ctxErr is the error of the
// context the connect ran under.
func dialReason(ctxErr error, timeout time.Duration, err error) error {
	switch {
	case errors.Is(ctxErr, context.DeadlineExceeded):
		return &wordsError{fmt.Sprintf("timed out after %v", timeout), err}
	case errors.Is(ctxErr, context.Canceled):
		return &wordsError{"cancelled", err}
	case isRefused(err):
		return &wordsError{"connection refused", err}
	case errors.Is(err, syscall.ENETUNREACH):
		return &wordsError{"network unreachable", err}
	case errors.Is(err, syscall.EHOSTUNREACH):
		return &wordsError{"host unreachable", err}
	}
	return err
}

// wordsError reads as a short phrase but unwraps to the full error.
type wordsError struct {
	words string
	err   error
}

func (e *wordsError) Error() string { return e.words }
func (e *wordsError) Unwrap() error { return e.err }

// handshakeErr turns an I/O error during the handshake into words; ctxErr is the error
// of the context the handshake ran under (nil while it runs on), timeout the bound a
// timeout is said to have expired (Handshake.bound).
func (c *common) handshakeErr(ctxErr error, timeout time.Duration, stage string, err error) error {
	var ne net.Error
	if ctxErr != nil || (errors.As(err, &ne) && ne.Timeout()) {
		if errors.Is(ctxErr, context.Canceled) {
			return c.errorf("%s: cancelled: %w", stage, err)
		}
		return c.errorf("%s: timed out after %v: %w", stage, timeout, err)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return c.errorf("%s: upstream closed the connection", stage)
	}
	return c.errorf("%s: %w", stage, err)
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
