package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kl-egress/kl/relayd/upstream"
)

// badRequest is a request kl refuses to proxy: the status to answer and what was wrong.
type badRequest struct {
	status int
	msg    string
}

func (e *badRequest) Error() string { return e.msg }

func bad(status int, format string, args ...any) *badRequest {
	return &badRequest{status: status, msg: fmt.Sprintf(format, args...)}
}

// hopHeaders are dropped when forwarding (RFC 9110 §7.6.1), plus every Proxy-* header.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// clientReader is what a client connection's bufio.Reader reads from. While a request's
// header is read it lets through only the bytes left of the header bound and keeps a copy
// of what it let through, so that the header is measured in the bytes the client sent,
// wherever they were buffered.
type clientReader struct {
	r       io.Reader
	reading bool   // a header is being read
	left    int64  // while reading: the bytes that may still be read
	over    bool   // a read wanted more than left
	head    []byte // while reading: the header so far, and what was buffered behind it
	// begun is set once a byte of the header being read has come (closeIdle clears it
	// and reads it from another goroutine).
	begun atomic.Bool
}

func (cr *clientReader) Read(p []byte) (int, error) {
	if !cr.reading {
		return cr.r.Read(p)
	}
	if cr.left <= 0 {
		cr.over = true
		return 0, io.EOF
	}
	if int64(len(p)) > cr.left {
		p = p[:cr.left]
	}
	n, err := cr.r.Read(p)
	if n > 0 {
		cr.begun.Store(true)
	}
	cr.left -= int64(n)
	cr.head = append(cr.head, p[:n]...)
	return n, err
}

// readRequest reads one request's header from br, whose source is cr, with the header
// bound limit, and returns the bytes it took from br (valid until the next call). A
// pipelined request's header may have started in br's buffer already: those bytes count
// towards the bound, as the ones read after them do.
func (cr *clientReader) readRequest(br *bufio.Reader, limit int64) (req *http.Request, head []byte, over bool, err error) {
	buffered, _ := br.Peek(br.Buffered())
	cr.head = append(cr.head[:0], buffered...)
	cr.left, cr.over, cr.reading = limit-int64(len(buffered)), false, true
	req, err = http.ReadRequest(br)
	cr.reading = false
	head = cr.head[:len(cr.head)-br.Buffered()]
	if cap(cr.head) > 8<<10 {
		cr.head = nil // a large copy is not kept for the next request
	}
	return req, head, int64(len(head)) > limit || err != nil && cr.over, err
}

// headerHasField reports whether head, a request's header as sent (request line, field
// lines, empty line), has a field called name. net/http drops a field it overrides (a
// Content-Length next to Transfer-Encoding), so only the bytes tell.
func headerHasField(head []byte, name string) bool {
	_, fields, _ := bytes.Cut(head, []byte("\n")) // past the request line
	for len(fields) > 0 {
		var line []byte
		line, fields, _ = bytes.Cut(fields, []byte("\n"))
		// A field name ends at its colon (net/http refuses one with a space before it);
		// a folded continuation line starts with a space or tab.
		if len(line) > len(name) && line[len(name)] == ':' && bytes.EqualFold(line[:len(name)], []byte(name)) {
			return true
		}
	}
	return false
}

