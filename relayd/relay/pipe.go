package relay

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// errIdle ends a flow that moved no bytes either way for the idle timeout.
var errIdle = errors.New("idle timeout")

// epoch is the origin of the monotonic times a flow keeps as integers (mono).
var epoch = time.Now()

func mono() int64 { return int64(time.Since(epoch)) }

// pipe copies bytes both ways between a and b until both directions have ended, then
// closes both. Between two *net.TCPConn a direction splices (splicer, Linux), so payload
// never enters user space; other connections are copied through a buffer. A clean end
// of one direction (EOF) is passed on as a half-close (CloseWrite) and the other
// direction keeps flowing; an error or the idle timeout ends both with a reset.
//
// Idleness is shared by the two directions: the flow ends when neither has delivered a
// byte for the idle timeout, whatever each is waiting for. Each direction reads its
// source under a read deadline and writes its destination under a write deadline, both
// at the idle timeout past the last delivery of either direction (each records its own,
// lastMoved). Only an expiry renews them: the direction looks at both records, ends the
// flow if the later one is a whole idle timeout old, and otherwise moves its deadlines on
// and resumes what it was doing. So a direction blocked writing to a peer that does not
// read goes on waiting while the other direction carries bytes, and when both are blocked
// writing (neither peer reads) or waiting to read, the flow ends after the idle timeout.
// Nothing is lost at an expiry: a read deadline expires before a splice or read takes
// anything, and the bytes a write did not take wait in the direction (its pipe, or
// pending) for the resumed write.
//
// TCP urgent data (MSG_OOB) is passed on as urgent data at its place in the stream
// between two TCP connections (splicer), as the event loop passes it on; a buffer copy's
// reads skip the urgent byte, as a plain reader's do, and go on.
//
// A connection that read ahead of the stream (unbufferer: an upstream that sent bytes of
// the tunnel with its CONNECT answer) is copied as the connection underneath it, after
// the bytes it holds: the flow then gets the deadlines and splice of any other.
//
// It returns the bytes carried from a to b (up) and from b to a (down).
func (r *Relay) pipe(a, b net.Conn) (up, down int64, err error) {
	done := make(chan struct{})
	st := r.newPipe(a, b, func(u, d int64, e error) {
		up, down, err = u, d, e
		close(done)
	})
	go st.copyUp()
	st.copyDown() // on the caller's goroutine, which waits anyway
	<-done
	return up, down, err
}

// pipeAsync is pipe on two goroutines of its own, one per direction, and returns at once;
// the last direction to end closes both connections and calls finish. The caller's
// goroutine (and the stack it grew deciding the flow) is not kept for the life of the
// flow: an idle flow costs two small copy stacks, and no pipe (a splicer holds one only
// while it holds bytes).
func (r *Relay) pipeAsync(a, b net.Conn, finish func(up, down int64, err error)) {
	st := r.newPipe(a, b, finish)
	go st.copyUp()
	go st.copyDown()
}

func (r *Relay) newPipe(a, b net.Conn, finish func(up, down int64, err error)) *pipeState {
	st := &pipeState{r: r, finish: finish}
	st.a, st.up.pending = unbuffer(a)
	st.b, st.down.pending = unbuffer(b)
	st.up.init(st.b, st.a)
	st.down.init(st.a, st.b)
	now := mono()
	st.up.lastMoved.Store(now)
	st.down.lastMoved.Store(now)
	st.left.Store(2)
	return st
}

// unbufferer is a connection that read bytes of the stream ahead of its readers
// (upstream's connection to an HTTP proxy that sent some with its CONNECT answer).
// Unbuffer hands them over with the connection the rest of the stream comes from.
type unbufferer interface {
	Unbuffer() (pending []byte, rest net.Conn)
}

// unbuffer returns the connection to copy in place of c, and the bytes to deliver before
// its stream. Copying c itself would keep splice out of reach. Closing the connection
// underneath closes c (see upstream's Unbuffer).
func unbuffer(c net.Conn) (net.Conn, []byte) {
	if u, ok := c.(unbufferer); ok {
		pending, rest := u.Unbuffer()
		return rest, pending
	}
	return c, nil
}

// copyUp carries a to b, copyDown b to a.
func (st *pipeState) copyUp() {
	err := st.copy(&st.up, &st.down)
	st.up.release()
	st.end(err)
}

func (st *pipeState) copyDown() {
	err := st.copy(&st.down, &st.up)
	st.down.release()
	st.end(err)
}

// pipeState is one flow's two directions.
type pipeState struct {
	r        *Relay
	a, b     net.Conn
	up, down dir
	left     atomic.Int32 // directions still copying
	once     sync.Once
	first    error
	finish   func(up, down int64, err error)
}

