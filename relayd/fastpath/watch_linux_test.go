package fastpath

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/tests/testutil"
	"golang.org/x/sys/unix"
)

// attr encodes one netlink attribute (host-endian header, padded).
func attr(typ uint16, v []byte) []byte {
	b := make([]byte, 4, nlAlign(4+len(v)))
	binary.NativeEndian.PutUint16(b[0:2], uint16(4+len(v)))
	binary.NativeEndian.PutUint16(b[2:4], typ)
	b = append(b, v...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func cat(bs ...[]byte) []byte {
	var out []byte
	for _, b := range bs {
		out = append(out, b...)
	}
	return out
}

// ctMessage is a ctnetlink event as the kernel sends it: tuple (nested, flagged), then
// status, mark and id, with other attributes around.
func ctMessage(kind uint16, proto uint8, mark uint32, withMark bool) []byte {
	be32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	const nested = 0x8000
	tuple := attr(ctaTupleOrig|nested, cat(
		attr(1|nested, cat(attr(1, []byte{192, 0, 2, 2}), attr(2, []byte{192, 0, 2, 1}))),
		attr(ctaTupleProto|nested, cat(attr(ctaProtoNum, []byte{proto}), attr(2, []byte{0x9c, 0x40}), attr(3, []byte{0, 7}))),
	))
	body := cat([]byte{unix.AF_INET, 0, 0, 0}, tuple, attr(3, be32(0x18e)))
	if withMark {
		body = cat(body, attr(ctaMark, be32(mark)))
	}
	body = cat(body, attr(ctaID, be32(0xdeadbeef)))
	h := make([]byte, unix.SizeofNlMsghdr)
	binary.NativeEndian.PutUint32(h[0:4], uint32(len(h)+len(body)))
	binary.NativeEndian.PutUint16(h[4:6], nfnlSubsysCTNetlink<<8|kind)
	return cat(h, body)
}

func TestHandle(t *testing.T) {
	f := netns.NewFake()
	m := New(Options{Backend: f, NoWatch: true})
	defer m.Close()
	if err := netns.InstallWith(f, "/ns/a", capture); err != nil {
		t.Fatal(err)
	}
	if err := m.Add(Pod{ID: "a", Netns: "/ns/a"}, policy(t, cidrPolicy)); err != nil {
		t.Fatal(err)
	}
	po := m.pods["a"]
	mark := Mark(po.gen, 2)
	for _, tc := range []struct {
		name        string
		msg         []byte
		flows, late uint64
	}{
		{"new tcp", ctMessage(ipctnlMsgCtNew, unix.IPPROTO_TCP, mark, true), 1, 0},
		{"destroy carrying a missed new", ctMessage(ipctnlMsgCtDelete, unix.IPPROTO_TCP, mark, true), 1, 1},
		{"two in one buffer", cat(ctMessage(ipctnlMsgCtNew, unix.IPPROTO_TCP, mark, true), ctMessage(ipctnlMsgCtNew, unix.IPPROTO_TCP, mark, true)), 2, 0},
		{"udp", ctMessage(ipctnlMsgCtNew, unix.IPPROTO_UDP, mark, true), 0, 0},
		{"mark without the tag", ctMessage(ipctnlMsgCtNew, unix.IPPROTO_TCP, capture.Mark, true), 0, 0},
		{"no mark", ctMessage(ipctnlMsgCtNew, unix.IPPROTO_TCP, 0, false), 0, 0},
		{"other message type", ctMessage(1, unix.IPPROTO_TCP, mark, true), 0, 0},
		{"truncated", ctMessage(ipctnlMsgCtNew, unix.IPPROTO_TCP, mark, true)[:40], 0, 0},
		{"empty", nil, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flows, late := po.flows, po.late
			m.handle(po, tc.msg)
			if po.flows-flows != tc.flows || po.late-late != tc.late {
				t.Errorf("recorded %d flows (%d late), want %d (%d late)", po.flows-flows, po.late-late, tc.flows, tc.late)
			}
		})
	}
}

func TestHandleAllocates(t *testing.T) {
	f := netns.NewFake()
	m := New(Options{Backend: f, NoWatch: true})
	defer m.Close()
	if err := netns.InstallWith(f, "/ns/a", capture); err != nil {
		t.Fatal(err)
	}
	if err := m.Add(Pod{ID: "a", Netns: "/ns/a"}, policy(t, cidrPolicy)); err != nil {
		t.Fatal(err)
	}
	po := m.pods["a"]
	msg := ctMessage(ipctnlMsgCtNew, unix.IPPROTO_TCP, Mark(po.gen, 2), true)
	m.handle(po, msg) // the hit counter's map entry
	if n := testing.AllocsPerRun(100, func() { m.handle(po, msg) }); n != 0 {
		t.Errorf("handling one event allocates %.0f times", n)
	}
}

func FuzzHandle(f *testing.F) {
	f.Add(ctMessage(ipctnlMsgCtNew, unix.IPPROTO_TCP, Mark(1, 2), true))
	f.Add(ctMessage(ipctnlMsgCtDelete, unix.IPPROTO_TCP, Mark(1, 2), true))
	f.Add(ctMessage(ipctnlMsgCtNew, unix.IPPROTO_UDP, 0, false))
	m := New(Options{NoWatch: true})
	f.Fuzz(func(t *testing.T, b []byte) {
		m.handle(&pod{}, b) // must not panic
	})
}

// The event socket receives the events of kernel decisions only: its filter drops every
// conntrack event whose mark lacks the tag, in the kernel.
func TestEventFilter(t *testing.T) {
	testutil.RequireTool(t, "nft")
	ns := testutil.NewNetns(t, "klfe")
	rules := filepath.Join(t.TempDir(), "t.nft")
	if err := os.WriteFile(rules, []byte("table inet klfe {\n chain out {\n  type filter hook output priority 0; policy accept;\n"+
		"  tcp dport 7001 ct mark set 0x6b010002\n  tcp dport 7002 ct mark set 0x00001234\n }\n}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ns.Exec(t, "nft", "-f", rules)
	fd, err := openEvents(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	for _, port := range []string{"7001", "7002", "7003"} {
		ln, err := netns.Listen(ns.Path, "tcp4", "127.0.0.1:"+port)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		for range 3 {
			c, err := netns.Dial(context.Background(), ns.Path, 0, "tcp4", "127.0.0.1:"+port)
			if err != nil {
				t.Fatal(err)
			}
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			c.Close()
			s.Close()
		}
	}
	// The events are queued before the first read: one recvmmsg returns them together.
	marks := map[uint32]int{}
	rb, biggest := newRecvBuf(), 0
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		n, err := rb.recv(fd)
		if err == unix.EAGAIN {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		biggest = max(biggest, n)
		for i := range n {
			b, truncated := rb.msg(i)
			if truncated {
				t.Fatalf("event of %d bytes cut to its %d-byte slot", len(b), recvSlot)
			}
			for len(b) >= unix.SizeofNlMsghdr {
				l := int(binary.NativeEndian.Uint32(b[0:4]))
				if l < unix.SizeofNlMsghdr+nfgenHdrLen || l > len(b) {
					t.Fatalf("bad message length %d of %d", l, len(b))
				}
				mark, _, _ := parseCT(b[unix.SizeofNlMsghdr+nfgenHdrLen : l])
				marks[mark]++
				b = b[min(nlAlign(l), len(b)):]
			}
		}
	}
	if biggest < 3 {
		t.Errorf("the largest batch one recvmmsg returned held %d events, want the 3 queued ones together", biggest)
	}
	// Three connections to 7001 (NEW events; no table here limits them to NEW, so a
	// DESTROY may follow for a connection whose state ended), none of the others.
	if marks[0x6b010002] < 3 || len(marks) != 1 {
		t.Errorf("events received by mark: %v, want only 0x6b010002 (at least 3)", marks)
	}
}

// Events queued in a pod's socket when it stops being watched become records: Remove
// (deregistration) and Close (the daemon's shutdown) read the socket before closing it,
// and adding the pod again in the same netns (a refresh, the daemon's repair) keeps the
// socket and the generations its queued marks name. The connections here are decided by
// a table of the test's own, marking with the pod's generation, and read by no poll
// round before the step under test.
func TestQueuedEventsRecorded(t *testing.T) {
	testutil.RequireTool(t, "nft")
	for _, step := range []string{"remove", "close", "add again"} {
		t.Run(step, func(t *testing.T) {
			ns := testutil.NewNetns(t, "klqe")
			var s sink
			m := New(Options{Sink: &s, Backend: netns.NewFake()})
			defer m.Close()
			c := capture
			pd := Pod{ID: "a", Netns: ns.Path, Capture: &c}
			p := policy(t, cidrPolicy)
			if err := m.Add(pd, p); err != nil {
				t.Fatal(err)
			}
			po := m.pods["a"]
			rules := filepath.Join(t.TempDir(), "t.nft")
			if err := os.WriteFile(rules, []byte(fmt.Sprintf("table inet klqe {\n chain out {\n  type filter hook output priority 0; policy accept;\n"+
				"  tcp dport 7001 ct mark set 0x%08x ct event set new\n }\n}\n", Mark(po.gen, 2))), 0o644); err != nil {
				t.Fatal(err)
			}
			ns.Exec(t, "nft", "-f", rules)
			ln, err := netns.Listen(ns.Path, "tcp4", "127.0.0.1:7001")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			// The poller's rounds wait while the flows run, so they are all queued.
			m.poll.mu.Lock()
			for range 5 {
				c, err := netns.Dial(context.Background(), ns.Path, 0, "tcp4", "127.0.0.1:7001")
				if err != nil {
					m.poll.mu.Unlock()
					t.Fatal(err)
				}
				sc, err := ln.Accept()
				if err != nil {
					m.poll.mu.Unlock()
					t.Fatal(err)
				}
				c.Close()
				sc.Close()
			}
			m.poll.mu.Unlock()
			records := func() int {
				s.mu.Lock()
				defer s.mu.Unlock()
				return len(s.recs)
			}
			switch step {
			case "remove":
				m.Remove("a")
			case "close":
				m.Close()
			case "add again":
				if err := m.Add(pd, policy(t, "default: direct\n")); err != nil {
					t.Fatal(err)
				}
				if m.pods["a"] != po {
					t.Fatal("adding the pod again in its netns replaced its watcher")
				}
				for deadline := time.Now().Add(2 * time.Second); records() < 5 && time.Now().Before(deadline); {
					time.Sleep(20 * time.Millisecond)
				}
			}
			if n := records(); n != 5 {
				t.Errorf("5 kernel-decided flows queued, %d records (unknown marks %d)", n, po.unknown)
			}
			s.mu.Lock()
			for _, r := range s.recs {
				if r.Note != "cluster" {
					t.Errorf("record %+v, want rule 1 of the policy the flows were marked under", r)
				}
			}
			s.mu.Unlock()
		})
	}
}

// Adding a pod again in its netns brings back a watcher that gave up reopening its
// socket; a sandbox recreated under the same id in another netns gets a watcher of its
// own.
func TestAddAgainWatcher(t *testing.T) {
	a, b := testutil.NewNetns(t, "klra"), testutil.NewNetns(t, "klrb")
	m := New(Options{Backend: netns.NewFake()})
	defer m.Close()
	c := capture
	p := policy(t, cidrPolicy)
	if err := m.Add(Pod{ID: "x", Netns: a.Path, Capture: &c}, p); err != nil {
		t.Fatal(err)
	}
	po := m.pods["x"]
	m.poll.remove(po) // what a watcher that gave up leaves
	if err := m.Add(Pod{ID: "x", Netns: a.Path, Capture: &c}, p); err != nil {
		t.Fatal(err)
	}
	if m.pods["x"] != po || !m.poll.has(po) {
		t.Error("adding the pod again did not bring its watcher back")
	}
	if err := m.Add(Pod{ID: "x", Netns: b.Path, Capture: &c}, p); err != nil {
		t.Fatal(err)
	}
	if m.pods["x"] == po || m.pods["x"].Netns != b.Path || m.poll.has(po) || !m.poll.has(m.pods["x"]) {
		t.Error("a registration in another netns kept the first netns's watcher")
	}
}

// A pod added again under another path of its netns (kl-hook re-registers a netns
// shared by containers through another member's /proc/<pid>/ns/net, a bind mount moved)
// keeps its registration and its watcher, and its table when nothing it depends on
// changed; the first path may then go away, and the pod's flows still go direct in the
// kernel and are recorded. The pod's table is the kernel's (nf_tables handle), the flows
// go over a veth to a server the test runs in a second netns.
func TestAddMovedNetns(t *testing.T) {
	testutil.RequireTool(t, "nft", "ip", "mount", "umount")
	const (
		first  = "default: proxy\nrules:\n  - cidr: 203.0.113.0/24\n    action: direct\n    note: first\n"
		second = "default: proxy\nrules:\n  - cidr: 203.0.113.0/24\n    action: direct\n    note: second\n"
	)
	for _, tc := range []struct {
		name      string
		rules     string // of the Add under the new path
		plain     bool   // the plain capture was installed over the pod's table before the move
		keepTable bool
	}{
		{"path only", first, false, true},
		{"path and policy", second, false, false},
		{"path only, table changed", first, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pns, host := testutil.NewNetns(t, "klmv"), testutil.NewNetns(t, "klmh")
			testutil.Link(t, pns, []string{"203.0.113.1/24"}, host, []string{"203.0.113.254/24"})
			ln, err := netns.Listen(host.Path, "tcp4", "203.0.113.254:7001")
			if err != nil {
				t.Fatal(err)
			}
			testutil.Serve(t, ln, func(c net.Conn) { _, _ = io.WriteString(c, "host\n") })
			// The second path: a bind mount of the first, as kl-hook's /proc/<pid>/ns/net.
			moved := filepath.Join(t.TempDir(), "net")
			if err := os.WriteFile(moved, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			testutil.Run(t, "mount", "--bind", pns.Path, moved)
			t.Cleanup(func() { _, _ = testutil.Output("umount", moved) })

			var s sink
			m := New(Options{Sink: &s})
			defer m.Close()
			c := capture
			if err := m.Add(Pod{ID: "a", Netns: pns.Path, Capture: &c}, policy(t, first)); err != nil {
				t.Fatal(err)
			}
			po := m.pods["a"]
			if tc.plain {
				if err := netns.Install(pns.Path, capture); err != nil { // kl-cni ADD again
					t.Fatal(err)
				}
			}
			gen, handle, sock := po.gen, tableHandle(t, pns.Path), watcherSocket(m, po)
			if sock < 0 {
				t.Fatal("the pod has no watcher")
			}
			if err := m.Add(Pod{ID: "a", Netns: moved, Capture: &c}, policy(t, tc.rules)); err != nil {
				t.Fatal(err)
			}
			if m.pods["a"] != po || po.Netns != moved {
				t.Errorf("the move replaced the registration (pod %p, was %p, path %s)", m.pods["a"], po, m.pods["a"].Netns)
			}
			if got := watcherSocket(m, po); got != sock {
				t.Errorf("the move replaced the watcher's socket (%d, was %d)", got, sock)
			}
			if kept := tableHandle(t, moved) == handle && po.gen == gen; kept != tc.keepTable {
				t.Errorf("table kept = %v (generation %d, was %d), want %v", kept, po.gen, gen, tc.keepTable)
			}
			if err := m.Verify("a", policy(t, tc.rules)); err != nil {
				t.Errorf("Verify after the move: %v", err)
			}
			// The first path goes away; the netns lives on under the second.
			testutil.Run(t, "umount", pns.Path)
			want := "first"
			if tc.rules == second {
				want = "second"
			}
			for i := range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				conn, err := netns.Dial(ctx, moved, 0, "tcp4", "203.0.113.254:7001")
				cancel()
				if err != nil {
					t.Fatalf("flow %d after the move: %v", i, err)
				}
				_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
				line, err := bufio.NewReader(conn).ReadString('\n')
				conn.Close()
				if line != "host\n" {
					t.Fatalf("flow %d after the move: read %q, %v; want the server's answer (the kernel decides it direct)", i, line, err)
				}
			}
			var notes []string
			for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				s.mu.Lock()
				notes = notes[:0]
				for _, r := range s.recs {
					notes = append(notes, r.Note)
				}
				s.mu.Unlock()
				if len(notes) >= 3 {
					break
				}
			}
			if len(notes) != 3 || notes[0] != want || notes[1] != want || notes[2] != want {
				t.Errorf("records of the 3 flows after the move: notes %q, want %q each (unknown marks %d)", notes, want, po.unknown)
			}
		})
	}
}

// tableHandle returns the nf_tables handle of the kl table in the netns at path: a table
// deleted and created again (an install) has another.
func tableHandle(t *testing.T, path string) string {
	t.Helper()
	out := testutil.Run(t, "nsenter", "--net="+path, "nft", "-a", "list", "table", "inet", netns.TableName)
	first, _, _ := strings.Cut(out, "\n")
	_, h, ok := strings.Cut(first, "# handle ")
	if !ok {
		t.Fatalf("no handle in %q", first)
	}
	return strings.TrimSpace(h)
}

// watcherSocket returns po's event socket, -1 when it has none.
func watcherSocket(m *Manager, po *pod) int {
	m.poll.mu.Lock()
	defer m.poll.mu.Unlock()
	for _, w := range m.poll.socks {
		if w.po == po {
			return w.fd
		}
	}
	return -1
}

// Adds of one pod (from two callers, under two paths of its netns, with changing labels),
// reloads, removals, Verify, Status and Stale, and a watcher whose socket breaks, all at
// once: every field of a pod is written and read under its lock (run with -race), and no
// watcher outlives its registration: once they are done and the pod is added again, it
// has exactly one event socket.
func TestConcurrentUse(t *testing.T) {
	testutil.RequireTool(t, "mount", "umount")
	ns := testutil.NewNetns(t, "klcu")
	second := filepath.Join(t.TempDir(), "net")
	if err := os.WriteFile(second, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "mount", "--bind", ns.Path, second)
	t.Cleanup(func() { _, _ = testutil.Output("umount", second) })
	m := New(Options{})
	defer m.Close()
	c := capture
	p := policy(t, cidrPolicy)
	paths := []string{ns.Path, second}
	// Two callers add the pod; the others act on it until both are done.
	var wg, adders sync.WaitGroup
	var added atomic.Bool
	for g := range 2 {
		adders.Add(1)
		go func() {
			defer adders.Done()
			for i := range 20 {
				if err := m.Add(Pod{ID: "a", Netns: paths[(i+g)%2], Labels: map[string]string{"n": fmt.Sprint(i % 3)}, Capture: &c}, p); err != nil {
					t.Logf("add: %v", err)
				}
			}
		}()
	}
	while := func(pause time.Duration, f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10000 && !added.Load(); i++ {
				f()
				time.Sleep(pause)
			}
		}()
	}
	while(10*time.Millisecond, func() { _ = m.Reload(p) })
	while(5*time.Millisecond, func() { m.Remove("a") })
	while(time.Millisecond, func() {
		_ = m.Verify("a", p)
		_ = m.Status()
		_ = m.Stale(p)
	})
	while(20*time.Millisecond, func() {
		m.mu.Lock()
		po, poll := m.pods["a"], m.poll
		m.mu.Unlock()
		if po == nil || poll == nil {
			return
		}
		poll.mu.Lock()
		for _, w := range poll.socks {
			if w.po == po {
				poll.fail(w, errTest) // reopened in the background
				break
			}
		}
		poll.mu.Unlock()
	})
	adders.Wait()
	added.Store(true)
	wg.Wait()
	if err := m.Add(Pod{ID: "a", Netns: second, Capture: &c}, p); err != nil {
		t.Fatal(err)
	}
	po := m.pods["a"]
	socks := func() (n int, mine bool) {
		m.poll.mu.Lock()
		defer m.poll.mu.Unlock()
		for _, w := range m.poll.socks {
			n++
			mine = mine || w.po == po
		}
		return n, mine
	}
	// The background reopens end within a second (20 tries 50 ms apart).
	n, mine := socks()
	for deadline := time.Now().Add(3 * time.Second); (n != 1 || !mine) && time.Now().Before(deadline); n, mine = socks() {
		time.Sleep(50 * time.Millisecond)
	}
	if n != 1 || !mine {
		t.Errorf("%d event sockets (one of the registered pod: %v), want exactly the registered pod's", n, mine)
	}
	if err := m.Verify("a", p); err != nil {
		t.Errorf("Verify: %v", err)
	}
}
