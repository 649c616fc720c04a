package relay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/rawsys"
	"github.com/kl-egress/kl/relayd/sniff"
	"github.com/kl-egress/kl/relayd/upstream"
	"github.com/kl-egress/kl/rules"
)

// The event loops carry transparent flows without a goroutine per connection: a
// goroutine locked to its thread waits on an epoll set of its pods' listeners and flows'
// sockets, which are made with raw system calls (the netpoller never sees them), and
// does everything a flow needs between two waits: accept, original destination, a peek
// for the hostname when the policy needs one, decision, a non-blocking connect from the
// pod's netns (to the destination, or to an upstream at a literal address and through
// its handshake), audit and metrics, then the bytes both ways (through the loop's buffer
// while reads are small, spliced through pipes from the first one that fills it), half-closes,
// and the peek, connect, handshake and idle timeouts. On a small machine the scheduler's
// hand-offs between goroutines cost more than the flow's own work (the conn/s rows of
// make bench: a bare Go relay against a bare epoll relay doing the same job). A flow
// whose policy needs its process (sock_diag and /proc lookups block) or whose exit dials
// in Go code (attach, gateway, an upstream named by hostname) is handed to the goroutine
// path (carry) as a *net.TCPConn, with its decision when it has one.
const (
	loopBatch     = 256
	loopPipeSize  = 1 << 20 // as Go's splice pipes: 16 times fewer splices than 64 KiB
	loopPipesKept = 256     // empty pipes kept for the next flows
	loopHeldWait  = 4       // ms a busy loop waits for its next event holding its P (rawsys.WaitHeld)
	// loopET: EPOLLPRI reports TCP urgent data (lhalf.urg), which costs nothing until a
	// peer sends some: a socket reports it only while an urgent byte is waiting, and
	// with the events of that socket's own wake-ups.
	loopET = unix.EPOLLIN | unix.EPOLLPRI | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET
)

// loop is one event-loop thread. Its fields below mu are only touched on that thread.
type loop struct {
	r    *Relay
	ep   int
	wake int // eventfd: commands are waiting

	mu      sync.Mutex
	cmds    []cmd
	stopped bool         // the loop has ended: do runs nothing, wake is closed
	npods   atomic.Int32 // pods placed here

	ents     []ent         // by descriptor
	flows    []*lflow      // every flow, for the timeout scan (lflow.idx)
	pipes    [][2]int      // empty pipes for the next flows
	closing  []int         // sockets to close once this batch of events is handled
	in       *netns.Handle // the netns the thread is in (nil: the process's)
	home     *netns.Handle // the process's netns
	first    bool          // the thread is the process's first (its id is the pid)
	tick     time.Duration
	next     int64      // the next idle scan (mono)
	due      int64      // the earliest deadline (mono; 0: none)
	paused   int        // listeners backing off
	now      int64      // mono at the last wake
	buf      [4096]byte // upstream answers are read into it
	peek     [sniff.MaxPeek]byte
	acks     []chan struct{} // commands run in this batch, acknowledged after flush
	stopping bool
	stop     chan struct{} // closed when the loop has ended
}

type cmd struct {
	fn   func()
	done chan struct{}
}

// ent is what a descriptor is to the loop: a pod's listener or a flow's socket.
type ent struct {
	ln *lpod
	f  *lflow
}

// lpod is a pod served by a loop: its redirect listener.
type lpod struct {
	p      *pod
	fd     int
	paused int64         // accept backs off until then (mono; 0: not paused)
	delay  time.Duration // the last back-off
	gone   bool          // no longer counted in the loop's npods (closeLoopFlows)
}

type lstate uint8

const (
	lSniff     lstate = iota // peeking for the hostname before the decision
	lConnect                 // the outgoing connect is under way
	lHandshake               // talking to the upstream (lflow.hs)
	lRelay                   // both directions spliced
)

// lflow is one flow on a loop.
type lflow struct {
	lp      *lpod
	idx     int // in loop.flows
	c, u    int // the workload's connection and the outgoing one (-1: none)
	state   lstate
	dead    bool
	f       rules.Flow     // until recorded
	pol     Decider        // until decided
	seen    int            // lSniff: bytes seen by the last peek
	d       rules.Decision // until recorded
	to      netip.AddrPort // where the outgoing connection goes
	started int64          // when the dial started (mono)
	by      int64          // connect deadline (mono)
	last    int64          // when bytes last moved (mono)
	h       [2]lhalf       // workload to exit (up), exit to workload (down)
	done    func(up, down int64)
	hs      *upstream.Handshake // an upstream exit's, until the tunnel is open
	sent    int                 // bytes of hs.Out() written
	// earlyRead: the workload's first bytes were read for the handshake (EarlyData).
	earlyRead bool
	// earlyErr: that read failed (the workload reset its connection); kept for once the
	// tunnel is open (handshake).
	earlyErr error
}

// lhalf is one direction of a flow: bytes spliced from its source into the pipe and not
// yet out to its destination.
type lhalf struct {
	p     [2]int // the pipe: read end, write end (-1: none held)
	n     int    // bytes in the pipe
	early []byte // bytes to deliver before the pipe's (an upstream's, read with its answer)
	// blocked: the direction waits for its destination to take bytes (else for its
	// source to send some).
	blocked bool
	moved   int64 // bytes delivered
	eof     bool  // the source ended
	done    bool  // and all of it went on, followed by a half-close (or the close)
	bulk    bool  // a read filled the loop's buffer: splice from now on
	// ready: the source may hold bytes not read yet; it reported some (or a hang-up)
	// since it was last found empty, by an EAGAIN or by a read that did not fill the
	// buffer. Edge-triggered, anything that arrives after that reports again, so a
	// direction reads only when ready: no read that would only say EAGAIN. A socket
	// reports what it already holds when the loop starts watching it, so both start
	// not ready. hup: the
	// source reported a hang-up or an error, which it reports only once, so its reads go
	// on to the end of stream (or the error) whatever their size.
	ready bool
	hup   bool
	// urg: the source reported urgent data (EPOLLPRI) that the direction has not yet
	// passed on (urgent); oob is its byte once taken from the source and until the
	// destination takes it (held).
	urg  bool
	held bool
	oob  byte
}

