package hook

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
)

// fakeProc makes procRoot a temporary directory whose PID/ns/net files stand for network
// namespaces: a hard link is the same namespace, a removed PID directory an exited
// process.
type fakeProc struct {
	t   *testing.T
	dir string
}

func newFakeProc(t *testing.T) *fakeProc {
	p := &fakeProc{t: t, dir: t.TempDir()}
	procRoot = p.dir
	hostNet = p.ns(1)
	sameNs = func(a, b string) (bool, error) {
		fa, err := os.Stat(a)
		if err != nil {
			return false, err
		}
		fb, err := os.Stat(b)
		if err != nil {
			return false, err
		}
		return os.SameFile(fa, fb), nil
	}
	p.start(1, 0)
	return p
}

func (p *fakeProc) ns(pid int) string { return filepath.Join(p.dir, strconv.Itoa(pid), "ns", "net") }

// start makes process pid, in a new netns (like 0) or in the netns of process like.
func (p *fakeProc) start(pid, like int) {
	p.t.Helper()
	if err := os.MkdirAll(filepath.Dir(p.ns(pid)), 0o755); err != nil {
		p.t.Fatal(err)
	}
	var err error
	if like == 0 {
		err = os.WriteFile(p.ns(pid), []byte(strconv.Itoa(pid)), 0o444)
	} else {
		err = os.Link(p.ns(like), p.ns(pid))
	}
	if err != nil {
		p.t.Fatal(err)
	}
}

func (p *fakeProc) exit(pid int) {
	p.t.Helper()
	if err := os.RemoveAll(filepath.Join(p.dir, strconv.Itoa(pid))); err != nil {
		p.t.Fatal(err)
	}
}

// Containers sharing a netns (docker run --network container:A) share A's registration.
// A's poststop must not take the listeners away from the others: the registration stays
// until the last of them is gone, through the netns path of one still running.
func TestSharedNetns(t *testing.T) {
	type step struct {
		op   string // create (pid in netns of like, 0: new), exit, reap (kl-relayd drops the registration), delete, want, records
		id   string
		pid  int
		like int
	}
	tests := []struct {
		name  string
		mode  string
		steps []step
	}{
		{name: "registrant leaves first", mode: "transparent", steps: []step{
			{op: "create", id: "a", pid: 10}, {op: "create", id: "b", pid: 20, like: 10},
			{op: "want", id: "a", pid: 10},
			{op: "exit", pid: 10}, {op: "delete", id: "a"},
			{op: "want", id: "a", pid: 20},
			{op: "exit", pid: 20}, {op: "delete", id: "b"},
			{op: "want", id: "a"},
		}},
		{name: "sharer leaves first", mode: "proxy", steps: []step{
			{op: "create", id: "a", pid: 10}, {op: "create", id: "b", pid: 20, like: 10},
			{op: "exit", pid: 20}, {op: "delete", id: "b"},
			{op: "want", id: "a", pid: 10},
			{op: "exit", pid: 10}, {op: "delete", id: "a"},
			{op: "want", id: "a"},
		}},
		{name: "a sharer gone without poststop", mode: "transparent", steps: []step{
			{op: "create", id: "a", pid: 10}, {op: "create", id: "b", pid: 20, like: 10}, {op: "create", id: "c", pid: 30, like: 10},
			{op: "exit", pid: 20}, {op: "exit", pid: 10}, {op: "delete", id: "a"},
			{op: "want", id: "a", pid: 30},
			{op: "exit", pid: 30}, {op: "delete", id: "c"},
			{op: "want", id: "a"},
			{op: "delete", id: "b"},
			{op: "want", id: "a"},
		}},
		{name: "relay dropped it before the poststop", mode: "transparent", steps: []step{
			{op: "create", id: "a", pid: 10}, {op: "create", id: "b", pid: 20, like: 10},
			{op: "exit", pid: 10}, {op: "reap", id: "a"}, {op: "delete", id: "a"},
			{op: "want", id: "a", pid: 20},
			{op: "exit", pid: 20}, {op: "delete", id: "b"},
			{op: "want", id: "a"},
		}},
		{name: "sharer's pid reused in another netns", mode: "transparent", steps: []step{
			{op: "create", id: "a", pid: 10}, {op: "create", id: "b", pid: 20, like: 10},
			{op: "exit", pid: 20}, {op: "create", id: "other", pid: 20},
			{op: "exit", pid: 10}, {op: "delete", id: "a"},
			{op: "want", id: "a"},
			{op: "want", id: "other", pid: 20},
		}},
		{name: "all gone without poststop, pruned at the next create", mode: "transparent", steps: []step{
			{op: "create", id: "a", pid: 10}, {op: "create", id: "b", pid: 20, like: 10},
			{op: "records", pid: 1},
			{op: "exit", pid: 20}, {op: "exit", pid: 10},
			{op: "records", pid: 1},
			{op: "create", id: "other", pid: 30},
			{op: "records", pid: 0},
			{op: "delete", id: "b"}, {op: "want", id: "a", pid: 10}, // its netns path is gone: the relay reaps it
			{op: "delete", id: "a"}, {op: "want", id: "a"},
			{op: "want", id: "other", pid: 30},
		}},
		{name: "two netns, no sharing", mode: "transparent", steps: []step{
			{op: "create", id: "a", pid: 10}, {op: "create", id: "b", pid: 20},
			{op: "exit", pid: 10}, {op: "delete", id: "a"},
			{op: "want", id: "a"}, {op: "want", id: "b", pid: 20},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, fr, _ := setup(t)
			p := newFakeProc(t)
			for i, s := range tt.steps {
				switch s.op {
				case "create":
					p.start(s.pid, s.like)
					if err := h.Create(context.Background(), State{ID: s.id, Pid: s.pid}, tt.mode); err != nil {
						t.Fatalf("step %d: Create(%s) = %v", i, s.id, err)
					}
				case "exit":
					p.exit(s.pid)
				case "records": // pid: how many share records there are now
					if n := len(shareRecords(t, h.Shares)); n != s.pid {
						t.Errorf("step %d: %d share records %q, want %d", i, n, shareRecords(t, h.Shares), s.pid)
					}
				case "reap":
					delete(fr.regs, s.id)
				case "delete":
					if err := h.Delete(context.Background(), State{ID: s.id}); err != nil {
						t.Fatalf("step %d: Delete(%s) = %v", i, s.id, err)
					}
				case "want":
					r, ok := fr.regs[s.id]
					switch {
					case s.pid == 0 && ok:
						t.Errorf("step %d: %s still registered (%s); calls %q", i, s.id, r.Workload.Netns, fr.calls)
					case s.pid != 0 && !ok:
						t.Errorf("step %d: %s not registered, want it through pid %d; calls %q", i, s.id, s.pid, fr.calls)
					case ok && (r.Workload.Netns != p.ns(s.pid) || r.Workload.Mode != tt.mode || r.Workload.Source != "hook"):
						t.Errorf("step %d: %s registered as %+v, want %s in mode %s", i, s.id, r.Workload, p.ns(s.pid), tt.mode)
					}
				}
			}
			if left := shareRecords(t, h.Shares); len(left) > 0 {
				t.Errorf("share records left: %q", left)
			}
		})
	}
}

