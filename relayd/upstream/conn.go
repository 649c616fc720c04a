package upstream

import (
	"errors"
	"io"
	"net"
)

// bufferedConn hands out bytes the upstream sent right after its handshake answer before
// reading from the connection again. It is only used when there are such bytes; it keeps
// the zero-copy paths of the underlying connection reachable through WriteTo and
// ReadFrom, so io.Copy in either direction still splices the bulk. A copy that needs
// more than io.Copy (the relay's bounded chunks and deadlines) takes the bytes out with
// Unbuffer and copies the underlying connection as any other.
type bufferedConn struct {
	net.Conn
	buf []byte
}

func (c *bufferedConn) Read(p []byte) (int, error) {
	if len(c.buf) > 0 {
		n := copy(p, c.buf)
		c.buf = c.buf[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

// WriteTo writes the buffered bytes, then copies the rest of the stream with the
// underlying connection's own fast path.
func (c *bufferedConn) WriteTo(w io.Writer) (int64, error) {
	var total int64
	if len(c.buf) > 0 {
		n, err := w.Write(c.buf)
		total += int64(n)
		c.buf = c.buf[n:]
		if err != nil {
			return total, err
		}
	}
	n, err := io.Copy(w, c.Conn)
	return total + n, err
}

// ReadFrom lets io.Copy(conn, src) use the underlying connection's splice path.
func (c *bufferedConn) ReadFrom(r io.Reader) (int64, error) {
	if rf, ok := c.Conn.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{c.Conn}, r)
}

// CloseWrite half-closes the underlying connection when it supports that.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("upstream connection does not support half-close")
}

// NetConn returns the underlying connection (as crypto/tls.Conn.NetConn does). Reading
// from it directly skips the buffered bytes.
func (c *bufferedConn) NetConn() net.Conn { return c.Conn }

// Unbuffer hands over the bytes read ahead that no read has taken yet, and the
// underlying connection the rest of the stream comes from. The caller delivers those
// bytes itself: c's reads no longer return them. Closing the underlying connection
// closes c (c has no state of its own to release).
func (c *bufferedConn) Unbuffer() ([]byte, net.Conn) {
	buf := c.buf
	c.buf = nil
	return buf, c.Conn
}