// readProxyRequest reads one request from br, whose source is cr, and works out where it
// goes: the CONNECT authority, or the host of an absolute http:// URI. The request's
// header (request line included) may be maxHeader bytes long.
func readProxyRequest(br *bufio.Reader, cr *clientReader, maxHeader int64, log *slog.Logger) (*http.Request, upstream.Target, error) {
	req, head, over, err := cr.readRequest(br, maxHeader)
	if over {
		return nil, upstream.Target{}, bad(http.StatusRequestHeaderFieldsTooLarge, "request header over %d bytes", maxHeader)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, upstream.Target{}, err
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if len(head) == 0 {
				// Not a byte of a request: an idle kept-alive connection (or one that
				// never said anything) ends silently, as net/http's server ends it. A
				// 408 there could cross a request the client sends at that moment
				// and be read as its answer.
				return nil, upstream.Target{}, io.EOF
			}
			return nil, upstream.Target{}, bad(http.StatusRequestTimeout, "timed out waiting for the request headers")
		}
		return nil, upstream.Target{}, bad(http.StatusBadRequest, "malformed request: %s", requestErrWords(err))
	}
	if req.TransferEncoding != nil && headerHasField(head, "Content-Length") {
		// Both framings: maybe a smuggling attempt, where the origin or another hop
		// would read the body by the other one (RFC 9112 §6.1). net/http let the
		// chunked one win and dropped Content-Length, so the request goes on chunked;
		// the connection closes after the answer, so nothing the client sent behind
		// it is read as a request of its own.
		req.Close = true
		log.Warn("http proxy: request with both Content-Length and Transfer-Encoding: forwarding it chunked, closing the connection after the answer")
	}
	if req.ProtoMajor != 1 {
		return req, upstream.Target{}, bad(http.StatusHTTPVersionNotSupported, "HTTP/%d.%d is not supported", req.ProtoMajor, req.ProtoMinor)
	}
	if req.Method == http.MethodConnect {
		// CONNECT host:port HTTP/1.1 — ReadRequest puts the authority in URL.Host.
		if req.URL == nil || req.URL.Host == "" || req.URL.Path != "" || req.URL.Scheme != "" {
			return req, upstream.Target{}, bad(http.StatusBadRequest, "CONNECT needs host:port as its target")
		}
		t, err := authorityTarget(req.URL.Host, 0)
		if err != nil {
			return req, t, bad(http.StatusBadRequest, "bad CONNECT target: %v", err)
		}
		return req, t, nil
	}
	if req.URL == nil || !req.URL.IsAbs() || req.URL.Host == "" {
		return req, upstream.Target{}, bad(http.StatusBadRequest, "not a proxy request: the request target must be an absolute http:// URI or CONNECT")
	}
	if !strings.EqualFold(req.URL.Scheme, "http") {
		return req, upstream.Target{}, bad(http.StatusNotImplemented, "scheme %q is not supported (use CONNECT for https)", req.URL.Scheme)
	}
	if req.URL.User != nil {
		return req, upstream.Target{}, bad(http.StatusBadRequest, "credentials in the request URI are not supported")
	}
	t, err := authorityTarget(req.URL.Host, 80)
	if err != nil {
		return req, t, bad(http.StatusBadRequest, "bad request URI host: %v", err)
	}
	return req, t, nil
}

// requestErrWords keeps only the kind of a ReadRequest error (its text may quote the
// request line, which names the destination).
func requestErrWords(err error) string {
	s := err.Error()
	switch {
	case strings.Contains(s, "malformed HTTP request"):
		return "malformed request line"
	case strings.Contains(s, "malformed HTTP version"):
		return "malformed HTTP version"
	case strings.Contains(s, "malformed MIME header"):
		return "malformed header line"
	case strings.Contains(s, "invalid header") || strings.Contains(s, "header"):
		return "invalid header"
	case strings.Contains(s, "unexpected EOF"):
		return "request ended early"
	case strings.Contains(s, "Transfer-Encoding") || strings.Contains(s, "Content-Length"):
		return "bad message framing"
	case strings.Contains(s, "invalid URI") || strings.Contains(s, "parse"):
		return "invalid request URI"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timed out waiting for the request"
	}
	return "unreadable request"
}

// authorityTarget parses host[:port] (IPv6 in brackets). defPort is used when the port is
// absent; 0 makes the port mandatory.
func authorityTarget(hostport string, defPort uint16) (upstream.Target, error) {
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil {
		if defPort == 0 {
			return upstream.Target{}, errors.New("want host:port")
		}
		host, portStr = strings.TrimSuffix(strings.TrimPrefix(hostport, "["), "]"), ""
	}
	port := defPort
	if portStr != "" {
		p, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil || p == 0 {
			return upstream.Target{}, fmt.Errorf("bad port %q", portStr)
		}
		port = uint16(p)
	} else if defPort == 0 {
		return upstream.Target{}, errors.New("missing port")
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return upstream.Target{}, errors.New("zoned IPv6 addresses are not supported")
		}
		return upstream.Target{Addr: netip.AddrPortFrom(ip.Unmap(), port), Port: port}, nil
	}
	h, err := domainTarget(host)
	if err != nil {
		return upstream.Target{}, err
	}
	return upstream.Target{Host: h, Port: port}, nil
}

