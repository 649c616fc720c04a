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
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	window := r.o.IdleTimeout / 2
	if window < 100*time.Millisecond {
		window = 100 * time.Millisecond
	}
	var once sync.Once
	var first error
	abort := func(err error) {
		once.Do(func() {
			first = err
			if isReset(err) {
				setLinger0(a)
				setLinger0(b)
			}
			a.Close()
			b.Close()
		})
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var err error
		if up, err = r.copyDir(b, a, &last, window); err != nil {
			abort(err)
		}
	}()
	var derr error
	if down, derr = r.copyDir(a, b, &last, window); derr != nil {
		abort(derr)
	}
	wg.Wait()
	abort(nil)
	return up, down, first
}

// copyDir copies src to dst until EOF (then half-closes dst) or an error, and returns
// the bytes copied.
func (r *Relay) copyDir(dst, src net.Conn, last *atomic.Int64, window time.Duration) (total int64, _ error) {
	idle := r.o.IdleTimeout.Nanoseconds()
	for {
		if err := src.SetReadDeadline(time.Now().Add(window)); err != nil {
			return total, err
		}
		n, err := io.Copy(dst, src)
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
