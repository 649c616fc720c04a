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

// pipe copies bytes both ways between a and b until both directions have ended, then
// closes both. Between two *net.TCPConn io.Copy uses splice(2), so payload never enters
// user space. A clean end of one direction (EOF) is passed on as a half-close
// (CloseWrite) and the other direction keeps flowing; an error or the idle timeout ends
// both, with a reset when the cause was a reset.
//
// Idleness is shared by the two directions: each copies in windows of half the idle
// timeout (a read deadline), records progress when a window moved bytes, and ends the
// flow only when neither direction has moved anything for the whole timeout. A window
// that expires loses nothing: splice waits for readability before it takes any data.
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
	st := &pipeState{r: r, a: a, b: b, finish: finish, window: max(r.o.IdleTimeout/2, 100*time.Millisecond)}
	st.last.Store(time.Now().UnixNano())
	st.left.Store(2)
	return st
}

// copyUp carries a to b, copyDown b to a.
func (st *pipeState) copyUp() {
	n, err := st.r.copyDir(st.b, st.a, &st.last, st.window)
	st.up = n
	st.end(err)
}

func (st *pipeState) copyDown() {
	n, err := st.r.copyDir(st.a, st.b, &st.last, st.window)
	st.down = n
	st.end(err)
}

// pipeState is one flow's two directions.
type pipeState struct {
	r        *Relay
	window   time.Duration // the idle check's read window: half the idle timeout
	a, b     net.Conn
	last     atomic.Int64 // when a direction last moved bytes (UnixNano)
	left     atomic.Int32 // directions still copying
	up, down int64        // each written by its direction before it counts itself out
	once     sync.Once
	first    error
	finish   func(up, down int64, err error)
}

// end counts one direction out; an error aborts both.
func (st *pipeState) end(err error) {
	if err != nil {
		st.abort(err)
	}
	if st.left.Add(-1) == 0 {
		st.abort(nil)
		st.finish(st.up, st.down, st.first)
	}
}

func (st *pipeState) abort(err error) {
	st.once.Do(func() {
		st.first = err
		if isReset(err) {
			setLinger0(st.a)
			setLinger0(st.b)
		}
		st.a.Close()
		st.b.Close()
	})
}

// copyDir copies src to dst until EOF (then half-closes dst) or an error, and returns
// the bytes copied.
func (r *Relay) copyDir(dst, src net.Conn, last *atomic.Int64, window time.Duration) (total int64, _ error) {
	idle := r.o.IdleTimeout.Nanoseconds()
	for {
		if err := src.SetReadDeadline(time.Now().Add(window)); err != nil {
			return total, err
		}
		n, err := copyOnce(dst, src)
		total += n
		now := time.Now().UnixNano()
		if n > 0 {
			last.Store(now)
		}
		switch {
		case err == nil:
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
					return total, err
				}
			}
			return total, nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			if now-last.Load() < idle {
				continue
			}
			return total, errIdle
		default:
			return total, err
		}
	}
}

// copyOnce is io.Copy; between two *net.TCPConn it calls the splicing ReadFrom directly
// rather than through TCPConn.WriteTo's generic fallback (fewer frames on the stack an
// idle flow keeps, no wrapper allocated per window).
func copyOnce(dst, src net.Conn) (int64, error) {
	if d, ok := dst.(*net.TCPConn); ok {
		if s, ok := src.(*net.TCPConn); ok {
			return d.ReadFrom(s)
		}
	}
	return io.Copy(dst, src)
}

func isReset(err error) bool {
	return err != nil && (errors.Is(err, errConnReset) || errors.Is(err, errPipe))
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