// dir is one direction of a flow.
type dir struct {
	dst, src net.Conn
	// sp splices src to dst when both are *net.TCPConn (nil: copied through a buffer).
	sp *splicer
	// pending are bytes to write before anything else: what src's wrapper had read ahead
	// (unbuffer), or what a write left when its deadline expired.
	pending []byte
	n       int64 // bytes delivered, written by the direction before it counts itself out
	// lastMoved is when the direction last delivered bytes (mono); the other direction
	// reads it when one of its deadlines expires.
	lastMoved atomic.Int64
}

func (d *dir) init(dst, src net.Conn) {
	d.dst, d.src = dst, src
	d.sp = newSplicer(d, dst, src)
}

// delivered records n bytes written to dst.
func (d *dir) delivered(n int) {
	if n > 0 {
		d.n += int64(n)
		d.lastMoved.Store(mono())
	}
}

// errNoSplice: the sockets do not splice (a first splice said EINVAL, as a socket type
// that lacks it does); the direction is copied through a buffer.
var errNoSplice = errors.New("splice not supported")

// copyOnce copies d until src's end (nil), an error, or an expired deadline.
func (d *dir) copyOnce() error {
	if d.sp != nil {
		err := d.sp.copy()
		if !errors.Is(err, errNoSplice) {
			return err
		}
		d.sp.release()
		d.sp = nil // this pair of sockets does not splice: copied through a buffer
	}
	return d.bufCopy()
}

// bufs are the buffers of the copies that do not splice, held only during a copy call.
var bufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// bufCopy copies d through a buffer, as io.Copy does, but keeps what a write did not take
// (pending) for the next call.
func (d *dir) bufCopy() error {
	if err := d.writePending(); err != nil {
		return err
	}
	buf := bufs.Get().(*[32 << 10]byte)
	defer bufs.Put(buf)
	for {
		n, rerr := d.src.Read(buf[:])
		if n > 0 {
			w, werr := d.dst.Write(buf[:n])
			d.delivered(w)
			if werr != nil {
				d.pending = append([]byte(nil), buf[w:n]...)
				return werr
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// writePending writes d.pending to dst; on an error it keeps what was not written.
func (d *dir) writePending() error {
	for len(d.pending) > 0 {
		n, err := d.dst.Write(d.pending)
		d.delivered(n)
		d.pending = d.pending[n:]
		if err != nil {
			return err
		}
	}
	d.pending = nil
	return nil
}

// release gives back what the direction holds once it has stopped copying.
func (d *dir) release() {
	if d.sp != nil {
		d.sp.release()
	}
}

// end counts one direction out; an error aborts both.
func (st *pipeState) end(err error) {
	if err != nil {
		st.abort(err)
	}
	if st.left.Add(-1) == 0 {
		st.abort(nil)
		st.finish(st.up.n, st.down.n, st.first)
	}
}

func (st *pipeState) abort(err error) {
	st.once.Do(func() {
		st.first = err
		// Only both directions' clean ends (err nil) close the flow with a FIN. Any error
		// cut a direction: a reset from either side, the idle timeout (the relay's own end
		// of a flow neither side closed), a destination whose retransmissions or
		// keepalives timed out (ETIMEDOUT) or that became unreachable, a failure of the
		// relay's own. The bytes the cut direction still held, or the ones its source
		// would have sent, never arrive; a FIN would pass for the peer's clean close, and
		// a stream that ends at its close would look complete. A reset tells both ends,
		// as the event loop's end does for any error.
		if err != nil {
			setLinger0(st.a)
			setLinger0(st.b)
		}
		st.a.Close()
		st.b.Close()
	})
}

// copy copies d until EOF (then half-closes its dst) or an error; other is the flow's
// other direction. Its deadlines are the idle timeout past the later of the two
// directions' last deliveries, renewed only when one expires (see pipe).
func (st *pipeState) copy(d, other *dir) error {
	idle := st.r.o.IdleTimeout
	by := time.Now().Add(idle)
	for {
		if err := d.src.SetReadDeadline(by); err != nil {
			return err
		}
		if err := d.dst.SetWriteDeadline(by); err != nil {
			return err
		}
		err := d.copyOnce()
		switch {
		case err == nil:
			if cw, ok := d.dst.(interface{ CloseWrite() error }); ok {
				if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
					return err
				}
			}
			return nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			last := max(d.lastMoved.Load(), other.lastMoved.Load())
			if mono()-last >= int64(idle) {
				return errIdle
			}
			by = epoch.Add(time.Duration(last) + idle)
		default:
			return err
		}
	}
}

func setLinger0(c net.Conn) {
	type lingerer interface{ SetLinger(int) error }
	if l, ok := c.(lingerer); ok {
		_ = l.SetLinger(0)
		return
	}
	if nc, ok := c.(interface{ NetConn() net.Conn }); ok {
		setLinger0(nc.NetConn())
	}
}
