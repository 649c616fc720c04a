package daemon

import (
	"context"
	"log/slog"
	"testing"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/tests/testutil"
)

// An older kl-cni (no ifname) registered the pod with a new kl-relayd; the new kl-cni's
// DEL of that same attachment (network rcnet, interface eth0) must release it.
func TestDelReleasesOlderKlCNIAttachment(t *testing.T) {
	testutil.RequireTool(t, "nft")
	cfg := testConfig(t, t.TempDir())
	d, logs := attachDaemon(t, cfg)
	defer d.shutdown(nil)
	ns := testutil.NewNetns(t, "klat1")
	t.Cleanup(func() { _ = d.Deregister("c1") })
	h := d.Handler()
	attAdd(t, h, cniWorkload(cfg, "c1", ns.Path, "rcnet", ""))
	out := attDel(t, h, "c1", "rcnet", "eth0", ns.Path)
	_, tableErr := ns.Command("nft", "list", "table", "inet", netns.TableName).CombinedOutput()
	t.Logf("answer %+v; registrations %d; table present %v", out, len(d.Registrations()), tableErr == nil)
	if len(d.Registrations()) != 0 || tableErr == nil {
		t.Errorf("the pod's only attachment was DELeted, but its registration/table stay; logs:\n%s", logs.String())
	}
}

// A registration pending after a restart (restore short of descriptors) with two
// attachments: the DEL of one must leave the other (registration kept, netns served).
func TestDelWhileRestorePending(t *testing.T) {
	testutil.RequireTool(t, "nft")
	cfg := testConfig(t, t.TempDir())
	d, logs := attachDaemon(t, cfg)
	ns := testutil.NewNetns(t, "klat2")
	h := d.Handler()
	attAdd(t, h, cniWorkload(cfg, "c1", ns.Path, "rcnet", "eth0"))
	attAdd(t, h, cniWorkload(cfg, "c1", ns.Path, "netB", "net1"))
	d.shutdown(nil)
	d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer d.shutdown(nil)
	t.Cleanup(func() { _ = d.Deregister("c1") })
	withoutDescriptors(t, func() { d.restore(context.Background()) })
	if len(d.pending) != 1 && !d.rescan || len(d.Registrations()) != 0 {
		t.Fatalf("pending %d rescan %v, want 1; logs:\n%s", len(d.pending), d.rescan, logs.String())
	}
	t.Logf("after restore: pending %d, rescan %v, registered %d", len(d.pending), d.rescan, len(d.Registrations()))
	out := attDel(t, d.Handler(), "c1", "netB", "net1", ns.Path)
	ents, _ := mustStore(t, cfg).Load()
	d.retryPending()
	t.Logf("answer %+v; stored %d; registered after retry %d", out, len(ents), len(d.Registrations()))
	if !out.NetnsServed || len(ents) != 1 || len(d.Registrations()) != 1 {
		t.Errorf("DEL of netB/net1 dropped c1 although rcnet/eth0 is left (kl-cni then removes the table: the live pod is uncaptured); logs:\n%s", logs.String())
	}
}

// A registration saved before attachments were recorded (restored after the upgrade:
// Network rcnet, no attachments) gets a second attachment (netB/net1); the DEL of that
// one must leave rcnet's registration and table.
func TestSecondAttachmentOfSavedRegistration(t *testing.T) {
	testutil.RequireTool(t, "nft")
	cfg := testConfig(t, t.TempDir())
	d, _ := attachDaemon(t, cfg)
	defer d.shutdown(nil)
	ns := testutil.NewNetns(t, "klat3")
	t.Cleanup(func() { _ = d.Deregister("c1") })
	h := d.Handler()
	attAdd(t, h, cniWorkload(cfg, "c1", ns.Path, "rcnet", ""))
	d.mu.Lock()
	e := d.regs["c1"]
	e.Registration.Attachments = nil // as saved by the previous kl-relayd
	d.regs["c1"] = e
	if err := d.store.Put(e); err != nil {
		t.Fatal(err)
	}
	d.mu.Unlock()
	attAdd(t, h, cniWorkload(cfg, "c1", ns.Path, "netB", "net1"))
	t.Logf("attachments after the second ADD: %+v", d.Registrations()[0].Attachments)
	out := attDel(t, h, "c1", "netB", "net1", ns.Path)
	_, tableErr := ns.Command("nft", "list", "table", "inet", netns.TableName).CombinedOutput()
	t.Logf("answer %+v; registrations %d; table present %v", out, len(d.Registrations()), tableErr == nil)
	if len(d.Registrations()) != 1 || tableErr != nil {
		t.Errorf("DEL of netB/net1 deregistered c1 and removed its table though rcnet is still attached")
	}
}