// answerDeadline gives one of kl's own answers on c (an error reply, a CONNECT's 200, a
// SOCKS5 reply, the bytes read ahead of a tunnel) a write deadline of its own: the one armed may be what ended the request
// (a 408), or none may be (after a dial), and a client that stops reading must not hold
// the handler.
func (s *Server) answerDeadline(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(s.handshakeTimeout()))
}

// writeError answers a refused request, under answerDeadline; the exchange ends after it.
func (s *Server) writeError(c net.Conn, status int, msg string) {
	s.answerDeadline(c)
	body := "kl: " + msg + "\n"
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
}

func dialStatus(err error) (int, string) {
	f := classify(err)
	switch f {
	case failDenied:
		var d *Denied
		if errors.As(err, &d) {
			return http.StatusForbidden, d.Error()
		}
		return http.StatusForbidden, ErrDenied.Error()
	case failTimeout:
		return http.StatusGatewayTimeout, f.String()
	}
	return http.StatusBadGateway, f.String()
}

// maxResponseHeaderBytes bounds what an origin may send before its answer's headers end
// (interim answers included): net/http's ReadResponse reads a header block of any size
// into memory.
const maxResponseHeaderBytes = 1 << 20

// errResponseHeaderTooLarge ends a read once an answer's headers pass the bound.
var errResponseHeaderTooLarge = fmt.Errorf("response headers over %d bytes", maxResponseHeaderBytes)

// origin is the kept-alive connection to the destination of forwarded requests. Every
// read and write on it (through Read and Write, which br uses) must make progress within
// idle; while until is set, reads end at that time instead (the wait for response
// headers), and at most headerLeft more bytes are read. While a request's body is still
// being sent (uploading), reads for its answer wait without a deadline: the upload is
// bounded by its own reads and writes, and sets until when it ends. An origin that stops
// answering, or answers with headers that never end, cannot hold the handler or its
// memory.
type origin struct {
	conn       net.Conn
	br         *bufio.Reader // reads through Read
	key        string
	idle       time.Duration
	headerLeft int64

	mu        sync.Mutex // until and uploading: the upload sets them while br reads
	until     time.Time
	uploading bool
}

func (s *Server) newOrigin(conn net.Conn, key string) *origin {
	o := &origin{conn: conn, key: key, idle: s.idleTimeout()}
	o.br = bufio.NewReaderSize(o, 4096)
	return o
}

func (o *origin) Read(p []byte) (int, error) {
	o.mu.Lock()
	d, headers := o.until, !o.until.IsZero() || o.uploading
	switch {
	case o.uploading:
		d = time.Time{}
	case d.IsZero():
		d = time.Now().Add(o.idle)
	}
	_ = o.conn.SetReadDeadline(d)
	o.mu.Unlock()
	if headers {
		if o.headerLeft <= 0 {
			return 0, errResponseHeaderTooLarge
		}
		if int64(len(p)) > o.headerLeft {
			p = p[:o.headerLeft]
		}
	}
	n, err := o.conn.Read(p)
	o.headerLeft -= int64(n)
	return n, err
}

// headersDue sets the time by which the answer's headers must be in (zero: none, reads
// go back to the idle timeout), also for a read already waiting.
func (o *origin) headersDue(until time.Time, uploading bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.until, o.uploading = until, uploading
	if !until.IsZero() {
		_ = o.conn.SetReadDeadline(until)
	}
}

func (o *origin) deadline() time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.until
}

func (o *origin) Write(p []byte) (int, error) {
	_ = o.conn.SetWriteDeadline(time.Now().Add(o.idle))
	return o.conn.Write(p)
}

