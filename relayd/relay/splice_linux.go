package relay

import (
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/kl-egress/kl/relayd/rawsys"
)

// maxSplice is the most one splice moves into a pipe, and the size asked for the pipe:
// as Go's own splice (internal/poll's maxSpliceSize), 16 times fewer splices than the
// default 64 KiB pipe.
const maxSplice = 1 << 20

// splicer carries one direction of a flow between two TCP sockets with splice(2), from
// src into a pipe and from the pipe to dst, as TCPConn.ReadFrom does, waiting through
// the connections' own poller (syscall.RawConn) so that their deadlines apply. It is
// the same number of system calls as Go's splice, with three differences:
//
//   - A write whose deadline expires leaves the bytes it did not write in the pipe, and
//     the next copy writes them first (Go's splice discards its pipe): a write deadline
//     is then only a point at which to look at the flow's idleness (pipe), not its end.
//   - The pipe is held only while it holds bytes: an idle flow waits for its sources
//     holding none (Go's holds one per direction while it waits).
//   - TCP urgent data does not stall it. A splice stops at a socket's urgent mark and
//     never passes it: it says EAGAIN while bytes wait behind the mark, or 0 once a FIN
//     has come behind them, and the poller, edge-triggered, does not report the socket
//     again. So a splice that finds nothing, or finds the end, asks whether the socket
//     is at its mark (SIOCATMARK; once per wait, and once at the end of the stream: the
//     poller cannot report urgent data, as the event loop's epoll does with EPOLLPRI),
//     and there passes the urgent byte on as urgent data and steps past the mark, as the
//     event loop does (urgent, loop_linux.go, says why it is passed on).
type splicer struct {
	d        *dir
	src, dst syscall.RawConn
	p        *splicePipe // nil when it would hold nothing
	inPipe   int         // bytes in p
	// moved is set once a splice has moved bytes (errNoSplice is only for a first one).
	moved bool
	// oob is an urgent byte taken from src that dst has not taken yet (held).
	oob  byte
	held bool

	// What the last call of drain or pump found: bytes spliced, the error, and (drain)
	// whether src stands at its urgent mark.
	n      int
	err    error
	atMark bool
	// The functions passed to the RawConns, made once (a method value is allocated
	// where it is made).
	drainFn, pumpFn func(fd uintptr) bool
}

// newSplicer returns d's splicer from src to dst, or nil unless both are TCP connections.
func newSplicer(d *dir, dst, src net.Conn) *splicer {
	s, ok1 := src.(*net.TCPConn)
	t, ok2 := dst.(*net.TCPConn)
	if !ok1 || !ok2 {
		return nil
	}
	rs, err1 := s.SyscallConn()
	rt, err2 := t.SyscallConn()
	if err1 != nil || err2 != nil {
		return nil
	}
	sp := &splicer{d: d, src: rs, dst: rt}
	sp.drainFn, sp.pumpFn = sp.drain, sp.pump
	return sp
}

// copy moves bytes until src's end (nil), an error, or an expired deadline; the bytes a
// write did not take stay in the pipe (or pending) for the next call.
func (s *splicer) copy() error {
	d := s.d
	if err := d.writePending(); err != nil {
		return err
	}
	for {
		if s.held {
			if err := s.sendUrgent(); err != nil {
				return err
			}
			if err := s.stepMark(); err != nil {
				return err
			}
			continue
		}
		if s.inPipe > 0 {
			s.n, s.err = 0, nil
			err := s.dst.Write(s.pumpFn)
			d.delivered(s.n)
			if err == nil {
				err = s.err
			}
			if err != nil {
				return err
			}
			continue
		}
		s.n, s.err, s.atMark = 0, nil, false
		err := s.src.Read(s.drainFn)
		if err == nil {
			err = s.err
		}
		switch {
		case err != nil:
			return err
		case s.atMark:
			if err := s.takeUrgent(); err != nil {
				return err
			}
		case s.n == 0:
			return nil // the end of src's stream
		default:
			s.inPipe += s.n
			s.moved = true
		}
	}
}