func newLoop(r *Relay) (*loop, error) {
	home, err := netns.Open("") // the process's netns: no descriptor
	if err != nil {
		return nil, fmt.Errorf("event loop: %w", err)
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("event loop: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		unix.Close(ep)
		return nil, fmt.Errorf("event loop: %w", err)
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return nil, fmt.Errorf("event loop: %w", err)
	}
	// The idle scan runs eight times per idle timeout (at most once a second), so an idle
	// flow ends at most an eighth of it late; deadlines (peek, connect, handshake, accept
	// back-off) wake the loop when they are due (arm).
	tick := min(max(r.o.IdleTimeout/8, 5*time.Millisecond), time.Second)
	l := &loop{r: r, ep: ep, wake: wake, home: home, tick: tick, stop: make(chan struct{})}
	addPs(1)
	go l.run()
	return l, nil
}

// do runs fn on the loop's thread and returns when it has run and the sockets it closed
// are closed. It reports false, fn not run, when the loop has ended (an Open that picked
// the loop before a concurrent Shutdown stopped it). It must not be called from the loop
// itself.
func (l *loop) do(fn func()) bool {
	done := make(chan struct{})
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return false
	}
	l.cmds = append(l.cmds, cmd{fn, done})
	// Under mu: close closes wake only once it has set stopped under mu, so the number is
	// still the eventfd's.
	one := [8]byte{1}
	_, err := unix.Write(l.wake, one[:])
	l.mu.Unlock()
	if err != nil && err != unix.EAGAIN {
		panic(fmt.Sprintf("event loop: wake: %v", err)) // the eventfd is the loop's own: a bug
	}
	select {
	case <-done:
		return true
	case <-l.stop:
	}
	select {
	case <-done: // run in the loop's last batch
		return true
	default:
		return false
	}
}

func (l *loop) run() {
	// Never unlocked: the thread enters pods' netns for their sockets and may stay in the
	// last one (goHome); the runtime ends it with this goroutine.
	runtime.LockOSThread()
	l.first = unix.Gettid() == unix.Getpid()
	events := make([]unix.EpollEvent, loopBatch)
	busy := false // the last wait returned events
	for {
		timeout := -1 // nothing to time
		if at := l.wakeAt(); at != 0 {
			timeout = int(max(at-mono()+int64(time.Millisecond)-1, 0) / int64(time.Millisecond))
		}
		// While events keep coming, the loop waits holding its P (WaitHeld), for at most
		// loopHeldWait; once that passes without one, it waits in the scheduler, so an
		// idle loop costs the process neither a P nor wake-ups.
		wait := rawsys.Wait
		if busy {
			wait = rawsys.WaitHeld
			if timeout < 0 || timeout > loopHeldWait {
				timeout = loopHeldWait
			}
		}
		n, err := wait(l.ep, events, timeout)
		if err != nil {
			l.r.o.Log.Error("event loop: epoll_wait failed", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		busy = n > 0
		l.now = mono()
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			if fd == l.wake {
				l.commands()
				continue
			}
			if fd >= len(l.ents) {
				continue
			}
			if e := l.ents[fd]; e.ln != nil {
				l.accept(e.ln)
			} else if e.f != nil && !e.f.dead {
				l.step(e.f, fd, ev.Events)
			}
		}
		if l.now >= l.next || l.due != 0 && l.now >= l.due {
			l.scan()
			l.next = l.now + int64(l.tick)
		}
		l.flush()
		if l.first {
			l.goHome()
		}
		for _, done := range l.acks {
			close(done)
		}
		l.acks = l.acks[:0]
		if l.stopping {
			l.close()
			return
		}
	}
}

// flush closes the sockets of this batch's ended flows. They close only now, so that no
// descriptor number in this batch's events is reused by an accept in the same batch.
func (l *loop) flush() {
	for _, fd := range l.closing {
		l.ents[fd] = ent{}
		_ = rawsys.Close(fd)
	}
	l.closing = l.closing[:0]
}

// commands runs the waiting commands.
func (l *loop) commands() {
	var b [8]byte
	_, _ = rawsys.Read(l.wake, b[:])
	l.mu.Lock()
	cmds := l.cmds
	l.cmds = nil
	l.mu.Unlock()
	for _, c := range cmds {
		c.fn()
		l.acks = append(l.acks, c.done)
	}
}

// close ends the loop: flows and listeners still on it (a pod placed here while
// Shutdown stopped the loops) are closed, then its own descriptors.
func (l *loop) close() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	for len(l.flows) > 0 {
		l.closeFlow(l.flows[0])
	}
	for _, e := range l.ents {
		if e.ln != nil && e.ln.fd >= 0 {
			l.closeListener(e.ln)
		}
	}
	l.flush()
	for _, p := range l.pipes {
		_ = rawsys.Close(p[0])
		_ = rawsys.Close(p[1])
	}
	_ = unix.Close(l.wake)
	_ = unix.Close(l.ep)
	l.goHome() // the thread ends with the goroutine, unless it is the first one
	_ = l.home.Close()
	addPs(-1)
	close(l.stop)
}

// psMu serialises addPs: a busy loop waits holding its P (rawsys.WaitHeld), so each loop
// running in the process adds one to GOMAXPROCS, which the rest of the daemon keeps.
var (
	psMu    sync.Mutex
	psAdded int // under psMu: loops running, each holding the P it added
)

func addPs(n int) {
	psMu.Lock()
	psAdded += n
	runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + n)
	psMu.Unlock()
}