// usable reports whether a kept-alive origin connection can carry the next request: the
// origin has neither closed it (HTTP servers close idle connections after a few seconds)
// nor sent anything unasked. A socket is asked without waiting (peekIdle); any other
// connection gets a read of at most a millisecond, since a deadline already past would
// fail the read before it looks at the connection.
func (o *origin) usable() bool {
	if o.br.Buffered() > 0 {
		return false
	}
	if idle, ok := peekIdle(Raw(o.conn)); ok {
		return idle
	}
	o.headerLeft = 1
	o.headersDue(time.Now().Add(time.Millisecond), false)
	_, err := o.br.Peek(1)
	o.headerLeft = 0
	o.headersDue(time.Time{}, false)
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// peekIdle asks c's socket, without waiting and without taking anything, whether it is
// open with nothing to read (idle is true), or closed or holding bytes (false). ok is
// false when c is not a socket it can ask.
func peekIdle(c net.Conn) (idle, ok bool) {
	sc, isSock := c.(syscall.Conn)
	if !isSock {
		return false, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, false
	}
	var perr error
	if err := rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, perr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true // never wait: the answer is now or never
	}); err != nil {
		return false, true
	}
	return errors.Is(perr, syscall.EAGAIN), true
}

func (o *origin) close() {
	if o != nil && o.conn != nil {
		_ = o.conn.Close()
	}
}

// idleWriter writes to a client connection that must take each write within idle (a
// client that stops reading a forwarded response does not hold the handler).
type idleWriter struct {
	c    net.Conn
	idle time.Duration
}

func (w idleWriter) Write(p []byte) (int, error) {
	_ = w.c.SetWriteDeadline(time.Now().Add(w.idle))
	return w.c.Write(p)
}

// idleBody is a forwarded request's body, read from the client within idle per read
// while its upload goes on.
type idleBody struct {
	io.ReadCloser
	u *upload
}

func (b idleBody) Read(p []byte) (int, error) {
	b.u.arm(b.u.c.SetReadDeadline)
	n, err := b.ReadCloser.Read(p)
	// Only the connection's own errors: after a malformed body the client is still
	// there, with the rest of it unread, and must get the answer.
	var ne net.Error
	if errors.As(err, &ne) {
		b.u.bodyFailed = true
	}
	return n, err
}

// upload sends a forwarded request, its headers and body, to the origin on a goroutine
// of its own while forward reads the answer, as net/http's Transport does: an origin
// may answer before it has read the body (413, 401, 417, 403) and then stop reading it,
// or close; or answer 2xx first and read the body while it answers (a full-duplex or
// streaming upload). Each read from the client and each write to the origin must make
// progress within idle. wait ends an upload still under way at once (forward has an
// answer that refuses the rest); keepGoing lets it go on, and finish waits for its end.
type upload struct {
	c    net.Conn // the client, whose body is read
	o    *origin
	idle time.Duration
	done chan uploaded

	mu       sync.Mutex
	over     bool // the upload returned: wait leaves the connections alone
	stopped  bool // wait ended the upload before it was over
	answered bool // keepGoing: the answer is in and being relayed while the upload goes on

	bodyFailed bool // the client stalled or left in the middle of the body (the upload's goroutine only)
}

// uploaded is how an upload ended: err is nil when the whole request went out, and then
// stopWatch ends the watch on the client (watchClient) that started then.
type uploaded struct {
	err        error
	stopped    bool
	bodyFailed bool
	stopWatch  func() bool
}

// earlyAnswerWait bounds the wait for an answer after sending the request failed: the
// origin may have answered and closed (a refusal of the body), and its answer is then in
// the socket already or right behind.
const earlyAnswerWait = time.Second

