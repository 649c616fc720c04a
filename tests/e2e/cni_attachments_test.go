package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/kl-egress/kl/tests/testutil"
)

// klcni runs the kl-cni binary as libcni would for one plugin of a conflist: command on
// the attachment (id, netns, ifname) with conf, the network's config, on stdin.
func (n *node) klcni(t *testing.T, cmd, id, nsPath, ifname, conf string) (string, error) {
	t.Helper()
	c := n.ns.Command(testutil.Bin(t, "kl-cni"))
	c.Env = append(os.Environ(), "CNI_COMMAND="+cmd, "CNI_CONTAINERID="+id, "CNI_NETNS="+nsPath,
		"CNI_IFNAME="+ifname, "CNI_PATH="+n.cniPath)
	c.Stdin = strings.NewReader(conf)
	out, err := c.CombinedOutput()
	return string(out), err
}

// TestCNIAttachments: the DEL of one CNI attachment must leave the capture of the pod's
// other one. Case A, a pod chained to two kl-cni networks (Multus, or a second
// interface): after the DEL of the second network's attachment, the pod's connections
// are still captured (the cidr deny rule still refuses 203.0.113.7, which the test host
// serves) and CHECK of the first still passes. Case B, an ADD refused because another
// sandbox's registration holds the netns: the runtime's DEL that follows leaves that
// sandbox captured.
func TestCNIAttachments(t *testing.T) {
	n := newNode(t, false)
	n.server()
	// 203.0.113.7 is served by the test host: a flow the relay does not refuse gets through.
	n.host.Exec(t, "ip", "addr", "add", "203.0.113.7/32", "dev", "lo")
	n.ns.Exec(t, "ip", "route", "add", "203.0.113.7/32", "via", "198.51.100.2")
	n.startRelay()

	// netB is a second kl-cni network; its prevResult names the pod's second interface.
	netB := func(p *pod, ifname string) string {
		return fmt.Sprintf(`{"cniVersion":"1.1.0","name":"netB","type":"kl-cni","socket":%q,"ipv6":false,"timeout":"3s",
"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":%q,"sandbox":%q}],"ips":[{"interface":0,"address":"192.0.2.250/24"}]}}`,
			n.socket, ifname, p.ns.Path)
	}
	captured := func(t *testing.T, p *pod) {
		t.Helper()
		if _, _, err := visit(t, p, "203.0.113.7:8080"); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("connection to 203.0.113.7 (denied by rule 2): %v, want reset by the relay\nrelay:\n%s", err, n.logs.String())
		}
		if out, err := n.check(p); err != nil {
			t.Errorf("CHECK: %v\n%s", err, out)
		}
	}

	t.Run("two networks, DEL of one", func(t *testing.T) {
		a := n.newPod("multi")
		if out, err := n.add(a); err != nil {
			t.Fatalf("ADD %s: %v\n%s", n.netName, err, out)
		}
		if out, err := n.klcni(t, "ADD", a.id, a.ns.Path, "net1", netB(a, "net1")); err != nil {
			t.Fatalf("ADD netB: %v\n%s", err, out)
		}
		captured(t, a)
		if out, err := n.klcni(t, "DEL", a.id, a.ns.Path, "net1", netB(a, "net1")); err != nil {
			t.Fatalf("DEL netB: %v\n%s", err, out)
		}
		captured(t, a)
		reg, found, err := n.client().Get(context.Background(), a.id)
		if err != nil || !found || len(reg.Attachments) != 1 || reg.Attachments[0].Network != n.netName {
			t.Errorf("after the DEL of netB: registered %v (%v), attachments %+v; want %s's only", found, err, reg.Attachments, n.netName)
		}
		if out, err := n.del(a); err != nil {
			t.Fatalf("DEL %s: %v\n%s", n.netName, err, out)
		}
		if got := a.ns.Exec(t, "nft", "list", "tables"); strings.TrimSpace(got) != "" {
			t.Errorf("tables left after the last DEL: %s", got)
		}
		if _, found, _ := n.client().Get(context.Background(), a.id); found {
			t.Error("registered after the last DEL")
		}
	})

	t.Run("DEL after a conflicting ADD", func(t *testing.T) {
		b := n.newPod("held")
		if out, err := n.add(b); err != nil {
			t.Fatalf("ADD: %v\n%s", err, out)
		}
		out, err := n.klcni(t, "ADD", "x1-"+b.ns.Name, b.ns.Path, "eth0", netB(b, "eth0"))
		if err == nil || !strings.Contains(out, "already served for workload "+b.id) {
			t.Fatalf("ADD of another id in the pod's netns: %v\n%s; want the relay's conflict", err, out)
		}
		if out, err := n.klcni(t, "DEL", "x1-"+b.ns.Name, b.ns.Path, "eth0", netB(b, "eth0")); err != nil {
			t.Fatalf("the runtime's DEL after the failed ADD: %v\n%s", err, out)
		}
		captured(t, b)
		if _, found, err := n.client().Get(context.Background(), b.id); !found || err != nil {
			t.Errorf("%s registered %v (%v) after the other id's DEL, want registered", b.id, found, err)
		}
	})

	t.Run("DEL of an id the relay refuses", func(t *testing.T) {
		c := n.newPod("long")
		long := strings.Repeat("a", 251)
		if out, err := n.klcni(t, "ADD", long, c.ns.Path, "eth0", netB(c, "eth0")); err == nil {
			t.Fatalf("ADD with a 251-character id succeeded:\n%s", out)
		}
		if out, err := n.klcni(t, "DEL", long, c.ns.Path, "eth0", netB(c, "eth0")); err != nil {
			t.Errorf("DEL with a 251-character id: %v\n%s", err, out)
		}
		if got := c.ns.Exec(t, "nft", "list", "tables"); strings.TrimSpace(got) != "" {
			t.Errorf("the refused ADD's fail-closed table left after DEL: %s", got)
		}
	})
}