// wakeAt is when the loop must wake without events (mono; 0: never): the next idle scan
// while there are flows, or the next deadline.
func (l *loop) wakeAt() int64 {
	var at int64
	if len(l.flows) > 0 {
		at = l.next
	}
	if l.due != 0 && (at == 0 || l.due < at) {
		at = l.due
	}
	return at
}

// arm makes the loop wake by t (mono) for a deadline.
func (l *loop) arm(t int64) {
	if l.due == 0 || t < l.due {
		l.due = t
	}
}

func (l *loop) set(fd int, e ent) {
	for fd >= len(l.ents) {
		l.ents = append(l.ents, make([]ent, len(l.ents)+256)...)
	}
	l.ents[fd] = e
}

// addPod starts accepting on lp's listener (on the loop).
func (l *loop) addPod(lp *lpod) error {
	l.set(lp.fd, ent{ln: lp})
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, lp.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(lp.fd)}); err != nil {
		l.ents[lp.fd] = ent{}
		return fmt.Errorf("event loop: add listener: %w", err)
	}
	return nil
}

// closeListener stops accepting for lp (on the loop); its flows go on.
func (l *loop) closeListener(lp *lpod) {
	if lp.fd < 0 {
		return
	}
	_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, lp.fd, nil)
	l.closing = append(l.closing, lp.fd)
	lp.fd = -1
	if lp.paused != 0 {
		lp.paused = 0
		l.paused--
	}
}

// closeFlows ends every flow of lp (on the loop) as the goroutine path's closeConns does:
// a plain close of both connections (closeFlow).
func (l *loop) closeFlows(lp *lpod) {
	for i := 0; i < len(l.flows); {
		if f := l.flows[i]; f.lp == lp {
			l.closeFlow(f) // moves the last flow to i
			continue
		}
		i++
	}
	if l.in == lp.p.ns {
		l.goHome()
	}
}

// errCutPeeking: as errCut (relay.go), for a flow whose hostname had not arrived;
// errCutFlow for any flow the relay ends (its pod closed, Shutdown's drain over): both
// ends are reset, as the goroutine path resets the connections it tracks, so a cut never
// looks like a clean end of stream.
var (
	errCutPeeking = errors.New("closed by the relay before the hostname arrived")
	errCutFlow    = errors.New("closed by the relay")
)

// closeFlow cuts lf (both ends reset). A flow decided whose exit has not answered yet is
// recorded (one record per decision) with the cut as its reason, where the goroutine
// path's dial would go on and be recorded; one still peeking counts as refused.
func (l *loop) closeFlow(lf *lflow) {
	switch lf.state {
	case lSniff: // as on the goroutine path, whose peek fails when the connection closes
		l.r.peekFailed(lf.lp.p.w.Load().ID, &lf.f, errCutPeeking)
	case lConnect, lHandshake:
		l.unreached(lf, l.exitError(lf, errCut))
	}
	l.end(lf, errCutFlow)
}

// goHome moves the thread back to the process's netns when a socket took it elsewhere:
// when the netns's pod goes away (a thread in a netns keeps it alive) and, when the
// thread is the process's first one (the runtime may run the loop there), before every
// wait, since the whole process would then look to be in the pod (ip netns pids, nsenter
// -t). A loop on any other thread stays where its last socket was made: consecutive
// flows of one pod cost no setns.
func (l *loop) goHome() {
	if l.in == nil {
		return
	}
	if err := l.home.EnterLocked(); err != nil {
		l.r.o.Log.Error("event loop: return to the node's netns", "err", err)
		return
	}
	l.in = nil
}

// accept takes one waiting connection from lp's listener, as nginx does by default: the
// listener is level-triggered, so the next wait reports it again while more are waiting,
// along with the other sockets' events, and no accept is made only to hear EAGAIN. A
// listener closed earlier in this batch (its event was already in it) takes none.
func (l *loop) accept(lp *lpod) {
	if lp.fd < 0 {
		return
	}
	for {
		var peer rawsys.Sockaddr
		c, err := rawsys.Accept4(lp.fd, &peer)
		switch err {
		case nil:
			lp.delay = 0
		case unix.EAGAIN:
			return
		case unix.ECONNABORTED:
			continue
		default:
			// Out of descriptors or memory: stop asking (the listener is level-triggered)
			// and try again after a back-off, keeping the listener.
			lp.delay = min(max(2*lp.delay, 5*time.Millisecond), time.Second)
			lp.paused = l.now + int64(lp.delay)
			l.paused++
			l.arm(lp.paused)
			_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_MOD, lp.fd, &unix.EpollEvent{Fd: int32(lp.fd)})
			l.r.o.Log.Warn("accept failed", "workload", lp.p.w.Load().ID, "err", err, "retry", lp.delay)
			return
		}
		l.admit(lp, c, peer.AddrPort())
		return
	}
}

// admit takes a new connection c from src: its original destination is checked, then
// the flow is decided (after a peek for its hostname when the policy needs it) or handed
// to the goroutine path.
func (l *loop) admit(lp *lpod, c int, src netip.AddrPort) {
	r := l.r
	w := lp.p.w.Load()
	r.begin()
	id := r.flowSeq.Add(1)
	var local rawsys.Sockaddr
	err := rawsys.Getsockname(c, &local)
	var dst netip.AddrPort
	if err == nil {
		la := local.AddrPort()
		if dst, err = netns.OriginalDstFD(c, la.Addr().Is4()); err == nil {
			dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
			err = r.admit(dst, la)
		}
	}
	if err != nil {
		r.refuse(w.ID, id, err)
		abort(c)
		r.end()
		return
	}
	lf := &lflow{lp: lp, c: c, u: -1, f: r.newFlow(w, dst, src, id), pol: r.o.Policy(), idx: len(l.flows)}
	lf.h[0].p, lf.h[1].p = [2]int{-1, -1}, [2]int{-1, -1}
	l.flows = append(l.flows, lf)
	if wantsProcess(lf.pol) {
		l.handoff(lf, nil) // sock_diag and /proc: not for the loop
		return
	}
	if r.wantsHost(lf.pol, dst.Port()) {
		// Peek for the hostname as the client's bytes arrive, for at most SniffWait.
		lf.state, lf.by = lSniff, l.now+int64(r.o.SniffWait)
		l.arm(lf.by)
		if err := l.watch(c, lf); err != nil {
			l.refused(lf, err)
		}
		return
	}
	l.route(lf)
}