// startUpload starts sending req to o through u. Once the request is out, the answer's
// headers are due within idle, and the client is watched (watchClient with cbr).
func (s *Server) startUpload(c net.Conn, cbr *bufio.Reader, req *http.Request, o *origin) *upload {
	u := &upload{c: c, o: o, idle: s.idleTimeout(), done: make(chan uploaded, 1)}
	if req.Body != nil && req.Body != http.NoBody {
		req.Body = idleBody{req.Body, u}
	}
	o.headerLeft = maxResponseHeaderBytes
	o.headersDue(time.Time{}, true)
	go func() {
		err := req.Write(u)
		u.mu.Lock()
		u.over = true
		res := uploaded{err: err, stopped: u.stopped, bodyFailed: u.bodyFailed}
		answered := u.answered
		switch {
		case res.stopped, answered: // no answer to wait for any more
		case err == nil:
			// The request is sent: the answer's headers are due within the idle timeout
			// as a whole (an origin trickling them cannot stretch it).
			o.headersDue(time.Now().Add(u.idle), false)
		default:
			o.headersDue(time.Now().Add(min(u.idle, earlyAnswerWait)), false)
		}
		u.mu.Unlock()
		if err == nil && !res.stopped && !answered {
			// A client that leaves meanwhile ends the wait.
			res.stopWatch = watchClient(c, cbr, o)
		}
		u.done <- res
	}()
	return u
}

// arm sets a deadline idle from now with set, unless the upload was stopped: then the
// deadline stop set, in the past, stays, and fails whatever would wait on the
// connection. What needs no wait still goes on: the body's end already read (net/http
// reads a body once more to see its end), whose request the origin has whole.
func (u *upload) arm(set func(time.Time) error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !u.stopped {
		_ = set(time.Now().Add(u.idle))
	}
}

func (u *upload) Write(p []byte) (int, error) {
	u.arm(u.o.conn.SetWriteDeadline)
	return u.o.conn.Write(p)
}

// keepGoing lets an upload still under way go on while forward relays the answer (it
// then neither sets a deadline for the answer's headers when it ends nor watches the
// client); false: it is over already, and wait returns how it ended.
func (u *upload) keepGoing() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.over {
		return false
	}
	u.answered = true
	return true
}

// finish waits for an upload keepGoing let go on to end by itself: each of its reads and
// writes is bounded by idle.
func (u *upload) finish() uploaded {
	res := <-u.done
	res.stopWatch = func() bool { return false }
	return res
}

// wait stops the upload if it is still under way and returns how it ended. Stopping
// leaves deadlines in the past on both connections (whoever uses one next sets its own);
// an upload that did not go out whole leaves neither fit for another exchange.
func (u *upload) wait() uploaded {
	u.mu.Lock()
	if !u.over {
		u.stopped = true
		_ = u.o.conn.SetWriteDeadline(aLongTimeAgo)
		_ = u.c.SetReadDeadline(aLongTimeAgo)
	}
	u.mu.Unlock()
	res := <-u.done
	if res.stopWatch == nil {
		res.stopWatch = func() bool { return false }
	}
	return res
}

// watchClient notices the client going away while a forwarded request waits for its
// answer: it peeks at the client's next byte, and if the connection ends instead (EOF, a
// reset; a half-close counts, as in net/http's server) it closes the origin connection,
// which ends the wait. Bytes that arrive (a pipelined request) stay buffered in br and
// end the watch. stop ends the watch and returns once br is free to use again; it
// reports whether the client went away.
func watchClient(c net.Conn, br *bufio.Reader, o *origin) (stop func() bool) {
	if br.Buffered() > 0 {
		return func() bool { return false }
	}
	_ = c.SetReadDeadline(time.Time{})
	var stopping atomic.Bool
	gone := make(chan bool, 1)
	go func() {
		_, err := br.Peek(1)
		left := err != nil && !stopping.Load()
		if left {
			_ = o.conn.Close()
		}
		gone <- left
	}()
	return func() bool {
		stopping.Store(true)
		_ = c.SetReadDeadline(aLongTimeAgo)
		left := <-gone
		_ = c.SetReadDeadline(time.Time{})
		return left
	}
}

// aLongTimeAgo is a deadline in the past: setting it wakes a blocked read at once.
var aLongTimeAgo = time.Unix(1, 0)

