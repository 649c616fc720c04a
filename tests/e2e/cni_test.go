// Package e2e holds kl's end-to-end tests against real kernels, CNI plugins and daemons.
package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
)

var counterRE = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// checkGolden compares got with testdata/name (KL_UPDATE_GOLDEN=1 rewrites it).
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if os.Getenv("KL_UPDATE_GOLDEN") == "1" {
		must(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (KL_UPDATE_GOLDEN=1 creates it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (KL_UPDATE_GOLDEN=1 rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

func listens(t *testing.T, p *pod, port string) bool {
	out := p.ns.Exec(t, "ss", "-Hltn")
	return strings.Contains(out, ":"+port+" ")
}

// TestCNIChain runs the real chain bridge + host-local + loopback + portmap + kl-cni with
// kl-relayd, and walks one pod through its life.
func TestCNIChain(t *testing.T) {
	n := newNode(t, true)
	n.server()
	n.startRelay()
	ctx := context.Background()

	if out, err := n.cnitool(nil, "status", n.netName, n.ns.Path); err != nil {
		t.Fatalf("STATUS with the relay up: %v\n%s", err, out)
	}

	a := n.newPod("web")
	out, err := n.add(a)
	if err != nil {
		t.Fatalf("ADD: %v\n%s\nrelay:\n%s", err, out, n.logs.String())
	}
	if !a.v4.IsValid() || !a.v6.IsValid() {
		t.Fatalf("pod addresses from the result: %v %v\n%s", a.v4, a.v6, out)
	}
	if got := a.ns.Exec(t, "ip", "-br", "addr", "show", "eth0"); !strings.Contains(got, a.v4.String()) {
		t.Fatalf("pod eth0 lacks %s: %s", a.v4, got)
	}

	t.Run("table", func(t *testing.T) {
		got := counterRE.ReplaceAllString(a.ns.Exec(t, "nft", "list", "table", "inet", "kl"), "counter")
		checkGolden(t, "kl-table.golden", got)
	})
	t.Run("registration", func(t *testing.T) {
		reg, found, err := n.client().Get(ctx, a.id)
		if err != nil || !found {
			t.Fatalf("Get(%s) = %v %v", a.id, found, err)
		}
		w := reg.Workload
		if w.Netns != a.ns.Path || w.Mode != "transparent" || w.Name != "web" || w.Namespace != "e2e" || w.Annotations["team"] != "e2e" {
			t.Errorf("registration = %+v", w)
		}
		if len(w.Addrs) != 2 {
			t.Errorf("registered addresses %v, want the pod's two", w.Addrs)
		}
		if !listens(t, a, "15001") {
			t.Error("no relay listener in the pod netns after ADD")
		}
	})
	if out, err := n.check(a); err != nil {
		t.Fatalf("CHECK after ADD: %v\n%s", err, out)
	}

	relayed := func(t *testing.T, addr string, want func() bool) {
		t.Helper()
		before := n.status().Flows.ByExit["direct"]
		seen, local, err := visit(t, a, addr)
		if err != nil {
			t.Fatalf("visit %s from the pod: %v\nrelay:\n%s", addr, err, n.logs.String())
		}
		if seen.Addr() != local.Addr() {
			t.Errorf("server saw %v, want the pod's own address %v", seen.Addr(), local.Addr())
		}
		if seen.Port() == local.Port() {
			t.Errorf("server saw the client's own port %d: the flow did not pass the relay", local.Port())
		}
		if after := n.status().Flows.ByExit["direct"]; after != before+1 {
			t.Errorf("relay direct flows %d -> %d, want one more", before, after)
		}
	}
	t.Run("ipv4 via relay", func(t *testing.T) { relayed(t, "198.51.100.2:8080", nil) })
	t.Run("ipv6 via relay", func(t *testing.T) { relayed(t, "[fd00:51::2]:8080", nil) })

	t.Run("deny resets", func(t *testing.T) {
		before := n.status().Flows.ByExit["deny"]
		_, _, err := visit(t, a, "203.0.113.7:443")
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("denied flow: %v, want connection reset", err)
		}
		if after := n.status().Flows.ByExit["deny"]; after != before+1 {
			t.Errorf("deny count %d -> %d", before, after)
		}
	})

	t.Run("sniffed TLS server name", func(t *testing.T) {
		hello := func(name string) error {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			c, err := netns.Dial(ctx, a.ns.Path, 0, "tcp", "198.51.100.2:8080")
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			return tls.Client(c, &tls.Config{ServerName: name, InsecureSkipVerify: true}).Handshake()
		}
		before := n.status().Flows.ByExit
		if err := hello("blocked.example"); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("ClientHello for a denied name: %v, want reset", err)
		}
		// An allowed name is carried (the test server does not speak TLS: the handshake
		// fails on its answer, after the relay connected).
		hello("allowed.example")
		after := n.status().Flows.ByExit
		if after["deny"] != before["deny"]+1 || after["direct"] != before["direct"]+1 {
			t.Errorf("flows %v -> %v, want one more deny and one more direct", before, after)
		}
	})

	t.Run("audit", func(t *testing.T) {
		st := n.status()
		var direct, deny bool
		for _, r := range st.Recent {
			direct = direct || r.Exit == "direct" && r.Dimension == "default" && r.Priority == 999
			deny = deny || r.Exit == "deny" && r.Rule == 2 && r.Dimension == "cidr" && r.Note == "test deny"
		}
		if !direct || !deny {
			t.Errorf("recent decisions lack the direct and deny flows: %+v", st.Recent)
		}
		if len(st.Hits) == 0 {
			t.Error("no hit counts")
		}
		// The file (flushed at shutdown or every second) never holds a destination.
		deadline := time.Now().Add(3 * time.Second)
		var data []byte
		for len(data) == 0 && time.Now().Before(deadline) {
			data, _ = os.ReadFile(filepath.Join(n.dir, "audit.jsonl"))
			time.Sleep(100 * time.Millisecond)
		}
		if len(data) == 0 {
			t.Fatal("audit file empty")
		}
		for _, leak := range []string{"198.51.100", "203.0.113", "fd00:", "e2e", "web"} {
			if strings.Contains(string(data), leak) {
				t.Errorf("audit file contains %q:\n%s", leak, data)
			}
		}
	})

	t.Run("relay port is no open proxy", func(t *testing.T) {
		// From outside the pod straight to its relay port: refused, never carried.
		before := n.status().Flows
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		c, err := netns.Dial(ctx, n.host.Path, 0, "tcp", net.JoinHostPort(a.v4.String(), "15001"))
		if err == nil {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = c.Read(make([]byte, 1))
			c.Close()
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("outside connection to the relay port: %v, want a reset", err)
		}
		after := n.status().Flows
		if after.ByExit["refused"] != before.ByExit["refused"]+1 || after.ByExit["direct"] != before.ByExit["direct"] {
			t.Errorf("flows %+v -> %+v, want one more refused and no direct", before.ByExit, after.ByExit)
		}
	})

	t.Run("metadata bypasses relay", func(t *testing.T) {
		before := n.status().Flows.Total
		seen, local, err := visit(t, a, "169.254.169.254:8080")
		if err != nil {
			t.Fatalf("metadata: %v", err)
		}
		if seen != local {
			t.Errorf("server saw %v, client is %v: the metadata flow was relayed", seen, local)
		}
		if after := n.status().Flows.Total; after != before {
			t.Errorf("relay saw %d flows for a metadata connection", after-before)
		}
	})

	t.Run("reload changes new flows, keeps established ones", func(t *testing.T) {
		// An established flow through the relay.
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		c, err := netns.Dial(cctx, a.ns.Path, 0, "tcp", "198.51.100.2:8080")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		echo := func() error {
			if _, err := c.Write([]byte("ping")); err != nil {
				return err
			}
			buf := make([]byte, 4)
			_, err := io.ReadFull(br, buf)
			return err
		}
		hash := n.status().Rules.Hash
		denyAll := rulesYAML + "  - cidr: 198.51.100.0/24\n    action: deny\n"
		must(t, os.WriteFile(n.rules+".tmp", []byte(denyAll), 0o644))
		must(t, os.Rename(n.rules+".tmp", n.rules))
		deadline := time.Now().Add(5 * time.Second)
		for n.status().Rules.Hash == hash {
			if time.Now().After(deadline) {
				t.Fatalf("rules not reloaded:\n%s", n.logs.String())
			}
			time.Sleep(20 * time.Millisecond)
		}
		if _, _, err := visit(t, a, "198.51.100.2:8080"); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("new flow after the reload: %v, want reset by the new deny rule", err)
		}
		if err := echo(); err != nil {
			t.Errorf("established flow cut by the reload: %v", err)
		}
		must(t, os.WriteFile(n.rules+".tmp", []byte(rulesYAML), 0o644))
		must(t, os.Rename(n.rules+".tmp", n.rules))
		deadline = time.Now().Add(5 * time.Second)
		for {
			if _, _, err := visit(t, a, "198.51.100.2:8080"); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("rules not restored")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("relay restart restores capture", func(t *testing.T) {
		n.stopRelay()
		// Down: capture fails closed.
		if _, _, err := visit(t, a, "198.51.100.2:8080"); err == nil {
			t.Error("a flow got out while the relay was down")
		}
		if out, err := n.cnitool(nil, "status", n.netName, n.ns.Path); err == nil {
			t.Errorf("STATUS with the relay down succeeded:\n%s", out)
		}
		n.startRelay()
		if !listens(t, a, "15001") {
			t.Fatal("restart did not reopen the listener in the pod")
		}
		relayed(t, "198.51.100.2:8080", nil)
	})

	t.Run("ADD with relay stopped fails", func(t *testing.T) {
		n.stopRelay()
		defer n.startRelay()
		b := n.newPod("late")
		out, err := n.add(b)
		if err == nil {
			t.Fatalf("ADD with the relay down succeeded:\n%s", out)
		}
		if !strings.Contains(out, "not reachable") {
			t.Errorf("ADD error does not say the relay is unreachable:\n%s", out)
		}
		// The runtime's DEL after a failed ADD cleans up, relay or not.
		if out, err := n.del(b); err != nil {
			t.Errorf("DEL after failed ADD: %v\n%s", err, out)
		}
		if got := b.ns.Exec(t, "nft", "list", "tables"); strings.TrimSpace(got) != "" {
			t.Errorf("tables left after DEL: %s", got)
		}
	})

	t.Run("CHECK catches a deleted rule", func(t *testing.T) {
		listing := a.ns.Exec(t, "nft", "-a", "list", "chain", "inet", "kl", "nat_output")
		m := regexp.MustCompile(`redirect to :15001 # handle (\d+)`).FindStringSubmatch(listing)
		if m == nil {
			t.Fatalf("no redirect rule in:\n%s", listing)
		}
		a.ns.Exec(t, "nft", "delete", "rule", "inet", "kl", "nat_output", "handle", m[1])
		out, err := n.check(a)
		if err == nil {
			t.Fatalf("CHECK passed with the redirect rule deleted:\n%s", out)
		}
		if !strings.Contains(out, "redirect") {
			t.Errorf("CHECK error does not name the missing rule:\n%s", out)
		}
	})

	t.Run("GC drops stale registrations", func(t *testing.T) {
		// A sandbox of this network whose DEL never reached the relay.
		stale := n.newPod("stale")
		w := api.Workload{ID: "stale-" + stale.ns.Name, Netns: stale.ns.Path, Mode: "transparent", Source: "cni", Network: n.netName}
		if _, err := n.client().Register(ctx, w); err != nil {
			t.Fatal(err)
		}
		// Not this network's: left alone.
		other := n.newPod("other")
		wo := api.Workload{ID: "other-" + other.ns.Name, Netns: other.ns.Path, Mode: "transparent", Source: "cni", Network: "another-net"}
		if _, err := n.client().Register(ctx, wo); err != nil {
			t.Fatal(err)
		}
		// cnitool gc passes no valid attachments: it DELs every cached one, then GCs.
		if out, err := n.cnitool(nil, "gc", n.netName, n.ns.Path); err != nil {
			t.Fatalf("GC: %v\n%s", err, out)
		}
		for id, want := range map[string]bool{w.ID: false, a.id: false, wo.ID: true} {
			if _, found, err := n.client().Get(ctx, id); err != nil || found != want {
				t.Errorf("after GC, %s registered = %v (%v), want %v", id, found, err, want)
			}
		}
		n.client().Deregister(ctx, wo.ID)
	})

	t.Run("DEL leaves nothing", func(t *testing.T) {
		for i := 0; i < 2; i++ {
			if out, err := n.del(a); err != nil {
				t.Fatalf("DEL #%d: %v\n%s", i+1, err, out)
			}
		}
		if got := a.ns.Exec(t, "nft", "list", "tables"); strings.TrimSpace(got) != "" {
			t.Errorf("tables left: %s", got)
		}
		if listens(t, a, "15001") {
			t.Error("relay listener left in the pod")
		}
		if _, found, err := n.client().Get(ctx, a.id); found || err != nil {
			t.Errorf("registration left: %v %v", found, err)
		}
		if st := n.status(); st.Workloads != 0 {
			t.Errorf("status: %d workloads", st.Workloads)
		}
		ents, _ := os.ReadDir(filepath.Join(n.dir, "state", "workloads"))
		if len(ents) != 0 {
			t.Errorf("state dir not empty: %v", ents)
		}
	})
}