// sniff peeks at what the client sent so far; once that settles the hostname (or the
// wait is over: scan), the flow is decided.
func (l *loop) sniff(lf *lflow) {
	host, done, err := sniff.Peek(lf.c, l.peek[:], &lf.seen)
	switch {
	case err != nil:
		l.r.peekFailed(lf.lp.p.w.Load().ID, &lf.f, err)
		l.end(lf, errRefusedFlow)
	case done:
		lf.f.Host = host
		l.route(lf)
	}
}

// refused ends a flow that failed before its decision (the workload's connection is
// reset).
func (l *loop) refused(lf *lflow, err error) {
	l.r.count("refused")
	l.r.o.Log.Warn("flow refused", "workload", lf.lp.p.w.Load().ID, "flow", lf.f.ID, "err", err)
	l.end(lf, errRefusedFlow)
}

// route decides lf and starts the connect to its exit: the destination (direct) or an
// upstream at a literal address; other exits are dialed on the goroutine path.
func (l *loop) route(lf *lflow) {
	r := l.r
	pol := lf.pol
	w := lf.lp.p.w.Load()
	d := r.decide(pol, &lf.f, w.ID)
	lf.d, lf.started = d, l.now
	switch d.Exit {
	case rules.ExitDeny:
		r.deny(d, &lf.f)
		l.end(lf, errRefusedFlow)
		return
	case rules.ExitDirect:
		lf.to, lf.by = lf.f.Dst, l.now+int64(r.o.ConnectTimeout)
	default:
		r.keepHostIfDecided(pol, &lf.f, d)
		if r.o.Exits[d.Exit] == nil {
			r.unavailable(d, &lf.f, w.ID)
			l.end(lf, errRefusedFlow)
			return
		}
		up, ok := r.upstreams[d.Exit]
		if !ok {
			l.handoff(lf, &d)
			return
		}
		hs, err := up.hs.Handshake(upstream.Target{Host: lf.f.Host, Addr: lf.f.Dst, Port: lf.f.Dst.Port()})
		if err != nil {
			r.count(d.Exit)
			l.fail(lf, err)
			return
		}
		// The upstream's timeout bounds its connect and handshake, and so does the
		// relay's, as the goroutine path's dial context does: the shorter one ends it,
		// and is the one a timeout's reason names (Bound).
		hs.Bound(r.o.ConnectTimeout)
		lf.hs, lf.to, lf.by = hs, up.addr, l.now+int64(min(up.hs.Timeout(), r.o.ConnectTimeout))
	}
	r.count(d.Exit)
	lf.state, lf.pol = lConnect, nil
	l.arm(lf.by)
	l.connect(lf)
}

// abort closes a socket with a reset.
func abort(fd int) {
	_ = rawsys.Abort(fd)
	_ = rawsys.Close(fd)
}

// handoff gives lf's connection to the goroutine path, which learns what the policy needs
// and decides (unless d is given), and dials the exit; lf leaves the loop. A decided flow
// that cannot be handed over (no descriptor for it, or its pod closed meanwhile) is
// counted under its exit and recorded with the reason, as the goroutine path records one
// cut before its exit's connection is tracked (carry).
func (l *loop) handoff(lf *lflow, d *rules.Decision) {
	r := l.r
	p := lf.lp.p
	if lf.c < len(l.ents) && l.ents[lf.c].f == lf {
		// The duplicate below shares the socket: the loop must not hear of it again.
		_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_DEL, lf.c, nil)
		l.ents[lf.c] = ent{}
	}
	l.unlist(lf)
	lf.dead = true
	file := os.NewFile(uintptr(lf.c), "")
	nc, err := net.FileConn(file) // a duplicate, polled by the runtime
	if err != nil {               // out of descriptors
		_ = rawsys.Abort(lf.c) // closed with file: a refusal, not an end of stream
		file.Close()
		r.o.Log.Warn("flow refused: hand-over to the goroutine path failed", "workload", p.w.Load().ID, "flow", lf.f.ID, "err", err)
		if d != nil {
			r.count(d.Exit)
			r.record(*d, &lf.f, audit.Reason(err))
		} else {
			r.count("refused")
		}
		r.end()
		return
	}
	file.Close()
	tc := nc.(*net.TCPConn)
	if !p.track(tc) {
		reset(tc) // cut, as closeFlow cuts a flow still on the loop
		if d != nil {
			r.count(d.Exit)
			r.record(*d, &lf.f, errCut.Error())
		}
		r.end()
		return
	}
	go r.carry(p, tc, p.w.Load(), lf.f, lf.pol, d)
}