func (s *Server) serveHTTPConn(ctx context.Context, c net.Conn) {
	cr := &clientReader{r: c}
	br := bufio.NewReaderSize(cr, 4096)
	var o *origin
	defer func() { o.close() }()
	for first := true; ; first = false {
		wait := s.handshakeTimeout()
		if !first {
			wait = s.idleTimeout()
		}
		_ = c.SetDeadline(time.Now().Add(wait)) // the wait, and an error reply
		closed := func() bool { return false }
		if !first {
			closed = closeIdle(ctx, c, cr, br)
		}
		req, t, err := readProxyRequest(br, cr, s.maxHeaderBytes(), s.log())
		stopped := closed()
		if err != nil {
			var refusal *badRequest
			// io.EOF: the client closed before a request.
			if !errors.As(err, &refusal) || stopped {
				_ = c.Close()
				return
			}
			s.log().Warn("http proxy: bad request", "why", refusal.msg, "status", refusal.status)
			s.writeError(c, refusal.status, refusal.msg)
			if refusal.status == http.StatusRequestTimeout {
				// The client went quiet: nothing waits unread, and a stalled client
				// gets no more time.
				_ = c.Close()
				return
			}
			o.close()
			o = nil
			s.lingerClose(c)
			return
		}
		_ = c.SetDeadline(time.Time{})
		if req.Method == http.MethodConnect {
			o.close()
			o = nil
			s.connect(ctx, c, br, t)
			return
		}
		then, next := s.forward(ctx, c, br, req, t, o)
		o = next
		if then == keepOpen {
			continue
		}
		o.close() // not kept while the client connection lingers
		o = nil
		switch then {
		case closeLinger:
			s.lingerClose(c)
		case closeHold:
			s.holdClose(c)
		default:
			_ = c.Close()
		}
		return
	}
}

// closeIdle ends the wait for the next request on a kept-alive connection once ctx is
// done (the server is stopping), unless a byte of that request has come already, as
// net/http's Server.Shutdown closes idle connections: a client between requests holds
// no exchange, and its kept-alive origin connection is not kept for it. It returns a
// function that ends the watch and reports whether it ended the wait; the connection
// is then closed without an answer.
func closeIdle(ctx context.Context, c net.Conn, cr *clientReader, br *bufio.Reader) (closed func() bool) {
	if br.Buffered() > 0 { // a pipelined request
		return func() bool { return false }
	}
	cr.begun.Store(false)
	var mu sync.Mutex // the watch's end waits for a close under way
	over, fired := false, false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !over && !cr.begun.Load() {
			fired = true
			_ = c.SetReadDeadline(aLongTimeAgo)
		}
	})
	return func() bool {
		stop()
		mu.Lock()
		defer mu.Unlock()
		over = true
		return fired
	}
}

func (s *Server) connect(ctx context.Context, c net.Conn, br *bufio.Reader, t upstream.Target) {
	up, err := s.Dial(ctx, t)
	if err != nil {
		status, msg := dialStatus(err)
		s.writeError(c, status, msg)
		s.log().Debug("http proxy: CONNECT failed", "target", t.String(), "status", status, "err", err)
		s.lingerClose(c) // tunnel bytes may follow the CONNECT
		return
	}
	s.answerDeadline(c) // the tunnel has none: cleared below
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		_ = up.Close()
		_ = c.Close()
		return
	}
	_ = c.SetWriteDeadline(time.Time{})
	// Bytes the client sent right behind the CONNECT (a pipelined ClientHello).
	if err := s.writeEarly(up, br); err != nil {
		_ = up.Close()
		_ = c.Close()
		return
	}
	s.pipe(c, up)
}

// afterExchange is what becomes of a client connection once forward is done with it.
type afterExchange int

const (
	keepOpen    afterExchange = iota // read the next request
	closeNow                         // the client is gone or stalled, or a tunnel ended
	closeLinger                      // kl's answer was the last: lingerClose
	closeHold                        // the answer came before the client's whole body: holdClose
)

