package hook

import (
	"context"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/tests/testutil"
)

// With real processes and /proc: two processes in one netns stand for a container and
// one started with --network container:A. A's exit and poststop keep the registration,
// through B's /proc path; B's remove it.
func TestSharedNetnsRealProc(t *testing.T) {
	ns := testutil.NewNetns(t, "klshare")
	h, fr, _ := setup(t)
	procRoot, hostNet, sameNs = "/proc", "/proc/self/ns/net", netns.SameNetns
	start := func() *exec.Cmd {
		cmd := ns.Start(t, "sleep", "60")
		// ip netns exec enters the netns, then execs sleep under the same pid.
		for range 100 {
			if same, _ := netns.SameNetns(ns.Path, nsPathOf(cmd.Process.Pid)); same {
				return cmd
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("pid %d never entered %s", cmd.Process.Pid, ns.Path)
		return nil
	}
	a, b := start(), start()
	for _, c := range []struct {
		id  string
		cmd *exec.Cmd
	}{{"a", a}, {"b", b}} {
		if err := h.Create(context.Background(), State{ID: c.id, Pid: c.cmd.Process.Pid}, "proxy"); err != nil {
			t.Fatalf("Create(%s) = %v", c.id, err)
		}
	}
	stop := func(c *exec.Cmd) {
		c.Process.Kill()
		c.Wait()
	}
	stop(a)
	if err := h.Delete(context.Background(), State{ID: "a"}); err != nil {
		t.Fatalf("Delete(a) = %v", err)
	}
	want := "/proc/" + strconv.Itoa(b.Process.Pid) + "/ns/net"
	if r, ok := fr.regs["a"]; !ok || r.Workload.Netns != want {
		t.Fatalf("after a's poststop: registration %+v, %v; want it through %s (calls %q)", r.Workload, ok, want, fr.calls)
	}
	stop(b)
	if err := h.Delete(context.Background(), State{ID: "b"}); err != nil {
		t.Fatalf("Delete(b) = %v", err)
	}
	if r, ok := fr.regs["a"]; ok {
		t.Errorf("after the last poststop: still registered through %s (calls %q)", r.Workload.Netns, fr.calls)
	}
}