// connect makes lf's outgoing socket in the pod's netns and starts its connect.
func (l *loop) connect(lf *lflow) {
	p := lf.lp.p
	if l.in != p.ns {
		// Sockets are made in the netns the thread is in; within a batch of events it
		// moves only when the next one is for another pod.
		if err := p.ns.EnterLocked(); err != nil {
			l.fail(lf, err)
			return
		}
		l.in = p.ns
	}
	sa, family := rawsys.SockaddrOf(lf.to)
	u, err := rawsys.Socket(family)
	if err != nil {
		l.fail(lf, l.dialError(lf, os.NewSyscallError("socket", err)))
		return
	}
	lf.u = u
	if err := rawsys.SetsockoptInt(u, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		l.fail(lf, fmt.Errorf("set TCP_NODELAY: %w", err))
		return
	}
	if m := l.r.o.Mark; m != 0 {
		if err := rawsys.SetsockoptInt(u, unix.SOL_SOCKET, unix.SO_MARK, int32(m)); err != nil {
			l.fail(lf, fmt.Errorf("set SO_MARK %#x: %w", m, err))
			return
		}
	}
	if err := rawsys.Connect(u, &sa); err != nil && err != unix.EINPROGRESS {
		l.fail(lf, l.dialError(lf, os.NewSyscallError("connect", err)))
		return
	}
	// The connect's end comes as EPOLLOUT on u (at once if it is already done); the
	// workload's bytes wait in c until the relaying starts.
	if err := l.watch(lf.u, lf); err != nil {
		l.fail(lf, err)
		return
	}
	if err := l.watch(lf.c, lf); err != nil {
		l.fail(lf, err)
	}
}

func (l *loop) watch(fd int, lf *lflow) error {
	if fd < len(l.ents) && l.ents[fd].f == lf {
		return nil // already (the workload's connection, since the peek)
	}
	l.set(fd, ent{f: lf})
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: loopET, Fd: int32(fd)}); err != nil {
		l.ents[fd] = ent{}
		return fmt.Errorf("event loop: watch socket: %w", err)
	}
	return nil
}

// dialError is a failed connect as the goroutine path's dial reports it (audit.Reason
// takes the address out).
func (l *loop) dialError(lf *lflow, err error) error {
	if lf.hs != nil {
		return lf.hs.ConnectError(err)
	}
	network := "tcp6"
	if lf.to.Addr().Is4() {
		network = "tcp4"
	}
	return fmt.Errorf("dial in %s: %w", lf.lp.p.ns.Name(), &net.OpError{Op: "dial", Net: network, Addr: net.TCPAddrFromAddrPort(lf.to), Err: err})
}

// step moves flow lf on after events ev on its socket fd.
func (l *loop) step(lf *lflow, fd int, ev uint32) {
	if ev&(unix.EPOLLIN|unix.EPOLLPRI|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		// Noted in every state: an event that arrives while nothing reads the socket
		// (connecting, a direction waiting for its destination) does not come again.
		h := &lf.h[0] // c is up's source, u down's
		if fd == lf.u {
			h = &lf.h[1]
		}
		h.ready = true
		h.hup = h.hup || ev&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0
		h.urg = h.urg || ev&unix.EPOLLPRI != 0
	}
	switch lf.state {
	case lSniff:
		if fd == lf.c {
			l.sniff(lf)
		}
	case lConnect:
		if fd != lf.u || ev&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) == 0 {
			return
		}
		if ev&(unix.EPOLLERR|unix.EPOLLHUP) != 0 {
			// Writable alone is a connect that succeeded; a failed one reports an error
			// or a hang-up, and SO_ERROR says which.
			soerr, err := rawsys.GetsockoptInt(lf.u, unix.SOL_SOCKET, unix.SO_ERROR)
			if err == nil {
				err = unix.Errno(soerr)
				if soerr == 0 {
					err = unix.ECONNRESET // a hang-up whose error was taken: reset
				}
			}
			l.fail(lf, l.dialError(lf, os.NewSyscallError("connect", err)))
			return
		}
		if lf.hs != nil {
			lf.state = lHandshake
			l.handshake(lf)
			return
		}
		l.connected(lf)
	case lHandshake:
		if fd == lf.u {
			l.handshake(lf) // the workload's bytes wait in c until the tunnel is open
		}
	case lRelay:
		l.pumpFor(lf, fd, ev)
	}
}

// handshake talks to the upstream until the tunnel is open, it refuses, or the socket
// has nothing more to read or no room to write (its next event resumes). The upstream
// answers only what it was sent: right after a write there is nothing to read yet, and
// the answer's arrival is the event that resumes.
//
// An upstream that takes early data (http, pipeline: true) gets what the workload has
// sent by the first write (read once, at most the loop's buffer) in the same write as the
// request; what that write does not take waits with the rest of the direction, for the
// answer.
func (l *loop) handshake(lf *lflow) {
	hs, up, down := lf.hs, &lf.h[0], &lf.h[1]
	for !hs.Done() {
		if out := hs.Out(); len(out) > 0 {
			if hs.EarlyData() && !lf.earlyRead {
				// Read even if epoll has not reported the workload's socket yet: the
				// connect's event often comes first in the same batch. An end of
				// stream is kept for after the tunnel opens.
				lf.earlyRead = true
				b, err := l.bufRead(lf, up, lf.c)
				if err != nil {
					// The workload's failure is not the upstream's: the handshake goes
					// on, and the flow ends with it once the tunnel is open, as it does
					// when the read comes only then (an upstream without early data,
					// the goroutine path's Dial). Either way the record says whether the
					// exit was reached, and the dial counts as a success when it was.
					lf.earlyErr = os.NewSyscallError("read", err)
				}
				up.early = bytes.Clone(b) // out of the loop's buffer, which the answer is read into
			}
			var n int
			var err error
			if rest := out[lf.sent:]; len(up.early) > 0 {
				n, err = rawsys.Write2(lf.u, rest, up.early)
				if k := n - len(rest); k > 0 {
					up.early, n = up.early[k:], len(rest)
					up.moved += int64(k)
				}
			} else {
				n, err = rawsys.Write(lf.u, rest)
			}
			if err == unix.EAGAIN {
				return
			}
			if err != nil {
				l.fail(lf, hs.IOError(os.NewSyscallError("write", err)))
				return
			}
			if lf.sent += n; lf.sent < len(out) {
				continue
			}
			lf.sent = 0
			hs.Sent()
			continue
		}
		if !down.ready {
			return
		}
		want := min(hs.Want(), len(l.buf))
		n, err := rawsys.Read(lf.u, l.buf[:want])
		switch {
		case err == unix.EAGAIN:
			down.ready = false
			return
		case err != nil:
			l.fail(lf, hs.IOError(os.NewSyscallError("read", err)))
			return
		case n == 0:
			l.fail(lf, hs.IOError(io.EOF))
			return
		}
		down.ready = n == want || down.hup // a short read emptied the socket
		if err := hs.Feed(l.buf[:n]); err != nil {
			l.fail(lf, err)
			return
		}
	}
	down.early = hs.Rest()
	lf.hs = nil
	l.connected(lf)
}