// drain splices what src holds into the pipe (s.n: 0 at the end of the stream), or
// finds src at its urgent mark (s.atMark); false: src has nothing, wait for it.
func (s *splicer) drain(fd uintptr) bool {
	if s.p == nil {
		p, err := getPipe()
		if err != nil {
			s.err = err
			return true
		}
		s.p = p
	}
	n, err := rawsys.Splice(int(fd), s.p.w, maxSplice)
	switch {
	case err == unix.EAGAIN || err == nil && n == 0:
		if at, aerr := rawsys.AtMark(int(fd)); aerr == nil && at {
			s.atMark = true
			return true
		}
		if err == nil {
			return true // the end of the stream
		}
		putPipe(s.p) // empty: an idle direction holds no pipe
		s.p = nil
		return false
	case err == unix.EINVAL && !s.moved:
		s.err = errNoSplice
	case err != nil:
		s.err = os.NewSyscallError("splice", err)
	}
	s.n = n
	return true
}

// pump splices the pipe's bytes to dst; false: dst has no room, wait for it.
func (s *splicer) pump(fd uintptr) bool {
	for s.inPipe > 0 {
		n, err := rawsys.Splice(s.p.r, int(fd), s.inPipe)
		if err == unix.EAGAIN {
			return false
		}
		if err != nil {
			s.err = os.NewSyscallError("splice", err)
			return true
		}
		s.inPipe -= n
		s.n += n
		// Delivered: the other direction looks at it when its deadline expires.
		s.d.lastMoved.Store(mono())
	}
	return true
}

// takeUrgent takes the urgent byte at src's mark (the pipe is empty: every byte before
// the mark has gone on), then passes it on and steps past the mark. The urgent pointer
// may have come before its byte: it waits for the byte then.
func (s *splicer) takeUrgent() error {
	var rerr error
	err := s.src.Read(func(fd uintptr) bool {
		s.oob, rerr = rawsys.RecvOOB(int(fd), false)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	if rerr == nil {
		s.held = true
		if err := s.sendUrgent(); err != nil {
			return err
		}
	}
	// Any other error: no byte to take at the mark after all; step past it.
	return s.stepMark()
}

// sendUrgent sends the held urgent byte to dst as urgent data.
func (s *splicer) sendUrgent() error {
	var werr error
	err := s.dst.Write(func(fd uintptr) bool {
		werr = rawsys.SendOOB(int(fd), s.oob)
		return werr != unix.EAGAIN
	})
	if err == nil && werr != nil {
		err = os.NewSyscallError("sendto", werr)
	}
	if err != nil {
		return err // held still: sent by the next call
	}
	s.held = false
	s.d.delivered(1)
	return nil
}

// stepMark reads past src's urgent mark (a read there skips the urgent byte's place and
// ends the socket's urgent state, after which splices go on) and writes what the read
// found to dst, first. It never waits: a read that finds nothing has stepped past too.
func (s *splicer) stepMark() error {
	buf := make([]byte, 512)
	var n int
	var rerr error
	if err := s.src.Read(func(fd uintptr) bool {
		n, rerr = rawsys.Read(int(fd), buf)
		return true
	}); err != nil {
		return err
	}
	switch {
	case rerr == unix.EAGAIN:
		return nil
	case rerr != nil:
		return os.NewSyscallError("read", rerr)
	}
	s.d.pending = append(s.d.pending, buf[:n]...)
	return s.d.writePending()
}

// release gives back the pipe once the direction has stopped copying: to the pool when
// empty, closed when it still holds bytes that will never be written.
func (s *splicer) release() {
	if s.p == nil {
		return
	}
	if s.inPipe == 0 {
		putPipe(s.p)
	} else {
		s.p.close()
	}
	s.p, s.inPipe = nil, 0
}

// splicePipe is a pipe for splicing; the pool (pipes) closes the pipes it drops.
type splicePipe struct {
	r, w    int
	cleanup runtime.Cleanup
}

func (p *splicePipe) close() {
	p.cleanup.Stop()
	_ = rawsys.Close(p.r)
	_ = rawsys.Close(p.w)
}

// pipes holds empty pipes for the next splices of any flow.
var pipes sync.Pool

func getPipe() (*splicePipe, error) {
	if p, ok := pipes.Get().(*splicePipe); ok {
		return p, nil
	}
	fds, err := rawsys.Pipe(maxSplice)
	if err != nil {
		return nil, os.NewSyscallError("pipe2", err)
	}
	p := &splicePipe{r: fds[0], w: fds[1]}
	p.cleanup = runtime.AddCleanup(p, func(fds [2]int) {
		_ = rawsys.Close(fds[0])
		_ = rawsys.Close(fds[1])
	}, fds)
	return p, nil
}

// putPipe keeps an empty pipe for the next splices.
func putPipe(p *splicePipe) { pipes.Put(p) }