// forward sends one absolute-URI request to its origin in origin-form and relays the
// answer. It reports what becomes of the client connection, and the origin connection
// to keep for the next request.
func (s *Server) forward(ctx context.Context, c net.Conn, cbr *bufio.Reader, req *http.Request, t upstream.Target, o *origin) (afterExchange, *origin) {
	key := t.String()
	if o != nil && (o.key != key || !o.usable()) {
		o.close()
		o = nil
	}
	// No 1xx answer may reach an HTTP/1.0 client (RFC 9110 §15.2): it gets no interim
	// answers, no 100 Continue of ours (its 100-continue expectation is ignored,
	// §10.1.1) and no upgrade (its Upgrade header is ignored, §7.8).
	interim := req.ProtoAtLeast(1, 1)
	upgrade := interim && headerHasToken(req.Header, "Connection", "upgrade") && req.Header.Get("Upgrade") != ""
	upgradeProto := req.Header.Get("Upgrade")
	removeHopHeaders(req.Header)
	if upgrade {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", upgradeProto)
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // keep Go from adding its own
	}
	expect := req.Header.Get("Expect")
	if expect != "" {
		if !strings.EqualFold(expect, "100-continue") {
			s.writeError(c, http.StatusExpectationFailed, "unsupported Expect header")
			return closeLinger, o
		}
		req.Header.Del("Expect")
	}
	req.RequestURI = ""
	if o == nil {
		up, err := s.Dial(ctx, t)
		if err != nil {
			status, msg := dialStatus(err)
			s.writeError(c, status, msg)
			s.log().Debug("http proxy: dial failed", "target", key, "status", status, "err", err)
			return closeLinger, nil
		}
		o = s.newOrigin(up, key)
	}
	cw := idleWriter{c, s.idleTimeout()}
	if expect != "" && interim {
		if _, err := io.WriteString(cw, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return closeNow, o
		}
	}
	up := s.startUpload(c, cbr, req, o)
	var resp *http.Response
	for {
		var err error
		resp, err = http.ReadResponse(o.br, req)
		if err != nil {
			sent := up.wait()
			if sent.stopWatch() {
				s.log().Debug("http proxy: client left before the answer", "target", key)
				o.close()
				return closeNow, nil
			}
			o.close()
			if sent.err != nil && !sent.stopped {
				// Sending failed, and no answer came in the short wait after it.
				s.writeError(c, http.StatusBadGateway, "sending the request failed")
				s.log().Debug("http proxy: write to origin failed", "target", key, "err", sent.err)
				if sent.bodyFailed { // the client stalled or left in the middle of the body
					return closeNow, nil
				}
				return closeLinger, nil // the rest of the body may wait unread
			}
			status, msg := http.StatusBadGateway, "no valid response from the destination"
			// A deadline in the middle of a header line reads as a malformed answer.
			var ne net.Error
			if errors.Is(err, errResponseHeaderTooLarge) {
				msg = "the destination's " + errResponseHeaderTooLarge.Error()
			} else if until := o.deadline(); errors.As(err, &ne) && ne.Timeout() || !until.IsZero() && !time.Now().Before(until) {
				status, msg = http.StatusGatewayTimeout, "the destination did not answer in time"
			}
			s.writeError(c, status, msg)
			s.log().Debug("http proxy: read from origin failed", "target", key, "err", err)
			return closeLinger, nil
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		// An interim answer (100 Continue we already sent, 103 Early Hints): pass on
		// everything but a second 100, and nothing to an HTTP/1.0 client.
		if interim && (resp.StatusCode != http.StatusContinue || expect == "") {
			removeHopHeaders(resp.Header)
			if err := resp.Write(cw); err != nil {
				up.wait().stopWatch()
				o.close()
				return closeNow, nil
			}
		}
	}
	// The answer is in. A 2xx that keeps the connection, come before the whole request
	// went out, is an origin reading the body while it answers (a full-duplex or
	// streaming upload): the upload goes on while the answer is relayed, as net/http's
	// Transport does. Any other answer refuses the rest of the body: a request not sent
	// whole by now is not sent further, the client connection still holds the rest
	// unread, and neither connection carries another exchange.
	duplex := resp.StatusCode >= 200 && resp.StatusCode < 300 && !resp.Close && up.keepGoing()
	whole := true
	if !duplex {
		sent := up.wait()
		if sent.stopWatch() {
			o.headersDue(time.Time{}, false)
			o.close()
			return closeNow, nil
		}
		whole = sent.err == nil
		if !whole {
			s.log().Debug("http proxy: the destination answered before the whole request was sent", "target", key, "err", sent.err)
		}
	}
	o.headersDue(time.Time{}, false)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if !upgrade || !whole {
			s.writeError(c, http.StatusBadGateway, "the destination switched protocols unasked")
			o.close()
			return closeLinger, nil
		}
		if err := resp.Write(cw); err != nil {
			o.close()
			return closeNow, nil
		}
		s.tunnelAfterUpgrade(c, cbr, o)
		return closeNow, nil
	}
	removeHopHeaders(resp.Header)
	framed := resp.ContentLength >= 0 || isChunked(resp.TransferEncoding) || !bodyAllowed(req, resp.StatusCode)
	clientKeep := !req.Close && req.ProtoAtLeast(1, 1) && framed && whole
	originKeep := !resp.Close && framed && whole
	resp.Close = !clientKeep
	if !req.ProtoAtLeast(1, 1) && isChunked(resp.TransferEncoding) {
		// An HTTP/1.0 client does not know chunked framing: the body goes as is, ended
		// by the close (clientKeep is false for it).
		resp.TransferEncoding, resp.ContentLength = nil, -1
	}
	err := resp.Write(cw)
	_ = resp.Body.Close()
	if err != nil {
		if duplex {
			up.wait()
		}
		o.close()
		return closeNow, nil
	}
	if duplex {
		if sent := up.finish(); sent.err != nil {
			s.log().Debug("http proxy: the rest of the request did not go out after the answer", "target", key, "err", sent.err)
			o.close()
			if sent.bodyFailed { // the client stalled or left in the middle of the body
				return closeNow, nil
			}
			return closeHold, nil // the rest of the body may wait unread
		}
	}
	if !originKeep {
		o.close()
		o = nil
	}
	if !whole {
		return closeHold, o // (o is nil: originKeep is false)
	}
	if !clientKeep {
		// Requests the client pipelined behind this one go unanswered; the answer
		// must still reach it, ended by a FIN.
		return closeLinger, o
	}
	return keepOpen, o
}