// bufRead reads src, direction h's source, into the loop's buffer and returns what it
// read (nil when there was nothing: ready goes off; or at the end of stream: eof goes
// on). A read that does not fill the buffer emptied the socket, so ready goes off
// unless it hung up; one that fills it makes the direction bulk.
func (l *loop) bufRead(lf *lflow, h *lhalf, src int) ([]byte, error) {
	n, err := rawsys.Read(src, l.buf[:])
	switch {
	case err == unix.EAGAIN:
		h.ready = false
		return nil, nil
	case err != nil:
		return nil, err
	case n == 0:
		h.eof = true
		return nil, nil
	}
	lf.last = l.now
	h.bulk = n == len(l.buf)
	h.ready = h.bulk || h.hup
	return l.buf[:n], nil
}

// connected records the decision and starts relaying.
func (l *loop) connected(lf *lflow) {
	r := l.r
	r.o.Metrics.Dialed(lf.d.Exit, time.Duration(l.now-lf.started), nil)
	r.record(lf.d, &lf.f, "")
	lf.done = r.o.Metrics.Start(lf.d.Exit)
	lf.f, lf.d = rules.Flow{}, rules.Decision{} // an idle flow keeps neither
	lf.state, lf.last = lRelay, l.now
	if lf.earlyErr != nil {
		l.end(lf, lf.earlyErr) // both ends reset, as any failed flow's
		return
	}
	l.pump(lf)
}

// fail ends a flow whose exit could not be reached: recorded with the reason, and the
// workload's connection reset.
func (l *loop) fail(lf *lflow, err error) {
	l.unreached(lf, err)
	l.end(lf, errRefusedFlow)
}

// unreached counts and records a decided flow that did not reach its exit.
func (l *loop) unreached(lf *lflow, err error) {
	l.r.o.Metrics.Dialed(lf.d.Exit, time.Duration(mono()-lf.started), err)
	l.r.unreachable(lf.d, &lf.f, lf.lp.p.w.Load().ID, err)
}

// exitError words err, met while connecting (lConnect) or talking to an upstream
// (lHandshake), as the goroutine path's dial would.
func (l *loop) exitError(lf *lflow, err error) error {
	if lf.state == lHandshake {
		return lf.hs.IOError(err)
	}
	return l.dialError(lf, err)
}

// errRefusedFlow ends a flow that is not carried (denied, refused, its exit unreachable):
// the workload gets a reset.
var errRefusedFlow = errors.New("flow refused")

// pump moves both directions on until each would block, and ends the flow when both are
// done or one fails.
func (l *loop) pump(lf *lflow) {
	l.pumpHalves(lf, true, true)
}

// pumpFor is pump after events ev on socket fd: only the directions that wait for them
// move. Edge-triggered, a socket reports every segment that arrives; while a direction's
// pipe waits for its destination to take bytes, the source's arrivals change nothing
// for it, and trying would cost two splices that move nothing. An error or hang-up
// moves both, so that the failure is found.
func (l *loop) pumpFor(lf *lflow, fd int, ev uint32) {
	if ev&(unix.EPOLLERR|unix.EPOLLHUP) != 0 {
		l.pumpHalves(lf, true, true)
		return
	}
	readable := ev&(unix.EPOLLIN|unix.EPOLLPRI|unix.EPOLLRDHUP) != 0
	writable := ev&unix.EPOLLOUT != 0
	up, down := &lf.h[0], &lf.h[1] // up reads c and writes u
	l.pumpHalves(lf,
		fd == lf.c && readable && !up.blocked || fd == lf.u && writable && up.blocked,
		fd == lf.u && readable && !down.blocked || fd == lf.c && writable && down.blocked)
}

func (l *loop) pumpHalves(lf *lflow, up, down bool) {
	var err error
	if up {
		err = l.move(lf, &lf.h[0], lf.c, lf.u)
	}
	if err == nil && down {
		err = l.move(lf, &lf.h[1], lf.u, lf.c)
	}
	if err != nil || lf.h[0].done && lf.h[1].done {
		l.end(lf, err)
	}
}

