package attach

import (
	"encoding/binary"
	"io"
)

// coalescer sits between yamux and the TLS connection. yamux writes every frame as two
// writes, its 12-byte header and then the body; over TLS that is two records and two
// system calls per frame. The coalescer holds the header of a data frame that has a body
// and sends it with the body in one write. Every other write passes straight through,
// so nothing waits for a write that may never come.
//
// On the daemon's side it also shows the frames it reads to a finWatch (fins).
type coalescer struct {
	io.ReadWriteCloser
	hdr  [muxHeaderSize]byte
	held bool
	buf  []byte
	fins *finWatch
}

func (c *coalescer) Read(p []byte) (int, error) {
	n, err := c.ReadWriteCloser.Read(p)
	if c.fins != nil {
		c.fins.observe(p[:n])
	}
	return n, err
}

// muxHeaderSize and muxTypeData are yamux's frame header size and data frame type
// (version, type, flags, stream id, length: 1+1+2+4+4 bytes).
const (
	muxHeaderSize = 12
	muxTypeData   = 0
)

func (c *coalescer) Write(p []byte) (int, error) {
	if c.held {
		c.held = false
		c.buf = append(append(c.buf[:0], c.hdr[:]...), p...)
		n, err := c.ReadWriteCloser.Write(c.buf)
		n -= muxHeaderSize
		if n < 0 {
			n = 0
		}
		return n, err
	}
	if len(p) == muxHeaderSize && p[1] == muxTypeData && binary.BigEndian.Uint32(p[8:12]) > 0 {
		copy(c.hdr[:], p)
		c.held = true
		return len(p), nil
	}
	return c.ReadWriteCloser.Write(p)
}
