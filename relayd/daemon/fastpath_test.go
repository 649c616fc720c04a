package daemon

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
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
	d.fastVerify()
	d.mu.Unlock()
	if tb := table(); !strings.Contains(tb, "ct mark set") {
		t.Fatalf("kernel decisions not reinstalled by the check:\n%s\n%s", tb, logs.String())
	}
	if err := d.fast.Verify("fp"); err != nil {
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
