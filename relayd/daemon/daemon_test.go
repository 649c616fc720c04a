package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/config"
	"github.com/kl-egress/kl/relayd/publish"
	"github.com/kl-egress/kl/relayd/registry"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/tests/testutil"
)

// freePort returns a TCP port nothing listens on right now (in the test's own netns,
// which the tests use as the "pod" netns: /proc/self/ns/net).
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

func testConfig(t *testing.T, dir string) *config.Config {
	t.Helper()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte("default: direct\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		Socket:       filepath.Join(dir, "relayd.sock"),
		StateDir:     filepath.Join(dir, "state"),
		Rules:        rulesPath,
		RedirectPort: freePort(t),
	}
	if err := cfg.Fill(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// start runs a daemon until the test (or stop) ends; it returns a client and a stop func.
func start(t *testing.T, cfg *config.Config) (*api.Client, func()) {
	t.Helper()
	var logs bytes.Buffer
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	c := api.NewClient(cfg.Socket, 2*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for c.Ping(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("daemon not ready; logs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve = %v", err)
		}
	}
	t.Cleanup(stop)
	return c, stop
}

// listening reports whether something accepts on the port. The relay resets what it
// accepts here (a connection made straight to it, not redirected), which can already
// surface at connect on loopback: only a refusal means "not listening".
func listening(port uint16) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", itoa(port)), 5*time.Second)
	if err != nil {
		lastDialErr = err
		return !errors.Is(err, syscall.ECONNREFUSED)
	}
	c.Close()
	return true
}

var lastDialErr error

func itoa(p uint16) string { return strconv.Itoa(int(p)) }

func self() api.Workload {
	return api.Workload{ID: "sandbox1", Netns: "/proc/self/ns/net", Mode: api.ModeTransparent, Source: "cni",
		Namespace: "default", Name: "web", Labels: map[string]string{"app": "web"}}
}

func TestRegisterLifecycle(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	c, _ := start(t, cfg)
	ctx := context.Background()

	reg, err := c.Register(ctx, self())
	if err != nil {
		t.Fatalf("Register = %v", err)
	}
	if reg.Listeners.Redirect != cfg.RedirectPort || reg.Workload.ID != "sandbox1" || reg.Since.IsZero() {
		t.Errorf("Register = %+v", reg)
	}
	if !listening(cfg.RedirectPort) {
		t.Fatalf("Register returned before the listener accepts: %v", lastDialErr)
	}
	// Refresh: same id, same netns, new labels.
	w := self()
	w.Labels = map[string]string{"app": "web2"}
	reg2, err := c.Register(ctx, w)
	if err != nil || !reg2.Since.Equal(reg.Since) || reg2.Workload.Labels["app"] != "web2" {
		t.Errorf("refresh = %+v, %v", reg2, err)
	}
	// Another id on the same netns is a conflict.
	w.ID = "sandbox2"
	w.Netns = "/proc/thread-self/ns/net"
	var he *api.HTTPError
	if _, err := c.Register(ctx, w); !errors.As(err, &he) || he.Status != http.StatusConflict {
		t.Errorf("second id on one netns = %v, want 409", err)
	}
	got, found, err := c.Get(ctx, "sandbox1")
	if err != nil || !found || got.Workload.Labels["app"] != "web2" {
		t.Errorf("Get = %+v %v %v", got, found, err)
	}
	if _, found, err := c.Get(ctx, "nope"); found || err != nil {
		t.Errorf("Get(unknown) = %v %v", found, err)
	}
	list, err := c.List(ctx)
	if err != nil || len(list) != 1 {
		t.Errorf("List = %+v %v", list, err)
	}
	var st api.Status
	if err := c.Call(ctx, http.MethodGet, "/v1/status", nil, &st); err != nil {
		t.Fatal(err)
	}
	if !st.Ready || st.Workloads != 1 || st.FDs == 0 || st.FDLimit == 0 || st.Rules.Hash == "" || st.Rules.Path != cfg.Rules {
		t.Errorf("Status = %+v", st)
	}
	if err := c.Deregister(ctx, "sandbox1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Deregister(ctx, "sandbox1"); err != nil {
		t.Errorf("second Deregister = %v", err)
	}
	if listening(cfg.RedirectPort) {
		t.Error("listener survived Deregister")
	}
	if ents, _ := mustStore(t, cfg).Load(); len(ents) != 0 {
		t.Errorf("registry after Deregister: %+v", ents)
	}
}

func mustStore(t *testing.T, cfg *config.Config) *registry.Store {
	s, err := registry.Open(cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRegisterRefusals(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	c, _ := start(t, cfg)
	notNetns := filepath.Join(t.TempDir(), "file")
	os.WriteFile(notNetns, nil, 0o600)
	for _, tt := range []struct {
		name string
		w    api.Workload
		want string
	}{
		{"bad id", api.Workload{ID: "../x", Netns: "/proc/self/ns/net", Mode: "transparent"}, "workload id"},
		{"relative netns", api.Workload{ID: "a", Netns: "ns", Mode: "transparent"}, "absolute"},
		{"bad mode", api.Workload{ID: "a", Netns: "/proc/self/ns/net", Mode: "magic"}, "mode"},
		{"missing netns", api.Workload{ID: "a", Netns: "/nonexistent/ns", Mode: "transparent"}, "no such file"},
		{"not a netns", api.Workload{ID: "a", Netns: notNetns, Mode: "transparent"}, "not a network namespace"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Register(context.Background(), tt.w)
			var he *api.HTTPError
			if !errors.As(err, &he) || he.Status != http.StatusBadRequest || !strings.Contains(he.Msg, tt.want) {
				t.Errorf("Register = %v, want 400 mentioning %q", err, tt.want)
			}
		})
	}
}

func TestRestartRestoresAndDropsDead(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	c, stop := start(t, cfg)
	if _, err := c.Register(context.Background(), self()); err != nil {
		t.Fatal(err)
	}
	stop()
	if listening(cfg.RedirectPort) {
		t.Fatal("listener survived the daemon's shutdown")
	}
	// A registration whose netns has vanished since.
	dead := registry.Entry{Registration: api.Registration{Workload: api.Workload{ID: "dead", Netns: "/var/run/netns/kl-test-gone", Mode: "transparent"}}, NetnsDev: 1, NetnsIno: 2}
	if err := mustStore(t, cfg).Put(dead); err != nil {
		t.Fatal(err)
	}
	c, _ = start(t, cfg)
	if !listening(cfg.RedirectPort) {
		t.Error("restart did not reopen the listener")
	}
	list, err := c.List(context.Background())
	if err != nil || len(list) != 1 || list[0].Workload.ID != "sandbox1" {
		t.Errorf("List after restart = %+v %v", list, err)
	}
	ents, _ := mustStore(t, cfg).Load()
	if len(ents) != 1 {
		t.Errorf("dead registration not dropped from the store: %+v", ents)
	}
}

// A SIGTERM while restoring (hundreds of pods take seconds) stops the restore at once:
// serve returns without becoming ready or serving the API, the listeners already
// reopened are closed, and the registrations not reached stay in the store for the next
// start. Each reopen is slowed here, and ctx is cancelled after the first.
func TestStopDuringRestore(t *testing.T) {
	const n, slow = 5, 500 * time.Millisecond
	cfg := testConfig(t, t.TempDir())
	cfg.NoFastPath = true
	store := mustStore(t, cfg)
	var nss []*testutil.Netns
	for i := range n {
		ns := testutil.NewNetns(t, "klrst")
		dev, ino, err := netnsID(ns.Path)
		if err != nil {
			t.Fatal(err)
		}
		w := api.Workload{ID: "pod" + strconv.Itoa(i), Netns: ns.Path, Mode: api.ModeTransparent, Source: "cni"}
		if err := store.Put(registry.Entry{Registration: api.Registration{Workload: w}, NetnsDev: dev, NetnsIno: ino}); err != nil {
			t.Fatal(err)
		}
		nss = append(nss, ns)
	}
	ln := notifySocket(t)

	var logs testutil.Buffer
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var reopened []string
	d.restored = func(id string) {
		reopened = append(reopened, id)
		cancel() // the SIGTERM
		time.Sleep(slow)
	}
	done := make(chan error, 1)
	begin := time.Now()
	go func() { done <- d.Serve(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Serve still running 10s after the cancel; logs:\n%s", logs.String())
	}
	if took := time.Since(begin); took > slow+time.Second {
		t.Errorf("Serve returned %v after the start, want about one reopen (%v)", took, slow)
	}
	if len(reopened) != 1 || len(d.regs) != 1 {
		t.Errorf("reopened %q (%d registrations kept) after the cancel, want only the first", reopened, len(d.regs))
	}
	if !strings.Contains(logs.String(), "kept=1 dropped=0 pending=0 left="+strconv.Itoa(n-1)) {
		t.Errorf("no log of what was left for the next start:\n%s", logs.String())
	}
	if ents, errs := mustStore(t, cfg).Load(); len(ents) != n || len(errs) != 0 {
		t.Errorf("store after the stop: %d entries %v, want all %d left for the next start", len(ents), errs, n)
	}
	for _, s := range notifications(t, ln, 100*time.Millisecond) {
		if s == "READY=1" {
			t.Error("reported ready after being stopped during the restore")
		}
	}
	if _, err := os.Stat(cfg.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("API socket after the stop: %v", err)
	}
	if !strings.Contains(logs.String(), "shutting down") {
		t.Errorf("no shutdown logged:\n%s", logs.String())
	}
	for _, ns := range nss {
		if err := netns.Do(ns.Path, func() error {
			if listening(cfg.RedirectPort) {
				return fmt.Errorf("listener in %s survived the stop", ns.Name)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
}

func TestSocketInUse(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	start(t, cfg)
	other := *cfg // its own state (a second one on the same state stops in New: TestSecondDaemonLeavesStateAlone)
	other.StateDir = filepath.Join(t.TempDir(), "state")
	d, err := New(&other, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Serve(context.Background()); err == nil || !strings.Contains(err.Error(), "another kl-relayd") {
		t.Errorf("second daemon on one socket: Serve = %v", err)
	}
}

func TestBadRulesRefuseToStart(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	os.WriteFile(cfg.Rules, []byte("default: sideways\n"), 0o644)
	var out bytes.Buffer
	err := run(context.Background(), []string{"kl-relayd", "--settings", writeSettings(t, dir, cfg)}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "E_BAD_ACTION") || !strings.Contains(err.Error(), cfg.Rules) {
		t.Errorf("run with a bad rules file = %v, want E_BAD_ACTION naming the file", err)
	}
}

func writeSettings(t *testing.T, dir string, cfg *config.Config) string {
	p := filepath.Join(dir, "relayd.yaml")
	s := "socket: " + cfg.Socket + "\nstateDir: " + cfg.StateDir + "\nrules: " + cfg.Rules + "\nredirectPort: " + itoa(cfg.RedirectPort) + "\n"
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCheckCommand(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"kl-relayd", "check", "--settings", writeSettings(t, dir, cfg)}, &out, &out); err != nil {
		t.Fatalf("check = %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "rules ok") {
		t.Errorf("check output = %q", out.String())
	}
}

func TestSdNotify(t *testing.T) {
	ln := notifySocket(t)
	if err := sdNotify("READY=1"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	ln.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := ln.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1" {
		t.Errorf("notification = %q, %v", buf[:n], err)
	}
	t.Setenv("NOTIFY_SOCKET", "")
	if err := sdNotify("READY=1"); err != nil {
		t.Errorf("sdNotify without NOTIFY_SOCKET = %v", err)
	}
}

func TestReload(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	c, _ := start(t, cfg)
	ctx := context.Background()
	status := func() api.Status {
		var st api.Status
		if err := c.Call(ctx, http.MethodGet, "/v1/status", nil, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	first := status().Rules
	published := func() string {
		b, err := publish.Read(cfg.PublishedRules)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if want := filepath.Join(filepath.Dir(cfg.Socket), "rules"); cfg.PublishedRules != want {
		t.Fatalf("publishedRules default %s, want %s (beside the socket)", cfg.PublishedRules, want)
	}
	if got := published(); got != "default: direct\n" {
		t.Fatalf("published at start: %q", got)
	}

	// A bad file keeps the live rules and reports why.
	os.WriteFile(cfg.Rules, []byte("default: sideways\n"), 0o644)
	var he *api.HTTPError
	if err := c.Call(ctx, http.MethodPost, "/v1/reload", nil, nil); !errors.As(err, &he) || he.Status != http.StatusUnprocessableEntity {
		t.Fatalf("reload of a bad file = %v, want 422", err)
	}
	bad := status().Rules
	if bad.Hash != first.Hash || bad.LastErrorCode != "E_BAD_ACTION" || bad.LastError == "" || bad.LastErrorAt.IsZero() {
		t.Errorf("status after a bad reload = %+v", bad)
	}
	// Status shows the code and the path beside the error: the error says neither again.
	if strings.Contains(bad.LastError, "E_BAD_ACTION") || strings.Contains(bad.LastError, cfg.Rules) {
		t.Errorf("status error %q repeats the code or the path", bad.LastError)
	}
	if got := published(); got != "default: direct\n" {
		t.Errorf("a file that failed to load was published: %q", got)
	}

	// A good file, delivered by SIGHUP, replaces them and clears the error.
	os.WriteFile(cfg.Rules, []byte("default: deny\n"), 0o644)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := status().Rules
		if r.Hash != first.Hash {
			if r.LastError != "" || r.LastErrorCode != "" {
				t.Errorf("error not cleared by a good reload: %+v", r)
			}
			if got := published(); got != "default: deny\n" {
				t.Errorf("published after a good reload: %q", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP did not reload the rules")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestBuildExits(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Exits = map[string]config.Upstream{"egress-b": {URL: "socks5://127.0.0.1:1080"}}
	cfg.Proxy = &config.Upstream{URL: "http://127.0.0.1:3128"}
	if err := cfg.Fill(); err != nil {
		t.Fatal(err)
	}
	exits, ups, err := buildExits(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(ups) != 2 || ups["proxy"].Addr() != "127.0.0.1:3128" || ups["egress-b"].Addr() != "127.0.0.1:1080" {
		t.Errorf("upstreams = %v, want proxy and egress-b", ups)
	}
	if _, ok := exits["gateway"]; ok {
		t.Error("gateway exit without the operator's opt-in")
	}
	if exits["proxy"] == nil || exits["egress-b"] == nil {
		t.Errorf("exits = %v", exits)
	}
	cfg.Gateway = true
	exits, _, _ = buildExits(cfg)
	gw := exits["gateway"]
	if gw == nil {
		t.Fatal("no gateway exit with KL_EGRESS_GATEWAY=1")
	}
	// The gateway dials from the daemon's own netns: here a test netns with a network
	// address, entered by this goroutine's thread as the daemon's would be its own.
	ns := testutil.NewNetns(t, "klgw")
	ns.Exec(t, "ip", "link", "set", "lo", "up")
	ns.Exec(t, "ip", "addr", "add", "192.0.2.1/32", "dev", "lo")
	err = netns.Do(ns.Path, func() error {
		ln, err := net.Listen("tcp", ":0")
		if err != nil {
			return err
		}
		defer ln.Close()
		port := uint16(ln.Addr().(*net.TCPAddr).Port)
		w := &api.Workload{Netns: "/nonexistent"}
		c, err := gw(context.Background(), w, relay.Dest{Addr: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), port), Port: port})
		if err != nil {
			return fmt.Errorf("gateway dial from the daemon's own netns: %w", err)
		}
		c.Close()
		// Nothing on the node itself, by address or by a name that resolves to it, though
		// the listener answers on every one of these addresses.
		for _, dst := range []relay.Dest{
			{Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), Port: port},
			{Addr: netip.AddrPortFrom(netip.MustParseAddr("::1"), port), Port: port},
			{Addr: netip.AddrPortFrom(netip.MustParseAddr("::ffff:127.0.0.1"), port), Port: port},
			{Addr: netip.AddrPortFrom(netip.MustParseAddr("0.0.0.0"), port), Port: port},
			{Addr: netip.AddrPortFrom(netip.MustParseAddr("169.254.169.254"), port), Port: port},
			{Host: "localhost", Port: port},
		} {
			c, err := gw(context.Background(), w, dst)
			if err == nil {
				c.Close()
				t.Errorf("gateway dial to %v/%q went through", dst.Addr, dst.Host)
				continue
			}
			if !errors.Is(err, errOnNode) {
				t.Errorf("gateway dial to %v/%q: %v, want the on-node refusal", dst.Addr, dst.Host, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Metrics = "127.0.0.1:" + itoa(freePort(t))
	c, _ := start(t, cfg)
	os.WriteFile(cfg.Rules, []byte("default: sideways\n"), 0o644)
	c.Call(context.Background(), http.MethodPost, "/v1/reload", nil, nil)
	resp, err := http.Get("http://" + cfg.Metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`kl_rules_reloads_total{code="",result="ok"} 1`, `kl_rules_reloads_total{code="E_BAD_ACTION",result="error"} 1`, "\nkl_audit_records_dropped_total 0\n"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s:\n%s", want, body)
		}
	}
}

func TestWatchReloads(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	// A ConfigMap-style mount: rules.yaml -> ..data/rules.yaml, ..data -> ..v1.
	for _, v := range []string{"..v1", "..v2", "..v3"} {
		os.Mkdir(filepath.Join(dir, v), 0o755)
	}
	os.WriteFile(filepath.Join(dir, "..v1", "rules.yaml"), []byte("default: direct\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "..v2", "rules.yaml"), []byte("default: deny\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "..v3", "rules.yaml"), []byte("default: sideways\n"), 0o644)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink("..v1", filepath.Join(dir, "..data")))
	cfg.Rules = filepath.Join(dir, "rules.yaml")
	os.Remove(cfg.Rules)
	must(os.Symlink("..data/rules.yaml", cfg.Rules))
	cfg.RulesPoll = time.Hour // notifications alone must do it
	c, _ := start(t, cfg)
	status := func() api.RulesStatus {
		var st api.Status
		if err := c.Call(context.Background(), http.MethodGet, "/v1/status", nil, &st); err != nil {
			t.Fatal(err)
		}
		return st.Rules
	}
	swap := func(to string) {
		tmp := filepath.Join(dir, "..data_tmp")
		must(os.Symlink(to, tmp))
		must(os.Rename(tmp, filepath.Join(dir, "..data")))
	}
	waitFor := func(what string, ok func(api.RulesStatus) bool) api.RulesStatus {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			r := status()
			if ok(r) {
				return r
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: status %+v", what, r)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	first := status()
	swap("..v2")
	second := waitFor("symlink swap", func(r api.RulesStatus) bool { return r.Hash != first.Hash })
	swap("..v3")
	bad := waitFor("bad file", func(r api.RulesStatus) bool { return r.LastErrorCode != "" })
	if bad.Hash != second.Hash || bad.LastErrorCode != "E_BAD_ACTION" {
		t.Errorf("bad file replaced the live rules or lost its code: %+v", bad)
	}
	swap("..v2")
	waitFor("revert to the live content clears the error", func(r api.RulesStatus) bool {
		return r.LastErrorCode == "" && r.Hash == second.Hash
	})
}

func TestPollReloads(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.RulesPoll = 50 * time.Millisecond
	c, _ := start(t, cfg)
	var before, after api.Status
	c.Call(context.Background(), http.MethodGet, "/v1/status", nil, &before)
	os.WriteFile(cfg.Rules, []byte("default: deny\n"), 0o644)
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.Call(context.Background(), http.MethodGet, "/v1/status", nil, &after)
		if after.Rules.Hash != before.Rules.Hash || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if after.Rules.Hash == before.Rules.Hash {
		t.Error("changed rules file not reloaded")
	}
}

func TestWatchdogInterval(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	for _, tc := range []struct {
		name, usec, pid, sock string
		want                  time.Duration
		err                   bool
	}{
		{name: "not asked", sock: "/run/notify"},
		{name: "no notify socket", usec: "30000000"},
		{name: "half of usec", usec: "30000000", sock: "/run/notify", want: 15 * time.Second},
		{name: "our pid", usec: "2000000", pid: pid, sock: "/run/notify", want: time.Second},
		{name: "another pid", usec: "2000000", pid: "1", sock: "/run/notify"},
		{name: "bad usec", usec: "30s", sock: "/run/notify", err: true},
		{name: "zero usec", usec: "0", sock: "/run/notify", err: true},
		{name: "bad pid", usec: "2000000", pid: "x", sock: "/run/notify", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("WATCHDOG_USEC", tc.usec)
			t.Setenv("WATCHDOG_PID", tc.pid)
			t.Setenv("NOTIFY_SOCKET", tc.sock)
			got, err := watchdogInterval()
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("watchdogInterval() = %v, %v; want %v, error %v", got, err, tc.want, tc.err)
			}
		})
	}
}

// notifySocket is a fake systemd notification socket, named in NOTIFY_SOCKET for the test.
func notifySocket(t *testing.T) *net.UnixConn {
	t.Helper()
	p := filepath.Join(t.TempDir(), "notify")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: p, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	t.Setenv("NOTIFY_SOCKET", p)
	return ln
}

// notifications reads datagrams from a fake NOTIFY_SOCKET until d has passed.
func notifications(t *testing.T, ln *net.UnixConn, d time.Duration) []string {
	t.Helper()
	var got []string
	buf := make([]byte, 256)
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		ln.SetReadDeadline(end)
		n, err := ln.Read(buf)
		if err != nil {
			break
		}
		got = append(got, string(buf[:n]))
	}
	return got
}

func TestWatchdogPings(t *testing.T) {
	ln := notifySocket(t)
	t.Setenv("WATCHDOG_USEC", "200000") // keep-alives every 100ms
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	cfg := testConfig(t, t.TempDir())
	_, stop := start(t, cfg)
	got := notifications(t, ln, 700*time.Millisecond)
	if len(got) == 0 || got[0] != "READY=1" {
		t.Fatalf("first notification: %q, want READY=1 first", got)
	}
	pings := 0
	for _, s := range got[1:] {
		if s != "WATCHDOG=1" {
			t.Errorf("unexpected notification %q", s)
		}
		pings++
	}
	// 700ms at 100ms: about 6; a loaded machine may drop a tick or two.
	if pings < 3 || pings > 8 {
		t.Errorf("%d WATCHDOG=1 in 700ms at a 100ms interval: %q", pings, got)
	}
	stop()
	after := notifications(t, ln, 300*time.Millisecond)
	if len(after) != 1 || after[0] != "STOPPING=1" {
		t.Errorf("after stop: %q, want only STOPPING=1", after)
	}
}

func TestWatchdogWithholdsWhenUnhealthy(t *testing.T) {
	ln := notifySocket(t)
	var healthy atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchdog(ctx, 50*time.Millisecond, func(context.Context) error {
			if healthy.Load() {
				return nil
			}
			return errors.New("wedged")
		}, slog.New(slog.DiscardHandler))
	}()
	if got := notifications(t, ln, 300*time.Millisecond); len(got) != 0 {
		t.Errorf("unhealthy daemon sent %q", got)
	}
	healthy.Store(true)
	if got := notifications(t, ln, 300*time.Millisecond); len(got) < 2 {
		t.Errorf("healthy daemon sent %q, want keep-alives", got)
	}
	cancel()
	<-done
}

// A SIGHUP that comes while kl-relayd starts (systemctl reload right after start) neither
// kills it nor is lost: the daemon comes up and then reloads. Restoring blocks on a
// registration file that is a FIFO until the test has sent the signal, so the signal
// lands while restore runs, before the daemon is ready. The daemon runs as a child
// process, as kl-relayd's main runs it, since the default action would end the process.
func TestHUPDuringStartup(t *testing.T) {
	if settings := os.Getenv("KL_TEST_RELAYD_SETTINGS"); settings != "" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		if err := run(ctx, []string{"kl-relayd", "--settings", settings}, io.Discard, os.Stderr); err != nil {
			t.Fatal(err)
		}
		return
	}
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte("default: direct\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "relayd.sock")
	settings := filepath.Join(dir, "relayd.yaml")
	// rulesPoll is long and the file changes before the watcher starts: only the
	// signal can reload it.
	if err := os.WriteFile(settings, []byte(fmt.Sprintf("socket: %s\nstateDir: %s\nrules: %s\npublishedRules: \"-\"\nrulesPoll: 1h\nnoFastPath: true\nredirectPort: %d\n",
		socket, filepath.Join(dir, "state"), rulesPath, freePort(t))), 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "state", "workloads", "slow.json")
	if err := os.MkdirAll(filepath.Dir(fifo), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	cmd := exec.Command(os.Args[0], "-test.run=^TestHUPDuringStartup$")
	cmd.Env = append(os.Environ(), "KL_TEST_RELAYD_SETTINGS="+settings)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	alive := func(what string) {
		t.Helper()
		select {
		case <-exited:
			t.Fatalf("kl-relayd exited %s: %v\n%s", what, waitErr, out.String())
		default:
		}
	}

	// Opening the FIFO for writing succeeds once restore has opened it for reading.
	var w *os.File
	for deadline := time.Now().Add(10 * time.Second); ; {
		f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			w = f
			break
		}
		if !errors.Is(err, syscall.ENXIO) {
			t.Fatal(err)
		}
		alive("before restoring")
		if time.Now().After(deadline) {
			t.Fatalf("kl-relayd never read its registrations\n%s", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	reloaded := []byte("default: deny\n")
	if err := os.WriteFile(rulesPath, reloaded, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the signal's default action would be done by now
	alive("on a SIGHUP while restoring")
	w.WriteString("not a registration")
	w.Close()

	sum := sha256.Sum256(reloaded)
	want := hex.EncodeToString(sum[:])
	c := api.NewClient(socket, 2*time.Second)
	for deadline := time.Now().Add(10 * time.Second); ; {
		var st api.Status
		err := c.Call(context.Background(), http.MethodGet, "/v1/status", nil, &st)
		if err == nil && st.Ready && st.Rules.Hash == want {
			break
		}
		alive("after restoring")
		if time.Now().After(deadline) {
			t.Fatalf("rules not reloaded after the early SIGHUP: status %+v, %v\n%s", st.Rules, err, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
