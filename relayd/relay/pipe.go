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

// chunk bounds the bytes one copy call moves when it can be bounded (see pipe). It is the
// most one splice(2) into Go's pipe takes (internal/poll's maxSpliceSize), so a chunk
// costs no extra system call on a fast flow; at 256 KiB the relay's bulk throughput fell
// by 6-10% (stream and iperf3 rows of make bench, against the same build without).
const chunk = 1 << 20

// epoch is the origin of the monotonic times a flow keeps as integers (mono).
var epoch = time.Now()

func mono() int64 { return int64(time.Since(epoch)) }

// pipe copies bytes both ways between a and b until both directions have ended, then
// closes both. Between two *net.TCPConn io.Copy uses splice(2), so payload never enters
// user space. A clean end of one direction (EOF) is passed on as a half-close
// (CloseWrite) and the other direction keeps flowing; an error or the idle timeout ends
// both with a reset.
//
// Idleness is shared by the two directions: each copies in windows of half the idle
// timeout (a read deadline), records progress when a window moved bytes, and ends the
// flow only when neither direction has moved anything for the whole timeout. A window
// that expires loses nothing: splice waits for readability before it takes any data.
// A copy call of a direction left alone also returns after a chunk, so that it records
// progress (and renews its write deadline, below) while its peer reads slowly: it counts
// as moving as long as it writes a chunk per idle timeout. While both directions copy,
// the read windows bound a call (a drain past the read deadline fails) and the pump of
// one drain, at most a chunk, bounds the rest.
//
// Writes have no deadline while both directions copy: the other direction's windows end
// the flow (closing both connections) when nothing moved. Once one direction has ended
// cleanly, nothing else would wake the other from a write its peer never takes, so it
// then writes under a deadline of the idle timeout, renewed per chunk or window. That
// deadline ends the flow when it expires: splice has already drained the bytes it could
// not write, so the copy cannot resume.
//
// A connection that read ahead of the stream (unbufferer: an upstream that sent bytes of
// the tunnel with its CONNECT answer) is copied as the connection underneath it, after
// the bytes it holds: the flow then gets the chunks, deadlines and splice of any other.
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
// flow: an idle flow costs two small copy stacks.
func (r *Relay) pipeAsync(a, b net.Conn, finish func(up, down int64, err error)) {
	st := r.newPipe(a, b, finish)
	go st.copyUp()
	go st.copyDown()
}