// tunnelAfterUpgrade relays raw bytes after a 101 answer (WebSocket and friends),
// including what either side already sent behind the headers.
func (s *Server) tunnelAfterUpgrade(c net.Conn, cbr *bufio.Reader, o *origin) {
	// The tunnel has its own idle handling (pipe): no deadline of the exchange stays.
	_ = c.SetDeadline(time.Time{})
	_ = o.conn.SetDeadline(time.Time{})
	if s.writeEarly(o.conn, cbr) != nil || s.writeEarly(c, o.br) != nil {
		o.close()
		return
	}
	s.pipe(c, o.conn)
}

// writeEarly writes what br read ahead from one side of a tunnel before the tunnel
// started (the client's bytes behind its CONNECT or upgrade request, the origin's
// behind its 101) to the other side, first and under answerDeadline: the tunnel's copy
// reads the connections themselves, and a side that does not read must not hold the
// handler before it starts.
func (s *Server) writeEarly(to net.Conn, br *bufio.Reader) error {
	n := br.Buffered()
	if n == 0 {
		return nil
	}
	b, _ := br.Peek(n)
	s.answerDeadline(to)
	if _, err := to.Write(b); err != nil {
		return err
	}
	_, _ = br.Discard(n)
	return to.SetWriteDeadline(time.Time{})
}

func removeHopHeaders(h http.Header) {
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if tok = strings.TrimSpace(tok); tok != "" {
				h.Del(tok)
			}
		}
	}
	for _, k := range hopHeaders {
		delete(h, k)
	}
	for k := range h {
		if len(k) > 6 && strings.EqualFold(k[:6], "proxy-") {
			delete(h, k)
		}
	}
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), token) {
				return true
			}
		}
	}
	return false
}

func isChunked(te []string) bool { return len(te) > 0 && te[0] == "chunked" }

// bodyAllowed reports whether a response to req with this status can carry a body.
func bodyAllowed(req *http.Request, status int) bool {
	if req.Method == http.MethodHead {
		return false
	}
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}
