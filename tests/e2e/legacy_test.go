package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCNIChainLegacyVersion runs the real chain with the cniVersion a Flannel or Calico
// conflist declares (0.3.1): kl-cni reads the bridge's 0.3.1 prevResult, captures the pod
// and returns the result in 0.3.1; flows go through the relay; DEL cleans up.
func TestCNIChainLegacyVersion(t *testing.T) {
	n := newNode(t, false)
	conf := filepath.Join(n.dir, "net.d", "10-kl.conflist")
	b, err := os.ReadFile(conf)
	must(t, err)
	must(t, os.WriteFile(conf, []byte(strings.Replace(string(b), `"cniVersion": "1.1.0"`, `"cniVersion": "0.3.1"`, 1)), 0o644))
	n.server()
	n.startRelay()

	a := n.newPod("legacy")
	out, err := n.add(a)
	if err != nil {
		t.Fatalf("ADD (0.3.1): %v\n%s\nrelay:\n%s", err, out, n.logs.String())
	}
	if !strings.Contains(out, `"cniVersion": "0.3.1"`) || !a.v4.IsValid() {
		t.Fatalf("ADD result is not the pod's 0.3.1 result:\n%s", out)
	}
	reg, found, err := n.client().Get(context.Background(), a.id)
	if err != nil || !found || len(reg.Workload.Addrs) != 1 || reg.Workload.Addrs[0] != a.v4 {
		t.Errorf("registration = %+v, %v, %v; want the pod address %v", reg.Workload, found, err, a.v4)
	}
	seen, local, err := visit(t, a, "198.51.100.2:8080")
	if err != nil {
		t.Fatalf("visit from the pod: %v\nrelay:\n%s", err, n.logs.String())
	}
	if seen.Addr() != a.v4 || seen.Port() == local.Port() {
		t.Errorf("server saw %v (client %v): want the pod address through the relay", seen, local)
	}
	if st := n.status(); st.Flows.ByExit["direct"] != 1 {
		t.Errorf("relay direct flows = %d, want 1", st.Flows.ByExit["direct"])
	}
	if out, err := n.del(a); err != nil {
		t.Fatalf("DEL (0.3.1): %v\n%s", err, out)
	}
	if got := a.ns.Exec(t, "nft", "list", "tables"); strings.TrimSpace(got) != "" {
		t.Errorf("DEL left %s", got)
	}
}