func (r *Relay) newPipe(a, b net.Conn, finish func(up, down int64, err error)) *pipeState {
	st := &pipeState{r: r, finish: finish, window: max(r.o.IdleTimeout/2, 100*time.Millisecond)}
	st.a, st.up.pending = unbuffer(a)
	st.b, st.down.pending = unbuffer(b)
	st.up.init(st.b, st.a)
	st.down.init(st.a, st.b)
	st.last.Store(mono())
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
// its stream. Copying c itself would go through its own WriteTo, which neither chunks
// nor lets the copy renew a write deadline, and keeps splice out of reach. Closing the
// connection underneath closes c (see upstream's Unbuffer).
func unbuffer(c net.Conn) (net.Conn, []byte) {
	if u, ok := c.(unbufferer); ok {
		pending, rest := u.Unbuffer()
		return rest, pending
	}
	return c, nil
}

// copyUp carries a to b, copyDown b to a.
func (st *pipeState) copyUp() {
	st.end(st.copy(&st.up, &st.down))
}

func (st *pipeState) copyDown() {
	st.end(st.copy(&st.down, &st.up))
}

// pipeState is one flow's two directions.
type pipeState struct {
	r        *Relay
	window   time.Duration // the idle check's read window: half the idle timeout
	a, b     net.Conn
	up, down dir
	last     atomic.Int64 // when a direction last moved bytes (mono)
	left     atomic.Int32 // directions still copying
	writeBy  atomic.Int64 // the write deadline of the direction left alone (mono; 0: none)
	once     sync.Once
	first    error
	finish   func(up, down int64, err error)
}

// dir is one direction of a flow.
type dir struct {
	dst, src net.Conn
	// splice is dst when both ends are *net.TCPConn (copyOnce).
	splice *net.TCPConn
	// lr is src bounded to a chunk per copy call. It keeps a *net.TCPConn's splice
	// reachable (spliceFrom unwraps it), whatever dst is.
	lr io.LimitedReader
	// pending are bytes src's wrapper had read ahead (unbuffer), written before the copy.
	pending []byte
	n       int64 // bytes copied, written by the direction before it counts itself out
}

func (d *dir) init(dst, src net.Conn) {
	d.dst, d.src = dst, src
	d.lr.R = src
	_, tcp := src.(*net.TCPConn)
	if t, ok := dst.(*net.TCPConn); ok && tcp {
		d.splice = t
	}
}

// copyOnce is one copy call: at most a chunk when bounded (the direction copies alone),
// to EOF, an error or a read window's end otherwise. Between two *net.TCPConn it calls
// the splicing ReadFrom directly rather than through io.Copy and TCPConn.WriteTo's
// generic fallback (fewer frames on the stack an idle flow keeps, no wrapper allocated
// per window).
func (d *dir) copyOnce(bounded bool) (int64, error) {
	var src io.Reader = d.src
	if bounded {
		d.lr.N = chunk
		src = &d.lr
	}
	if d.splice != nil {
		return d.splice.ReadFrom(src)
	}
	return io.Copy(d.dst, src)
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
// other direction.
func (st *pipeState) copy(d, other *dir) error {
	idle := st.r.o.IdleTimeout
	if len(d.pending) > 0 {
		// The bytes read ahead go first, under the same rules as the copy's writes
		// below: no deadline while the other direction copies (its idle check closes
		// both connections if nothing moves), the write deadline of the idle timeout
		// once it has ended cleanly (it sets that on this dst before it counts itself
		// out). A deadline of its own would have to be lifted after the write, racing
		// with the one the other direction sets.
		n, err := d.dst.Write(d.pending)
		d.n += int64(n)
		d.pending = nil
		if n > 0 {
			st.last.Store(mono())
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return errIdle // the only deadline on dst is the idle write deadline
		}
		if err != nil {
			return err
		}
	}
	for {
		now := time.Now()
		if err := d.src.SetReadDeadline(now.Add(st.window)); err != nil {
			return err
		}
		// left is 1 only after the other direction has ended (and set the first write
		// deadline, which this one now renews chunk by chunk). While both copy, a copy
		// call runs unbounded, as before there were chunks: a read window already ends it
		// (a drain past the read deadline fails), and every call costs a bulk flow a
		// little (the relay's iperf3 row lost 6-8% to chunks in both directions).
		alone := st.left.Load() == 1
		if alone {
			if err := st.writeDeadline(d.dst, now); err != nil {
				return err
			}
		}
		n, err := d.copyOnce(alone)
		d.n += n
		t := mono()
		if n > 0 {
			st.last.Store(t)
		}
		switch {
		case err == nil && alone && d.lr.N == 0:
			// A whole chunk: copy on (EOF, if it is next, shows as a call that moved
			// less than a chunk).
		case err == nil:
			if cw, ok := d.dst.(interface{ CloseWrite() error }); ok {
				if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
					return err
				}
			}
			// The other direction copies alone from now on: bound its writes.
			_ = st.writeDeadline(other.dst, time.Now())
			return nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			// Past the write deadline the error may be the write's, and the bytes it
			// held are gone: the flow ends rather than resuming the copy.
			if w := st.writeBy.Load(); w != 0 && t >= w {
				return errIdle
			}
			if t-st.last.Load() < int64(idle) {
				continue
			}
			return errIdle
		default:
			return err
		}
	}
}

// writeDeadline bounds writes to c, the connection of the direction left alone, to the
// idle timeout from now, and records the deadline for copy's check. Only one direction
// is ever left alone, and the direction that ended sets it before it counts itself out
// (st.left), so the deadline recorded is the one in force whenever it can have expired.
func (st *pipeState) writeDeadline(c net.Conn, now time.Time) error {
	idle := st.r.o.IdleTimeout
	st.writeBy.Store(int64(now.Sub(epoch) + idle))
	return c.SetWriteDeadline(now.Add(idle))
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
