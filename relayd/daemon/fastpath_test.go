package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/fastpath"
	"github.com/kl-egress/kl/relayd/registry"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestFastPathVerifyReinstalls: a transparent registration gets its kernel decisions; a
// plain capture reinstalled over them (kl-cni ADD, an OCI hook installing after it
// registered) is noticed by the reap loop's check and the decisions go back in; a proxy
// refresh and a deregistration drop the pod from the fast path; noFastPath turns it off.
func TestFastPathVerifyReinstalls(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "nft")
	ns := testutil.NewNetns(t, "kldfp")
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	if err := os.WriteFile(cfg.Rules, []byte("default: direct\nrules:\n  - cidr: 192.0.2.0/24\n    action: deny\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	plain := netns.Capture{RedirectPort: cfg.RedirectPort, Mark: cfg.Mark, IPv6: true}
	if err := netns.Install(ns.Path, plain); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer d.fastClose()
	defer d.relay.Close("fp")
	table := func() string { return ns.Exec(t, "nft", "list", "table", "inet", "kl") }
	kernel := func() []api.KernelStatus { var s api.Status; d.fastStatus(&s); return s.Kernel }

	w := api.Workload{ID: "fp", Netns: ns.Path, Mode: api.ModeTransparent, Source: "cni"}
	if _, err := d.Register(w); err != nil {
		t.Fatal(err)
	}
	if tb := table(); !strings.Contains(tb, "ct mark set") {
		t.Fatalf("no kernel decisions after registration:\n%s\n%s", tb, logs.String())
	}
	if k := kernel(); len(k) != 1 || k[0].ID != "fp" || k[0].Share != 1.0/2 {
		t.Errorf("kernel status = %+v, want fp with half of its plan in the kernel", k)
	}
	if err := netns.Install(ns.Path, plain); err != nil {
		t.Fatal(err)
	}
	if tb := table(); strings.Contains(tb, "ct mark set") {
		t.Fatalf("plain capture still has decisions:\n%s", tb)
	}
	d.mu.Lock()
	d.fastVerify(nil)
	d.mu.Unlock()
	if tb := table(); !strings.Contains(tb, "ct mark set") {
		t.Fatalf("kernel decisions not reinstalled by the check:\n%s\n%s", tb, logs.String())
	}
	if err := d.fast.Verify("fp", d.policy.Load()); err != nil {
		t.Errorf("Verify after the reinstall: %v", err)
	}

	// Refreshed into proxy mode: no fast path.
	pw := w
	pw.Mode = api.ModeProxy
	if _, err := d.Register(pw); err != nil {
		t.Fatal(err)
	}
	if k := kernel(); len(k) != 0 {
		t.Errorf("kernel status after a proxy refresh = %+v", k)
	}
	if _, err := d.Register(w); err != nil {
		t.Fatal(err)
	}
	if err := d.Deregister("fp"); err != nil {
		t.Fatal(err)
	}
	if k := kernel(); len(k) != 0 {
		t.Errorf("kernel status after deregistration = %+v", k)
	}

	// The OCI hook registers first and installs the capture after: the first attempt
	// finds no table, the retry installs the decisions.
	defer func(r time.Duration) { fastRetry = r }(fastRetry)
	fastRetry = 100 * time.Millisecond
	if err := netns.Remove(ns.Path); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Register(w); err != nil {
		t.Fatal(err)
	}
	if err := netns.Install(ns.Path, plain); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Second); !strings.Contains(table(), "ct mark set"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("kernel decisions not installed by the retry:\n%s\n%s", table(), logs.String())
		}
	}
	if err := d.Deregister("fp"); err != nil {
		t.Fatal(err)
	}

	// noFastPath: the table stays the plain capture and status says off.
	if err := netns.Install(ns.Path, plain); err != nil {
		t.Fatal(err)
	}
	cfg2 := testConfig(t, t.TempDir())
	cfg2.RedirectPort, cfg2.NoFastPath = cfg.RedirectPort, true
	d2, err := New(cfg2, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer d2.relay.Close("fp")
	if _, err := d2.Register(w); err != nil {
		t.Fatal(err)
	}
	if tb := table(); strings.Contains(tb, "ct mark set") {
		t.Errorf("noFastPath installed kernel decisions:\n%s", tb)
	}
	if st := d2.Status(); st.FastPath || len(st.Kernel) != 0 {
		t.Errorf("noFastPath status = %v %+v", st.FastPath, st.Kernel)
	}
}

// TestFastPathFailedSwapRepaired: a reload whose table swap fails for a workload leaves it
// on the previous rules' kernel decisions only until the next reload (even of unchanged
// rules) or the reap loop's check, which install the live ones; status shows the error
// meanwhile. (A fake backend: no privileges needed.)
func TestFastPathFailedSwapRepaired(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	var logs bytes.Buffer
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	f := netns.NewFake()
	d.fast = fastpath.New(fastpath.Options{Backend: f, NoWatch: true, RedirectPort: cfg.RedirectPort})
	defer d.fastClose()
	w := api.Workload{ID: "fp", Netns: "/ns/fp", Mode: api.ModeTransparent, Source: "cni"}
	if err := netns.InstallWith(f, w.Netns, netns.Capture{RedirectPort: cfg.RedirectPort, Mark: cfg.Mark}); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	d.regs[w.ID] = registry.Entry{Registration: api.Registration{Workload: w}}
	err = d.fastAdd(w)
	d.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	kernel := func() api.KernelStatus {
		t.Helper()
		var s api.Status
		d.fastStatus(&s)
		if len(s.Kernel) != 1 {
			t.Fatalf("kernel status %+v", s.Kernel)
		}
		return s.Kernel[0]
	}
	for i, repair := range []string{"reload of the same rules", "reap check"} {
		src := fmt.Sprintf("default: direct\nrules:\n  - cidr: 192.0.2.%d/32\n    action: deny\n", i)
		if err := os.WriteFile(cfg.Rules, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		before := kernel().Policy
		f.ApplyErr = errors.New("boom")
		if err := d.Reload(); err != nil {
			t.Fatal(err)
		}
		f.ApplyErr = nil
		live := d.policy.Load().Hash()
		if k := kernel(); k.Error == "" || k.Policy != before || k.Policy == live {
			t.Fatalf("%s: status after a failed swap %+v, want the error and the previous policy", repair, k)
		}
		switch repair {
		case "reload of the same rules":
			if err := d.Reload(); err != nil {
				t.Fatal(err)
			}
		case "reap check":
			d.mu.Lock()
			d.fastVerify(nil)
			d.mu.Unlock()
		}
		if k := kernel(); k.Error != "" || k.Policy != live {
			t.Errorf("%s: status %+v, want the live policy %.12s installed\n%s", repair, k, live, logs.String())
		}
		if err := d.fast.Verify(w.ID, d.policy.Load()); err != nil {
			t.Errorf("%s: Verify: %v", repair, err)
		}
	}
}