// move splices src → pipe → dst until one of them would block. The pipe is only filled
// when empty, so an EAGAIN reading src means src has nothing, never that the pipe is
// full; an empty pipe goes back to the loop's pool, so an idle flow holds none.
func (l *loop) move(lf *lflow, h *lhalf, src, dst int) error {
	if blocked, err := l.writeEarly(lf, h, dst); blocked || err != nil {
		return err
	}
	for !h.done {
		if h.n > 0 {
			n, err := rawsys.Splice(h.p[0], dst, h.n)
			if err == unix.EAGAIN {
				h.blocked = true
				return nil
			}
			if err != nil {
				return err
			}
			h.n -= n
			h.moved += int64(n)
			lf.last = l.now
			continue
		}
		if h.eof {
			h.done = true
			l.putPipe(h)
			if lf.h[0].done && lf.h[1].done {
				return nil // the flow ends: closing dst sends the end of stream
			}
			if err := rawsys.Shutdown(dst); err != nil && err != unix.ENOTCONN {
				return err
			}
			return nil
		}
		if h.urg {
			// Everything src sent before the urgent byte has gone on (the pipe and the
			// early bytes are empty here) or is still to be read, up to the mark.
			if blocked, err := l.urgent(lf, h, src, dst); blocked || err != nil {
				return err
			}
		}
		if !h.ready { // src has nothing: wait for it, holding no pipe
			h.blocked = false
			l.putPipe(h)
			return nil
		}
		if !h.bulk {
			// Small transfers (a request, an answer, a keep-alive) go through the loop's
			// buffer: a read and a write cost less than two splices and a pipe, which
			// pay off only for bulk. A read that fills the buffer switches the
			// direction to splice for good.
			b, err := l.bufRead(lf, h, src)
			if err != nil {
				return err
			}
			if len(b) == 0 {
				continue // nothing (ready is off) or the end of stream (eof is on)
			}
			h.early = b
			blocked, err := l.writeEarly(lf, h, dst)
			if blocked {
				h.early = bytes.Clone(h.early) // the rest, out of the loop's buffer
			}
			if blocked || err != nil {
				return err
			}
			continue
		}
		if h.p[0] < 0 {
			p, err := l.getPipe()
			if err != nil {
				return err
			}
			h.p = p
		}
		n, err := rawsys.Splice(src, h.p[1], loopPipeSize)
		if err == unix.EAGAIN {
			h.ready = false
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 && !h.hup {
			// A splice that stops at an urgent mark says 0 once the end of stream has
			// come behind it, though bytes wait past the mark. An end of stream comes
			// with a hang-up event, and an urgent byte with EPOLLPRI: one that arrived
			// since the last events were read reports both with the next ones, and only
			// the hang-up makes this 0 the end (a read, not a splice, first goes past a
			// mark: urgent).
			h.ready = false
			continue
		}
		h.n += n
		h.eof = n == 0
		if n > 0 {
			lf.last = l.now
		}
	}
	return nil
}

// urgent passes on TCP urgent data that src reported (h.urg), once everything before its
// mark has gone on: splice stops at the mark and never passes it (it says EAGAIN while
// bytes wait behind), and a read stops just before it, so a direction that only read or
// spliced would wait there for ever. It reports blocked when dst has no room for the
// urgent byte (its next EPOLLOUT resumes), and leaves h.urg on while bytes before the
// mark are still to be read (reads and splices stop at it; the next call finds it).
//
// The byte goes on as urgent data (MSG_OOB), at its place in the stream: the relay is
// then invisible to both ends, as it is for everything else, and a program that relies
// on urgent data (telnet's and FTP's interrupts, a few database protocols) works through
// it as it works direct; a peer that reads plainly skips it as it would direct. Passing
// it on gives the workload nothing it could not do connected directly, and it costs one
// byte held per direction. Dropping it would have been as simple (a read past the mark)
// but would change what a program that asks for urgent data gets.
func (l *loop) urgent(lf *lflow, h *lhalf, src, dst int) (blocked bool, err error) {
	if !h.held {
		at, err := rawsys.AtMark(src)
		if err != nil {
			return false, err
		}
		if !at {
			if _, err := rawsys.RecvOOB(src, true); err != nil {
				// No urgent byte waits any more (a read went past the mark before
				// its event was read: lost to the destination, as to a plain reader;
				// or a newer urgent pointer came without its byte, whose arrival
				// reports again): the direction goes on as usual.
				h.urg = false
			}
			return false, nil // else read on: the mark is ahead
		}
		if h.oob, err = rawsys.RecvOOB(src, false); err == nil {
			h.held = true
		}
		// An error: no byte to take at the mark after all; step past it below.
	}
	if h.held {
		err := rawsys.SendOOB(dst, h.oob)
		if err == unix.EAGAIN {
			h.blocked = true
			return true, nil
		}
		if err != nil {
			return false, err
		}
		h.held = false
		h.moved++
		lf.last = l.now
	}
	// A read at the mark skips the urgent byte's place and goes on with what follows
	// (the socket's urgent state ends there); it must not turn a bulk direction back.
	h.urg = false
	bulk := h.bulk
	b, err := l.bufRead(lf, h, src)
	h.bulk = h.bulk || bulk
	if err != nil || len(b) == 0 {
		return false, err
	}
	h.early = b
	if blocked, err = l.writeEarly(lf, h, dst); blocked {
		h.early = bytes.Clone(h.early)
	}
	return blocked, err
}

// writeEarly writes h's early bytes to dst; blocked: dst took only part of them.
func (l *loop) writeEarly(lf *lflow, h *lhalf, dst int) (blocked bool, err error) {
	for len(h.early) > 0 {
		n, err := rawsys.Write(dst, h.early)
		if err == unix.EAGAIN {
			h.blocked = true
			return true, nil
		}
		if err != nil {
			return false, err
		}
		h.early = h.early[n:]
		h.moved += int64(n)
		lf.last = l.now
	}
	return false, nil
}

func (l *loop) getPipe() ([2]int, error) {
	if k := len(l.pipes); k > 0 {
		p := l.pipes[k-1]
		l.pipes = l.pipes[:k-1]
		return p, nil
	}
	p, err := rawsys.Pipe(loopPipeSize)
	if err != nil {
		return p, fmt.Errorf("pipe: %w", err)
	}
	return p, nil
}

// putPipe takes h's pipe back (kept when empty, closed otherwise).
func (l *loop) putPipe(h *lhalf) {
	if h.p[0] < 0 {
		return
	}
	if h.n == 0 && len(l.pipes) < loopPipesKept {
		l.pipes = append(l.pipes, h.p)
	} else {
		_ = rawsys.Close(h.p[0])
		_ = rawsys.Close(h.p[1])
	}
	h.p, h.n = [2]int{-1, -1}, 0
}

// end ends a flow: err nil is a clean end (or the pod going away); a reset from either
// side, the idle timeout and an unreachable exit reset both connections.
func (l *loop) end(lf *lflow, err error) {
	if lf.dead {
		return
	}
	lf.dead = true
	if err != nil {
		// A reset, the idle timeout, a refusal, or a failure of the relay's own (no pipe
		// for lack of descriptors): both ends see a reset, never a clean end of stream.
		for _, fd := range []int{lf.c, lf.u} {
			if fd >= 0 {
				_ = rawsys.Abort(fd)
			}
		}
	}
	for _, fd := range []int{lf.c, lf.u} {
		switch {
		case fd < 0:
		case fd < len(l.ents) && l.ents[fd].f == lf:
			l.closing = append(l.closing, fd)
		default:
			_ = rawsys.Close(fd) // never watched
		}
	}
	l.putPipe(&lf.h[0])
	l.putPipe(&lf.h[1])
	l.unlist(lf)
	if lf.done != nil {
		lf.done(lf.h[0].moved, lf.h[1].moved)
		if err != nil && l.r.o.Debug {
			l.r.o.Log.Debug("flow ended", "workload", lf.lp.p.w.Load().ID, "err", err)
		}
	}
	l.r.end()
}

// unlist takes lf out of the loop's flows.
func (l *loop) unlist(lf *lflow) {
	last := l.flows[len(l.flows)-1]
	l.flows[lf.idx], last.idx = last, lf.idx
	l.flows = l.flows[:len(l.flows)-1]
}

// scan ends flows past their deadline or idle for the idle timeout, resumes listeners
// whose accept back-off is over, and finds the next deadline.
func (l *loop) scan() {
	idle := int64(l.r.o.IdleTimeout)
	l.due = 0
	for i := 0; i < len(l.flows); {
		lf := l.flows[i]
		switch {
		case lf.state == lRelay:
			if l.now-lf.last >= idle {
				l.end(lf, errIdle)
				continue
			}
		case l.now < lf.by:
			l.arm(lf.by)
		case lf.state == lSniff:
			l.route(lf) // no name within the wait: decided without it
			if i < len(l.flows) && l.flows[i] != lf {
				continue // lf ended or left the loop: another flow is at i
			}
			l.arm(lf.by)
		default: // lConnect, lHandshake
			l.fail(lf, l.exitError(lf, os.ErrDeadlineExceeded)) // "i/o timeout", as net's dials say
			continue
		}
		i++
	}
	if l.paused == 0 {
		return
	}
	for _, e := range l.ents {
		if lp := e.ln; lp != nil && lp.paused != 0 {
			if l.now < lp.paused {
				l.arm(lp.paused)
				continue
			}
			lp.paused = 0
			l.paused--
			_ = unix.EpollCtl(l.ep, unix.EPOLL_CTL_MOD, lp.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(lp.fd)})
		}
	}
}

