package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestLoopAfterStop checks a command sent to a loop that has ended (an Open that picked
// the loop before a concurrent Shutdown stopped it): it is not run and reported so,
// without a write to the eventfd the loop closed (EBADF, or a descriptor that reused
// its number), and a listener still on the loop when it ended is closed with it.
func TestLoopAfterStop(t *testing.T) {
	r := New(Options{})
	l, err := newLoop(r)
	if err != nil {
		t.Fatal(err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[1])
	lp := &lpod{p: &pod{}, fd: p[0]}
	if !l.do(func() {
		if err := l.addPod(lp); err != nil {
			t.Error(err)
		}
	}) {
		t.Fatal("do on a running loop reported the command not run")
	}
	l.do(func() { l.stopping = true })
	<-l.stop
	if _, err := unix.FcntlInt(uintptr(p[0]), unix.F_GETFD, 0); err != unix.EBADF {
		t.Errorf("listener left open by the ended loop: fcntl = %v, want EBADF", err)
	}
	// The number the eventfd had may now be another descriptor's.
	var q [2]int
	if err := unix.Pipe2(q[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(q[0])
	defer unix.Close(q[1])
	ran := false
	func() {
		defer func() {
			if v := recover(); v != nil {
				t.Errorf("do after the loop ended panicked: %v", v)
			}
		}()
		if l.do(func() { ran = true }) {
			t.Error("do after the loop ended reported the command run")
		}
	}()
	if ran {
		t.Error("command ran after the loop ended")
	}
	var b [8]byte
	if n, err := unix.Read(q[0], b[:]); err != unix.EAGAIN {
		t.Errorf("do wrote to a descriptor that is not the loop's: read %d bytes, err %v", n, err)
	}
}

// TestLoopAcceptClosedListener: a listener's event that comes in the same batch as the
// command closing it (Close while a connection arrives) accepts nothing: no accept on
// the closed descriptor, so no back-off counted for a listener that is gone (the loop
// would scan for it on every tick from then on).
func TestLoopAcceptClosedListener(t *testing.T) {
	r := New(Options{})
	l, err := newLoop(r)
	if err != nil {
		t.Fatal(err)
	}
	defer l.do(func() { l.stopping = true })
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[1])
	lp := &lpod{p: &pod{}, fd: p[0]}
	lp.p.w.Store(newRegistered(api.Workload{ID: "w"}))
	var paused int
	l.do(func() {
		if err := l.addPod(lp); err != nil {
			t.Error(err)
		}
		l.closeListener(lp)
		l.accept(lp) // the event already in the batch
		paused = l.paused
	})
	if paused != 0 || lp.paused != 0 {
		t.Errorf("loop paused %d, listener paused until %d after an event of a closed listener; want no back-off", paused, lp.paused)
	}
}

// TestLoopAddsP: a loop waits holding its P while busy (rawsys.WaitHeld), so each loop
// adds one to GOMAXPROCS while it runs, and gives it back when it ends.
func TestLoopAddsP(t *testing.T) {
	// An earlier test's relay may still be ending its loops: each gives its P back as it
	// ends, which would change GOMAXPROCS under this test.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		psMu.Lock()
		n := psAdded
		psMu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d loops of earlier tests still running after 10 s", n)
		}
	}
	before := runtime.GOMAXPROCS(0)
	r := New(Options{})
	var ls []*loop
	for range 2 {
		l, err := newLoop(r)
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	if got := runtime.GOMAXPROCS(0); got != before+2 {
		t.Errorf("GOMAXPROCS with two loops = %d, want %d", got, before+2)
	}
	// Busy: every command is an event, so the next waits hold the P.
	for range 100 {
		ls[0].do(func() {})
	}
	for _, l := range ls {
		l.do(func() { l.stopping = true })
		<-l.stop
	}
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Errorf("GOMAXPROCS after the loops ended = %d, want %d", got, before)
	}
}

// capturedPod is a pod netns (192.0.2.1) with kl's capture (mark, redirect port) linked
// to a server netns (192.0.2.2), and a listener there on port 80 for the test to serve.
func capturedPod(t *testing.T, name string, mark uint32, port uint16) (*testutil.Netns, net.Listener) {
	t.Helper()
	testutil.RequireTool(t, "nft")
	pod, srv := testutil.NewNetns(t, name), testutil.NewNetns(t, name+"s")
	testutil.Link(t, pod, []string{"192.0.2.1/24"}, srv, []string{"192.0.2.2/24"})
	if err := netns.Install(pod.Path, netns.Capture{RedirectPort: port, Mark: mark}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(pod.Path) })
	ln, err := netns.Listen(srv.Path, "tcp", "192.0.2.2:80")
	if err != nil {
		t.Fatal(err)
	}
	return pod, ln
}

