package upstream

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Bounds on an upstream's CONNECT answer.
const (
	maxHeaderBytes = 32 << 10
	maxHeaderLines = 100
	readBufSize    = 4096
)

type httpDialer struct {
	common
	auth     string // the Proxy-Authorization header line, built once ("" without credentials)
	pipeline bool   // the tunnel's first bytes may follow the request at once (Pipeline)
}

// proxyAuthorization is the Basic Proxy-Authorization header line for user and pass.
func proxyAuthorization(user, pass string) string {
	return "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass)) + "\r\n"
}

func (d *httpDialer) Dial(ctx context.Context, t Target) (net.Conn, error) {
	return d.dial(ctx, t, d.start)
}

func (d *httpDialer) Handshake(t Target) (*Handshake, error) {
	h := new(Handshake)
	if err := d.start(h, t); err != nil {
		return nil, err
	}
	return h, nil
}

// start readies h for a negotiation with t and lays out the CONNECT request; the answer
// is one status line and headers.
func (d *httpDialer) start(h *Handshake, t Target) error {
	if !t.Valid() {
		return d.errorf("%w: target has no host or port", ErrTarget)
	}
	h.reset(&d.common)
	h.sendStage, h.early = "send CONNECT", d.pipeline
	host := t.hostOnly()
	bracket := strings.IndexByte(host, ':') >= 0 // IPv6, as net.JoinHostPort
	const fixed = len("CONNECT ") + len(" HTTP/1.1\r\nHost: ") + len("\r\n") + len("\r\n")
	req := slices.Grow(h.out, fixed+2*(len(host)+len("[]:65535"))+len(d.auth))
	for _, s := range []string{"CONNECT ", " HTTP/1.1\r\nHost: "} {
		req = append(req, s...)
		if bracket {
			req = append(req, '[')
		}
		req = append(req, host...)
		if bracket {
			req = append(req, ']')
		}
		req = append(req, ':')
		req = strconv.AppendUint(req, uint64(t.port()), 10)
	}
	req = append(req, "\r\n"...)
	req = append(req, d.auth...)
	req = append(req, "\r\n"...)
	h.out, h.ready = req, len(req)
	return nil
}

// feedHTTP reads the answer head from b and, once it is whole, checks the status. It
// returns how many bytes it took: the head's, the rest is the tunnel's.
func (h *Handshake) feedHTTP(b []byte) (int, error) {
	n, done, err := h.head.feed(b)
	if err != nil {
		return n, h.c.errorf("read CONNECT reply: %w", err)
	}
	if !done {
		return n, nil
	}
	// Errors say the status code with its standard text, not the upstream's reason
	// phrase: a proxy may put the target in it ("502 cannot reach host.example"), and
	// these errors end up in audit records, which never carry a destination.
	switch code := h.head.code; {
	case code >= 200 && code < 300:
	case code == 407 && h.c.hasUser:
		return n, h.c.errorf("%w: credentials rejected (%d %s)", ErrAuth, code, http.StatusText(code))
	case code == 407:
		return n, h.c.errorf("%w: upstream requires credentials and none are configured (%d %s)", ErrAuth, code, http.StatusText(code))
	default:
		return n, h.c.errorf("%w: CONNECT answered %d %s", ErrRefused, code, http.StatusText(code))
	}
	h.done = true
	return n, nil
}

// The errors of an answer head past its bounds in bytes: a line over readBufSize (a
// reader with a buffer of that size would not find its end), or over maxHeaderBytes in
// all. Each names the bound that fired.
var (
	errLineOver   = fmt.Errorf("%w: header line over %d bytes", ErrProtocol, readBufSize)
	errHeaderOver = fmt.Errorf("%w: reply header over %d bytes", ErrProtocol, maxHeaderBytes)
)

// httpHead reads an HTTP/1.x status line and headers as they come, in pieces of any
// size, bounded as above and to fewer than maxHeaderLines header lines, and keeps the
// status code; the reason phrase is not kept (it may name the target). Headers are
// skipped: a CONNECT client needs none of them (RFC 9110 §9.3.6: a 2xx CONNECT answer
// has no body to frame). A line ends at LF, one CR before it dropped.
type httpHead struct {
	status  [13]byte // the status line's first bytes: "HTTP/1.1 200 "
	line    int      // bytes of the line being read, without its LF
	last    byte     // the last of them
	total   int      // bytes of the lines read, with their LFs
	headers int      // header lines read (the status line not counted)
	started bool     // the status line was read
	code    int
}

// feed takes bytes of the head from b and returns how many, and whether the head is
// whole.
func (p *httpHead) feed(b []byte) (int, bool, error) {
	for i, c := range b {
		if c != '\n' {
			if !p.started && p.line < len(p.status) {
				p.status[p.line] = c
			}
			p.line++
			p.last = c
			if p.line >= readBufSize {
				return i + 1, false, errLineOver
			}
			continue
		}
		p.total += p.line + 1
		if p.total > maxHeaderBytes {
			return i + 1, false, errHeaderOver
		}
		n := p.line
		if n > 0 && p.last == '\r' {
			n--
		}
		p.line = 0
		switch {
		case !p.started:
			if err := p.statusLine(n); err != nil {
				return i + 1, false, err
			}
			p.started = true
		case n == 0:
			return i + 1, true, nil
		default:
			p.headers++
			if p.headers >= maxHeaderLines {
				return i + 1, false, fmt.Errorf("%w: %d header lines or more", ErrProtocol, maxHeaderLines)
			}
		}
	}
	return len(b), false, nil
}

// statusLine checks the status line of n bytes (its first ones in status) and keeps the
// code.
func (p *httpHead) statusLine(n int) error {
	// HTTP/1.1 200 Connection established
	line := p.status[:min(n, len(p.status))]
	if n < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return fmt.Errorf("%w: bad status line (%d bytes, not HTTP/1.x NNN)", ErrProtocol, n)
	}
	code := 0
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			code = -1
			break
		}
		code = code*10 + int(c-'0')
	}
	if code < 100 || (n > 12 && line[12] != ' ') {
		return fmt.Errorf("%w: bad status line (no 3-digit status code)", ErrProtocol)
	}
	p.code = code
	return nil
}

// over reports whether the head read so far, with the line not yet ended, is over
// maxHeaderBytes.
func (p *httpHead) over() bool { return p.total+p.line > maxHeaderBytes }
