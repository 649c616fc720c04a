package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
)

// Bounds on an upstream's CONNECT answer.
const (
	maxHeaderBytes = 32 << 10
	maxHeaderLines = 100
	readBufSize    = 4096
)

type httpDialer struct {
	common
	auth string // the Proxy-Authorization header line, built once ("" without credentials)
}

// proxyAuthorization is the Basic Proxy-Authorization header line for user and pass.
func proxyAuthorization(user, pass string) string {
	return "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass)) + "\r\n"
}

// readers are the buffered readers of CONNECT answers, reused across dials: an answer
// is read and its leftover copied out before the reader goes back.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readBufSize) }}

func (d *httpDialer) Dial(ctx context.Context, t Target) (net.Conn, error) {
	conn, hctx, done, err := d.connect(ctx, t)
	if err != nil {
		return nil, err
	}
	c, err := d.handshake(hctx, conn, t)
	if derr := done(); err == nil && derr != nil {
		err = d.handshakeErr(hctx, "CONNECT", derr)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return c, nil
}

func (d *httpDialer) handshake(ctx context.Context, conn net.Conn, t Target) (net.Conn, error) {
	hp := t.String()
	var b bytes.Buffer
	b.Grow(64 + len(hp)*2 + len(d.auth))
	b.WriteString("CONNECT ")
	b.WriteString(hp)
	b.WriteString(" HTTP/1.1\r\nHost: ")
	b.WriteString(hp)
	b.WriteString("\r\n")
	b.WriteString(d.auth)
	b.WriteString("\r\n")
	if _, err := conn.Write(b.Bytes()); err != nil {
		return nil, d.handshakeErr(ctx, "send CONNECT", err)
	}
	br := readers.Get().(*bufio.Reader)
	br.Reset(conn)
	defer func() {
		br.Reset(nil)
		readers.Put(br)
	}()
	code, err := readResponseHead(br)
	if err != nil {
		return nil, d.handshakeErr(ctx, "read CONNECT reply", err)
	}
	// Errors say the status code with its standard text, not the upstream's reason
	// phrase: a proxy may put the target in it ("502 cannot reach host.example"), and
	// these errors end up in audit records, which never carry a destination.
	switch {
	case code >= 200 && code < 300:
	case code == 407 && d.hasUser:
		return nil, d.errorf("%w: credentials rejected (%d %s)", ErrAuth, code, http.StatusText(code))
	case code == 407:
		return nil, d.errorf("%w: upstream requires credentials and none are configured (%d %s)", ErrAuth, code, http.StatusText(code))
	default:
		return nil, d.errorf("%w: CONNECT answered %d %s", ErrRefused, code, http.StatusText(code))
	}
	if n := br.Buffered(); n > 0 {
		// The upstream already sent bytes of the tunnel (a server-first protocol, or a
		// pipelined answer): hand them out first.
		buf, _ := br.Peek(n)
		return &bufferedConn{Conn: conn, buf: bytes.Clone(buf)}, nil
	}
	return conn, nil
}

// readResponseHead reads an HTTP/1.x status line and headers, bounded in size, and
// returns the status code; the reason phrase is not kept (it may name the target).
// Headers are skipped: a CONNECT client needs none of them (RFC 9110 §9.3.6: a 2xx
// CONNECT answer has no body to frame).
func readResponseHead(br *bufio.Reader) (int, error) {
	total := 0
	line, err := readLine(br, &total)
	if err != nil {
		return 0, err
	}
	// HTTP/1.1 200 Connection established
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, fmt.Errorf("%w: bad status line (%d bytes, not HTTP/1.x NNN)", ErrProtocol, len(line))
	}
	code, err := strconv.Atoi(string(line[9:12]))
	if err != nil || code < 100 || (len(line) > 12 && line[12] != ' ') {
		return 0, fmt.Errorf("%w: bad status line (no 3-digit status code)", ErrProtocol)
	}
	for i := 0; ; i++ {
		if i >= maxHeaderLines {
			return 0, fmt.Errorf("%w: more than %d header lines", ErrProtocol, maxHeaderLines)
		}
		h, err := readLine(br, &total)
		if err != nil {
			return 0, err
		}
		if len(h) == 0 {
			return code, nil
		}
	}
}

// readLine returns one line without its CRLF (or bare LF), counting bytes against the
// header bound.
func readLine(br *bufio.Reader, total *int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	*total += len(line)
	if err == bufio.ErrBufferFull || *total > maxHeaderBytes {
		return nil, fmt.Errorf("%w: reply header over %d bytes", ErrProtocol, min(maxHeaderBytes, readBufSize))
	}
	if err != nil {
		return nil, err
	}
	line = bytes.TrimSuffix(line[:len(line)-1], []byte("\r"))
	return line, nil
}