// TestLoopNoDelay: both sockets of a loop flow have TCP_NODELAY, as the goroutine path's
// Go connections do, so no byte the relay passes on waits for an acknowledgement.
func TestLoopNoDelay(t *testing.T) {
	const mark, port = 0x4b4c, 15912
	pod, ln := capturedPod(t, "klnd", mark, port)
	testutil.Serve(t, ln, func(c net.Conn) { io.Copy(c, c) })
	pol, err := rules.Parse("t", []byte("default: direct\n"), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := New(Options{RedirectPort: port, Mark: mark, Loops: 1, Policy: func() Decider { return pol }})
	defer testutil.Shutdown(t, r)
	if _, err := r.Open(api.Workload{ID: "w", Netns: pod.Path, Mode: api.ModeTransparent}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := netns.Dial(ctx, pod.Path, 0, "tcp", "192.0.2.2:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil { // relayed: both sockets exist
		t.Fatal(err)
	}
	l := r.loops[0]
	var socks int
	l.do(func() {
		for _, lf := range l.flows {
			for _, fd := range []int{lf.c, lf.u} {
				socks++
				if v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY); err != nil || v == 0 {
					t.Errorf("socket %d of the flow: TCP_NODELAY = %d, %v; want set", fd, v, err)
				}
			}
		}
	})
	if socks != 2 {
		t.Fatalf("%d sockets on the loop, want the flow's 2", socks)
	}
}

// TestLoopHandoffCut: a flow the loop decided for an exit it hands to the goroutine path,
// whose pod closed while it was being decided (Close, or Shutdown's drain over), is not
// carried; it gets its one record with the cut as its reason and is counted under its
// exit, as a flow the loop connects itself does (TestLoopCloseConnecting), and the
// workload sees a reset.
func TestLoopHandoffCut(t *testing.T) {
	aud, err := audit.New("", 0, 0, 8)
	if err != nil {
		t.Fatal(err)
	}
	r := New(Options{Audit: aud})
	l, err := newLoop(r)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		l.do(func() { l.stopping = true })
		<-l.stop
	}()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	accepted, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	file, err := accepted.(*net.TCPConn).File()
	accepted.Close()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Dup(int(file.Fd())) // the loop's own descriptor, as accept gives it
	file.Close()
	if err != nil {
		t.Fatal(err)
	}

	p := &pod{conns: map[net.Conn]struct{}{}, closed: true} // closed while deciding
	p.w.Store(newRegistered(api.Workload{ID: "w", Mode: api.ModeTransparent}))
	d := rules.Decision{Exit: "named", Rule: 1, Priority: rules.PriorityDomain, Dimension: rules.DimDomain}
	lf := &lflow{lp: &lpod{p: p}, c: fd, u: -1, f: rules.Flow{At: time.Now(), ID: 1}}
	r.begin() // accepted
	l.do(func() {
		lf.idx = len(l.flows)
		l.flows = append(l.flows, lf)
		l.handoff(lf, &d)
	})

	recs := aud.Recent(8)
	if len(recs) != 1 || recs[0].Exit != "named" || recs[0].Rule != 1 || recs[0].Reason != errCut.Error() {
		t.Errorf("records %+v, want one for exit named, rule 1, with the reason %q", recs, errCut)
	}
	if s := r.Stats(); s.Active != 0 || s.ByExit["named"] != 1 || len(s.ByExit) != 1 {
		t.Errorf("Stats = %+v, want the flow ended and counted once, under exit named", s)
	}
	client.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, unix.ECONNRESET) {
		t.Errorf("workload's connection: %v, want a reset", err)
	}
}