// A container that ended without a poststop leaves its registration naming
// /proc/PID/ns/net; when a new container's init gets that pid, the path names the new
// container's netns. The new container must not be taken for one sharing the stale
// registration: that would leave it with no capture table and no listeners, its
// traffic going out direct (transparent mode fails closed, never open). Nor must its
// own registration left from an earlier start under the same id (a restart after a
// missed poststop).
func TestCreatePidReused(t *testing.T) {
	for _, tt := range []struct{ name, stale string }{
		{"another container's registration", "x"},
		{"its own, from an earlier start", "y"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, fr, fb := setup(t)
			p := newFakeProc(t)
			p.start(42, 0)
			if _, err := fr.Register(context.Background(), api.Workload{ID: tt.stale, Netns: p.ns(42), Mode: "transparent", Source: "hook"}); err != nil {
				t.Fatal(err)
			}
			p.exit(42)     // no poststop: the registration stays
			p.start(42, 0) // the pid is reused, in a new netns
			if err := h.Create(context.Background(), State{ID: "y", Pid: 42}, "transparent"); err != nil {
				t.Fatalf("Create(y) = %v", err)
			}
			if r, ok := fr.regs["y"]; !ok || r.Workload.Netns != p.ns(42) {
				t.Errorf("y registered as %+v, %v; want it through %s (calls %q)", r.Workload, ok, p.ns(42), fr.calls)
			}
			if tbl, _ := fb.Get(p.ns(42), netns.TableName); tbl == nil {
				t.Errorf("no capture table in y's netns (calls %q)", fr.calls)
			}
			if recs := shareRecords(t, h.Shares); len(recs) > 0 {
				t.Errorf("share records %q: y was taken for a container sharing %s's registration", recs, tt.stale)
			}
		})
	}
}

// shareRecords lists the files in dir but its lock.
func shareRecords(t *testing.T, dir string) []string {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		if e.Name() != ".lock" {
			names = append(names, e.Name())
		}
	}
	return names
}

// When the registration cannot be moved to a container still using the netns, the
// poststop fails and names them; the record stays for the next one.
func TestSharedNetnsRegisterFails(t *testing.T) {
	h, fr, _ := setup(t)
	p := newFakeProc(t)
	p.start(10, 0)
	p.start(20, 10)
	for _, c := range []State{{ID: "a", Pid: 10}, {ID: "b", Pid: 20}} {
		if err := h.Create(context.Background(), c, "proxy"); err != nil {
			t.Fatal(err)
		}
	}
	p.exit(10)
	fr.regErr = api.ErrUnreachable
	err := h.Delete(context.Background(), State{ID: "a"})
	if !errors.Is(err, api.ErrUnreachable) || !strings.Contains(err.Error(), "container a") || !strings.Contains(err.Error(), "for b") {
		t.Fatalf("Delete(a) = %v, want ErrUnreachable naming a and b", err)
	}
	fr.regErr = nil
	if err := h.Delete(context.Background(), State{ID: "a"}); err != nil {
		t.Fatalf("Delete(a) again = %v", err)
	}
	if r, ok := fr.regs["a"]; !ok || r.Workload.Netns != p.ns(20) {
		t.Errorf("registration a = %+v, %v; want it through pid 20", r.Workload, ok)
	}
}
