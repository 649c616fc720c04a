package fastpath

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/tests/testutil"
)

// teeBackend installs tables in the kernel and records them in a Fake, which Get reads
// back; before, when set, runs before each Apply (the moment after a Manager opened a
// pod's watcher and before its table goes in).
type teeBackend struct {
	fake   *netns.Fake
	before func()
}

func (b teeBackend) Apply(ns string, t *netns.Table) error {
	if b.before != nil {
		b.before()
	}
	if err := netns.InstallProgram(ns, t); err != nil {
		return err
	}
	return b.fake.Apply(ns, t)
}

func (b teeBackend) Delete(ns, table string) error {
	if err := netns.Remove(ns); err != nil {
		return err
	}
	return b.fake.Delete(ns, table)
}

func (b teeBackend) Get(ns, table string) (*netns.Table, error) { return b.fake.Get(ns, table) }

// greeter serves "hi\n" on addr in the netns at path and counts the connections it
// accepted.
func greeter(t *testing.T, path, addr string) *atomic.Int64 {
	t.Helper()
	ln, err := netns.Listen(path, "tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	testutil.Serve(t, ln, func(c net.Conn) {
		n.Add(1)
		_, _ = io.WriteString(c, "hi\n")
		c.Close()
	})
	return &n
}

// dialGreeter connects from the netns at path to the greeter at addr and says whether
// its greeting came back (the flow went out directly: the test's relay port has no
// listener, so a redirected flow is refused).
func dialGreeter(t *testing.T, path, addr string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := netns.Dial(ctx, path, 0, "tcp4", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	line, _ := bufio.NewReader(c).ReadString('\n')
	return line == "hi\n"
}

// After a restart the previous process's table decides the pod's flows until the new
// one's is in, while the new watcher already reads their events. Such a flow must not
// be recorded as if the new table had decided it: the new table's first generation was
// often the number the old table marked with, and a flow the kernel sent out directly
// under the old rules came out as the new rules' deny. It counts as an unknown mark.
func TestRestartWindowNotDecodedWithNewRules(t *testing.T) {
	testutil.RequireTool(t, "nft")
	pod, srv := testutil.NewNetns(t, "klgcp"), testutil.NewNetns(t, "klgcs")
	testutil.Link(t, pod, []string{"192.0.2.2/24"}, srv, []string{"192.0.2.1/24"})
	const addr = "192.0.2.1:7070"
	accepted := greeter(t, srv.Path, addr)
	f := netns.NewFake()
	c := capture
	pd := Pod{ID: "a", Netns: pod.Path, Capture: &c}

	m1 := New(Options{Sink: &sink{}, Backend: teeBackend{fake: f}})
	if err := m1.Add(pd, policy(t, "default: proxy\nrules:\n  - cidr: 192.0.2.0/24\n    action: direct\n    note: old cluster rule\n")); err != nil {
		t.Fatal(err)
	}
	oldGen := m1.pods["a"].gen
	m1.Close() // the daemon stops; the table stays and keeps deciding

	var s sink
	var inWindow bool
	m2 := New(Options{Sink: &s, Backend: teeBackend{fake: f, before: func() {
		if inWindow {
			return
		}
		inWindow = true
		if !dialGreeter(t, pod.Path, addr) {
			t.Error("the previous process's table did not send the flow out directly")
		}
	}}})
	defer m2.Close()
	if err := m2.Add(pd, policy(t, "default: direct\nrules:\n  - cidr: 192.0.2.0/24\n    action: deny\n    note: blocked now\n")); err != nil {
		t.Fatal(err)
	}
	po := m2.pods["a"]
	if !inWindow || accepted.Load() != 1 {
		t.Fatalf("no flow in the window before the new table (dialed %v, server accepted %d)", inWindow, accepted.Load())
	}
	if po.gen == oldGen {
		t.Errorf("the new table marks with generation %d, the previous process's table's", po.gen)
	}
	unknown := func() uint64 {
		m2.mu.Lock()
		defer m2.mu.Unlock()
		return po.unknown
	}
	for deadline := time.Now().Add(3 * time.Second); unknown() == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.recs {
		t.Errorf("the flow the previous table sent out directly was recorded as %+v, decided by the new rules", r)
	}
	if got := unknown(); got != 1 {
		t.Errorf("%d unknown marks, want 1 (the window's flow, decided by the previous process's table)", got)
	}
}

// A pod whose netns path has gone (containers sharing a netns: the registrant's
// /proc/PID/ns/net is gone when its process ends, before the registration moves to a
// member still running) keeps its registration and its watcher when it is added again
// under that path: the netns lives on under another path, and its table goes on deciding
// flows, which must still be recorded. Adding it under a live path of the same netns
// then moves it, watcher and all.
func TestAddUnderGonePathKeepsWatcher(t *testing.T) {
	testutil.RequireTool(t, "nft")
	pod, srv := testutil.NewNetns(t, "klgp"), testutil.NewNetns(t, "klgps")
	testutil.Link(t, pod, []string{"192.0.2.2/24"}, srv, []string{"192.0.2.1/24"})
	const addr = "192.0.2.1:7070"
	greeter(t, srv.Path, addr)
	first := bindNetns(t, pod.Path)

	var s sink
	m := New(Options{Sink: &s})
	defer m.Close()
	c := capture
	p := policy(t, "default: proxy\nrules:\n  - cidr: 192.0.2.0/24\n    action: direct\n    note: cluster\n")
	if err := m.Add(Pod{ID: "a", Netns: first, Capture: &c}, p); err != nil {
		t.Fatal(err)
	}
	po := m.pods["a"]
	records := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.recs)
	}
	flows := func(n, want int) {
		t.Helper()
		for i := range n {
			if !dialGreeter(t, pod.Path, addr) {
				t.Fatalf("flow %d not sent out directly by the pod's table", i)
			}
		}
		for deadline := time.Now().Add(3 * time.Second); records() < want && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		if got := records(); got != want {
			t.Errorf("%d records, want %d (one per kernel-decided flow; unknown marks %d)", got, want, po.unknown)
		}
	}
	flows(2, 2)

	if err := unix.Unmount(first, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := m.Add(Pod{ID: "a", Netns: first, Capture: &c}, p); err == nil {
		t.Error("Add under a path that has gone passed")
	}
	if m.pods["a"] != po || watcherSocket(m, po) < 0 {
		t.Fatalf("adding the pod under its gone path dropped it (registered %p, was %p) or its watcher", m.pods["a"], po)
	}
	flows(3, 5)

	if err := m.Add(Pod{ID: "a", Netns: pod.Path, Capture: &c}, p); err != nil {
		t.Fatal(err)
	}
	if m.pods["a"] != po || watcherSocket(m, po) < 0 {
		t.Errorf("the move to a live path of the netns replaced the pod or its watcher")
	}
	flows(1, 6)
}

// bindNetns bind-mounts the netns file at nsPath on a file of a temporary directory and
// returns that path (unmounted when the test ends, if still mounted).
func bindNetns(t *testing.T, nsPath string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(nsPath, p, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mount %s on %s: %v", nsPath, p, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(p, unix.MNT_DETACH) })
	return p
}