// loopFor places a new transparent pod on the event loop with the fewest pods, starting
// loops up to Options.Loops on first use; nil when flows are carried on goroutines (a
// test's listen or dial seams, Loops < 0, or no loop could start).
func (r *Relay) loopFor() *loop {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.handles || r.o.Loops < 0 || r.shut {
		return nil
	}
	for len(r.loops) < r.o.Loops {
		l, err := newLoop(r)
		if err != nil {
			r.o.Log.Error("event loop did not start: flows go on goroutines", "err", err)
			break
		}
		r.loops = append(r.loops, l)
	}
	var best *loop
	for _, l := range r.loops {
		if best == nil || l.npods.Load() < best.npods.Load() {
			best = l
		}
	}
	return best
}

// openOnLoop opens p's redirect listener for an event loop: one dual-stack socket, or an
// IPv4 one when the netns has no IPv6. It reports false when p is to be served on
// goroutines instead.
func (r *Relay) openOnLoop(p *pod) (bool, error) {
	l := r.loopFor()
	if l == nil {
		return false, nil
	}
	fd, err := p.ns.ListenFD(netip.AddrPortFrom(netip.IPv6Unspecified(), r.o.RedirectPort))
	if err != nil {
		var err4 error
		if fd, err4 = p.ns.ListenFD(netip.AddrPortFrom(netip.IPv4Unspecified(), r.o.RedirectPort)); err4 != nil {
			return false, errors.Join(err, err4)
		}
	}
	// Accepted connections inherit TCP_NODELAY, as Go's connections have it (the
	// goroutine path's): what the workload or the destination writes goes on at once,
	// never held back by Nagle's algorithm waiting for an acknowledgement (a delayed
	// one: up to 40 ms for a request written in two parts).
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		_ = unix.Close(fd)
		return false, fmt.Errorf("set TCP_NODELAY on the redirect listener: %w", err)
	}
	lp := &lpod{p: p, fd: fd}
	var aerr error
	if !l.do(func() { aerr = l.addPod(lp) }) {
		aerr = ErrClosed // Shutdown stopped the loop meanwhile
	}
	if aerr != nil {
		_ = unix.Close(fd)
		return false, aerr
	}
	l.npods.Add(1)
	p.l, p.lp = l, lp
	return true, nil
}

// closeLoopListener stops accepting p's flows on its loop; closeLoopFlows ends them.
func (p *pod) closeLoopListener() {
	if p.l != nil {
		p.l.do(func() { p.l.closeListener(p.lp) })
	}
}

func (p *pod) closeLoopFlows() {
	if p.l != nil {
		p.l.do(func() { p.l.closeFlows(p.lp) })
		if !p.lp.gone {
			p.lp.gone = true
			p.l.npods.Add(-1)
		}
	}
}

// stopLoops ends the event loops (after Shutdown has closed every pod).
func (r *Relay) stopLoops() {
	r.mu.Lock()
	loops := r.loops
	r.loops = nil
	r.mu.Unlock()
	for _, l := range loops {
		l.do(func() { l.stopping = true })
		<-l.stop
	}
}
