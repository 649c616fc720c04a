package ctl

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/config"
	"github.com/kl-egress/kl/relayd/daemon"
)

var t0 = time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)

// fakeDaemon serves GET /v1/status and GET /v1/workloads with the real api types on a
// unix socket under a temporary directory, and returns the socket's path.
func fakeDaemon(t *testing.T, st api.Status, regs []api.Registration) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "klctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "relayd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	reply := func(v any) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(v)
		}
	}
	mux.HandleFunc("GET /v1/status", reply(st))
	mux.HandleFunc("GET /v1/workloads", reply(regs))
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func sampleStatus() (api.Status, []api.Registration) {
	st := api.Status{
		Ready:     true,
		StartedAt: t0.Add(-26 * time.Hour),
		Rules: api.RulesStatus{
			Path:     "/etc/kl/rules/rules.yaml",
			Hash:     "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
			LoadedAt: t0.Add(-3 * time.Hour),
		},
		Workloads:  2,
		Flows:      api.FlowStats{Active: 3, Total: 1207, ByExit: map[string]uint64{"direct": 1100, "proxy": 100, "deny": 6, "refused": 1}},
		FDs:        41,
		FDLimit:    1048576,
		Goroutines: 57,
		Hits: []api.RuleHit{
			{Rule: 3, Dimension: "cidr", Count: 1100},
			{Rule: 0, Dimension: "default", Count: 100},
			{Rule: 1, Dimension: "image", Count: 6},
			{Rule: 0, Dimension: "cidr", Count: 1},
		},
		Recent: []api.Decision{
			{At: t0.Add(-2 * time.Second), Rule: 3, Priority: 500, Dimension: "cidr", Exit: "direct", Note: "cluster ranges", Path: "kernel"},
			{At: t0.Add(-time.Second), Rule: 0, Dimension: "default", Exit: "proxy", Path: "relay"},
			{At: t0.Add(-500 * time.Millisecond), Rule: 1, Priority: 200, Dimension: "image", Exit: "deny", Note: "no builder egress", Reason: "E_UPSTREAM_DOWN", Path: "relay"},
		},
	}
	st.FastPath = true
	st.Kernel = []api.KernelStatus{
		{ID: "4f1c2b3a9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a", Share: 0.75, Entries: 4, KernelEntries: 3, Flows: 1100, Lost: 2, Overruns: 1, Late: 4, Unknown: 5, Generation: 3, Policy: st.Rules.Hash},
		{ID: "web", Share: 1, Entries: 1, KernelEntries: 1, AllKernel: true, Flows: 1, Generation: 1, Policy: st.Rules.Hash},
		{ID: "stale", Error: "install nftables table inet kl: no such file or directory"},
	}
	st.KernelHits = []api.RuleHit{{Rule: 3, Dimension: "cidr", Count: 1100}}
	st.Attach = []api.AttachSession{{ID: "s-7f3a", Credential: "alice", Remote: "198.51.100.7:51234", Scope: "kl.route=client",
		Since: t0.Add(-10 * time.Minute), Policy: st.Rules.Hash, Flows: 42, Refused: 1}}
	st.Audit = &api.AuditStatus{Path: "/var/log/kl/audit.jsonl", Dropped: 12,
		Error: "audit: write /var/log/kl/audit.jsonl: no space left on device"}
	regs := []api.Registration{
		{Workload: api.Workload{ID: "4f1c2b3a9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a", Netns: "/var/run/netns/cni-1234", Mode: "transparent", Source: "cni", Namespace: "ci", Name: "builder-7", Addrs: []netip.Addr{netip.MustParseAddr("10.244.1.7")}},
			Listeners: api.Listeners{Redirect: 15001}, Since: t0.Add(-time.Hour)},
		{Workload: api.Workload{ID: "abc", Netns: "/proc/4242/ns/net", Mode: "proxy", Source: "hook"},
			Listeners: api.Listeners{Redirect: 15001, HTTP: 15080, SOCKS: 15081}, Since: t0.Add(-90 * time.Second)},
	}
	return st, regs
}

// TestStatus runs kl-ctl status against a fake daemon and compares with golden files.
func TestStatus(t *testing.T) {
	now = func() time.Time { return t0 }
	defer func() { now = time.Now }()

	ok, regs := sampleStatus()
	refused := ok
	refused.Rules.LastError = "rules.yaml:12: rule 4: exit \"gateway\" needs KL_EGRESS_GATEWAY=1"
	refused.Rules.LastErrorCode = "E_GATEWAY_DISABLED"
	refused.Rules.LastErrorAt = t0.Add(-10 * time.Minute)
	refused.Audit = &api.AuditStatus{Path: "/var/log/kl/audit.jsonl"}
	notReady := api.Status{StartedAt: t0.Add(-2 * time.Second), Rules: api.RulesStatus{Path: "/etc/kl/rules.yaml"}, FDs: 9, FDLimit: 1024, Goroutines: 8}
	empty := api.Status{Ready: true, StartedAt: t0.Add(-time.Minute), Rules: api.RulesStatus{Path: "/etc/kl/rules.yaml", Hash: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", LoadedAt: t0.Add(-time.Minute)}, FDs: 12, FDLimit: 1024, Goroutines: 10,
		Audit: &api.AuditStatus{}}

	tests := []struct {
		name string
		st   *api.Status // nil: no daemon at the socket
		regs []api.Registration
		args []string
	}{
		{"status", &ok, regs, nil},
		{"status-json", &ok, regs, []string{"--json"}},
		{"status-refused-load", &refused, regs, nil},
		{"status-empty", &empty, nil, nil},
		{"status-not-ready", &notReady, nil, nil},
		{"status-unreachable", nil, nil, nil},
		{"status-extra-arg", nil, nil, []string{"now"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sock string
			if tt.st != nil {
				sock = fakeDaemon(t, *tt.st, tt.regs)
			} else {
				sock = filepath.Join(t.TempDir(), "relayd.sock")
			}
			args := append([]string{"status", "--socket", sock}, tt.args...)
			var stdout, stderr bytes.Buffer
			env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
			err := RunEnv(context.Background(), env, append([]string{"kl-ctl"}, args...))
			got := fmt.Sprintf("$ kl-ctl %s\nexit status %d\n--- stdout\n%s--- stderr\n%s", strings.Join(args, " "), ExitStatus(err), stdout.String(), stderr.String())
			got = strings.ReplaceAll(got, sock, "SOCKET")
			checkGolden(t, tt.name, got)
		})
	}
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	golden := filepath.Join("testdata", "golden", name+".golden")
	if os.Getenv("KL_UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with KL_UPDATE_GOLDEN=1 to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s:\n%s\nwant:\n%s", name, got, want)
	}
}

// TestStatusJSONRoundTrip: --json prints exactly the daemon's status object.
func TestStatusJSONRoundTrip(t *testing.T) {
	st, regs := sampleStatus()
	sock := fakeDaemon(t, st, regs)
	var stdout, stderr bytes.Buffer
	env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
	if err := RunEnv(context.Background(), env, []string{"kl-ctl", "status", "--json", "--socket", sock}); err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	var got api.Status
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(st)
	b, _ := json.Marshal(got)
	if !bytes.Equal(a, b) {
		t.Errorf("round trip:\n%s\nwant\n%s", b, a)
	}
}

// TestStatusRealDaemon runs kl-relayd's daemon in process (no workloads: nothing needs
// root) and checks that status shows its rules as they were loaded.
func TestStatusRealDaemon(t *testing.T) {
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	src := []byte("default: direct\n")
	if err := os.WriteFile(rulesPath, src, 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	sockDir, err := os.MkdirTemp("", "klctl")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	cfg := &config.Config{Socket: filepath.Join(sockDir, "relayd.sock"), StateDir: filepath.Join(dir, "state"), Rules: rulesPath, RedirectPort: port}
	cfg.Audit.Path = filepath.Join(dir, "audit.jsonl")
	if err := cfg.Fill(); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	d, err := daemon.New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve = %v; logs:\n%s", err, logs.String())
		}
	}()
	c := api.NewClient(cfg.Socket, 2*time.Second)
	for deadline := time.Now().Add(5 * time.Second); c.Ping(ctx) != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("daemon not ready; logs:\n%s", logs.String())
		}
	}
	var stdout, stderr bytes.Buffer
	env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
	if err := RunEnv(ctx, env, []string{"kl-ctl", "status", "--socket", cfg.Socket}); err != nil {
		t.Fatalf("status: %v\n%s", err, stderr.String())
	}
	sum := sha256.Sum256(src)
	for _, want := range []string{"ready, up", "path     " + rulesPath, "sha256   " + hex.EncodeToString(sum[:]), "last load error: none", "workloads: 0 registered",
		"audit file: " + cfg.Audit.Path + ", 0 records not written since start"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, stdout.String())
		}
	}
}

// A daemon socket that answers 200 with nothing, or null, is no status: kl-ctl says so
// rather than printing a zero status as a daemon that is restoring.
func TestStatusEmptyAnswer(t *testing.T) {
	for _, body := range []string{"", "null", " \n"} {
		sock := filepath.Join(t.TempDir(), "relayd.sock")
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) })}
		go srv.Serve(ln)
		var stdout, stderr bytes.Buffer
		env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
		err = RunEnv(context.Background(), env, []string{"kl-ctl", "status", "--socket", sock})
		srv.Close()
		if ExitStatus(err) != 1 || !strings.Contains(stderr.String(), "want a JSON answer") || strings.Contains(stdout.String(), "NOT READY") {
			t.Errorf("status against a daemon answering %q: exit %d\nstdout: %s\nstderr: %s", body, ExitStatus(err), stdout.String(), stderr.String())
		}
	}
}
