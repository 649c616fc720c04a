package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/publish"
	"github.com/kl-egress/kl/tests/testutil"
)

// Registrations that would not bring the pod's connections to this daemon, or name no
// pod network namespace, are refused before anything is installed or opened.
func TestRegisterRefusesForeignCapture(t *testing.T) {
	testutil.RequirePrivileged(t)
	cfg := testConfig(t, t.TempDir())
	c, _ := start(t, cfg)
	pod := testutil.NewNetns(t, "klcap")
	good := func() *api.Capture { return &api.Capture{RedirectPort: cfg.RedirectPort, Mark: cfg.Mark} }
	for _, tt := range []struct {
		name  string
		netns string
		cap   func() *api.Capture
		want  string
	}{
		{"mount namespace", "/proc/self/ns/mnt", nil, "not a network namespace"},
		{"another mark", pod.Path, func() *api.Capture { c := good(); c.Mark++; return c }, "capture mark"},
		{"another redirect port", pod.Path, func() *api.Capture { c := good(); c.RedirectPort++; return c }, "capture redirect port"},
		{"bad exclusion", pod.Path, func() *api.Capture {
			c := good()
			c.ExcludeCIDRs = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}
			return c
		}, "capture"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := api.Workload{ID: "pod1", Netns: tt.netns, Mode: api.ModeTransparent, Source: "cni"}
			if tt.cap != nil {
				w.Capture = tt.cap()
			}
			_, err := c.Register(context.Background(), w)
			var he *api.HTTPError
			if !errors.As(err, &he) || he.Status != http.StatusBadRequest || !strings.Contains(he.Msg, tt.want) {
				t.Fatalf("Register = %v, want 400 mentioning %q", err, tt.want)
			}
			if _, err := netns.Installed(pod.Path); err == nil {
				t.Error("a refused registration installed a capture table")
			}
			if list, _ := c.List(context.Background()); len(list) != 0 {
				t.Errorf("a refused registration is listed: %+v", list)
			}
		})
	}
}

// The daemon's own netns is never given a capture table. The daemon is told a test netns
// is its own, so a broken check could only ever capture that one.
func TestRegisterRefusesDaemonNetns(t *testing.T) {
	testutil.RequirePrivileged(t)
	cfg := testConfig(t, t.TempDir())
	d, err := New(cfg, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer d.shutdown(nil)
	pod := testutil.NewNetns(t, "klhost")
	dev, ino, err := netnsID(pod.Path)
	if err != nil {
		t.Fatal(err)
	}
	d.hostNetns = [2]uint64{dev, ino}
	w := api.Workload{ID: "pod1", Netns: pod.Path, Mode: api.ModeTransparent, Source: "cni",
		Capture: &api.Capture{RedirectPort: cfg.RedirectPort, Mark: cfg.Mark}}
	if _, err := d.Register(w); err == nil || !strings.Contains(err.Error(), "the daemon's own") {
		t.Fatalf("Register in the daemon's netns = %v, want a refusal", err)
	}
	if _, err := netns.Installed(pod.Path); err == nil {
		t.Error("the daemon's own netns got a capture table")
	}
}

// A second kl-relayd on the same state stops before it changes anything of the running
// one's: its saved registrations and the rules published to containers stay.
func TestSecondDaemonLeavesStateAlone(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	c, _ := start(t, cfg)
	if _, err := c.Register(context.Background(), self()); err != nil {
		t.Fatal(err)
	}
	published, err := publish.Read(cfg.PublishedRules)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.Rules, []byte("default: deny\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if d2, err := New(cfg, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))); err == nil {
		d2.shutdown(nil)
		t.Fatal("a second daemon on the same state directory started")
	} else if !strings.Contains(err.Error(), "another kl-relayd") || !strings.Contains(err.Error(), fmt.Sprint(os.Getpid())) {
		t.Errorf("second daemon: %v, want one naming the running daemon's pid", err)
	}
	if ents, _ := mustStore(t, cfg).Load(); len(ents) != 1 {
		t.Errorf("saved registrations after a second daemon: %d, want the running one's 1", len(ents))
	}
	if now, err := publish.Read(cfg.PublishedRules); err != nil || !bytes.Equal(now, published) {
		t.Errorf("published rules after a second daemon = %q %v, want %q", now, err, published)
	}
	if !listening(cfg.RedirectPort) {
		t.Error("the running daemon's listener is gone")
	}
}

// A refresh refused after the id's listeners were closed (here: proxy mode, whose port
// the app already holds) leaves nothing listed or saved under the id, instead of a
// registration with no listener behind it.
func TestRefusedRefreshDropsClosedRegistration(t *testing.T) {
	testutil.RequirePrivileged(t)
	cfg := testConfig(t, t.TempDir())
	c, _ := start(t, cfg)
	pod := testutil.NewNetns(t, "klref")
	w := api.Workload{ID: "pod1", Netns: pod.Path, Mode: api.ModeTransparent, Source: "cni"}
	if _, err := c.Register(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	ln, err := netns.Listen(pod.Path, "tcp", fmt.Sprintf("127.0.0.1:%d", cfg.HTTPPort))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	w.Mode = api.ModeProxy
	if _, err := c.Register(context.Background(), w); err == nil {
		t.Fatal("proxy mode registered although its port is taken")
	}
	if list, _ := c.List(context.Background()); len(list) != 0 {
		t.Errorf("after a refused refresh, listed: %+v", list)
	}
	if ents, _ := mustStore(t, cfg).Load(); len(ents) != 0 {
		t.Errorf("after a refused refresh, saved: %+v", ents)
	}
}

// A refused refresh that changed nothing keeps the registration it refreshes.
func TestRefusedRefreshKeepsLiveRegistration(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	c, _ := start(t, cfg)
	if _, err := c.Register(context.Background(), self()); err != nil {
		t.Fatal(err)
	}
	w := self()
	w.Capture = &api.Capture{RedirectPort: cfg.RedirectPort, Mark: cfg.Mark + 1}
	if _, err := c.Register(context.Background(), w); err == nil {
		t.Fatal("a foreign mark was accepted")
	}
	if list, _ := c.List(context.Background()); len(list) != 1 || !listening(cfg.RedirectPort) {
		t.Errorf("after a refused refresh: listed %+v, listening %v; want the live one kept", list, listening(cfg.RedirectPort))
	}
}

// A restart with a broken rules file runs the last rules that loaded (published under
// /run) and says why in status, rather than refusing to start and failing every pod.
func TestStartOnLastGoodRules(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	c, stop := start(t, cfg)
	before := statusOf(t, c).Rules
	stop()
	if err := os.WriteFile(cfg.Rules, []byte("default: sideways\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, _ = start(t, cfg)
	r := statusOf(t, c).Rules
	if r.Hash != before.Hash || r.LastErrorCode != "E_BAD_ACTION" || !strings.Contains(r.LastError, cfg.PublishedRules) {
		t.Fatalf("status after a start on a broken file = %+v, want the last good hash %s and E_BAD_ACTION", r, before.Hash)
	}
	if err := os.WriteFile(cfg.Rules, []byte("default: deny\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Call(context.Background(), http.MethodPost, "/v1/reload", nil, nil); err != nil {
		t.Fatal(err)
	}
	if r := statusOf(t, c).Rules; r.Hash == before.Hash || r.LastError != "" {
		t.Errorf("after the file was fixed: %+v", r)
	}
}

func statusOf(t *testing.T, c *api.Client) api.Status {
	t.Helper()
	var st api.Status
	if err := c.Call(context.Background(), http.MethodGet, "/v1/status", nil, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// An unreadable rules file is reported once, not at every poll.
func TestWatchReportsMissingFileOnce(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.RulesPoll = 20 * time.Millisecond
	c, _ := start(t, cfg)
	if err := os.Remove(cfg.Rules); err != nil {
		t.Fatal(err)
	}
	seen := map[time.Time]bool{}
	deadline := time.Now().Add(600 * time.Millisecond)
	for time.Now().Before(deadline) {
		if r := statusOf(t, c).Rules; r.LastErrorCode != "" {
			seen[r.LastErrorAt] = true
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(seen) != 1 {
		t.Errorf("a missing rules file failed %d reloads in 0.6 s of 20 ms polls, want 1", len(seen))
	}
}

// Notifications follow a ConfigMap mounted in another directory than the rules path,
// swap after swap: the watched directories move with the `..data` link.
func TestWatchFollowsConfigMapElsewhere(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cm := filepath.Join(dir, "cm")
	for i, v := range []string{"..v1", "..v2", "..v3"} {
		if err := os.MkdirAll(filepath.Join(cm, v), 0o755); err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf("# %s\ndefault: %s\n", v, []string{"direct", "deny", "direct"}[i])
		if err := os.WriteFile(filepath.Join(cm, v, "rules.yaml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink("..v1", filepath.Join(cm, "..data")))
	must(os.Symlink("..data/rules.yaml", filepath.Join(cm, "rules.yaml")))
	must(os.Remove(cfg.Rules))
	must(os.Symlink(filepath.Join(cm, "rules.yaml"), cfg.Rules))
	cfg.RulesPoll = time.Hour // notifications alone must do it
	cfg.PublishedRules = "-"  // publishing writes next to the rules path; its events would hide a missed swap
	c, _ := start(t, cfg)
	last := statusOf(t, c).Rules.Hash
	for _, v := range []string{"..v2", "..v3"} {
		tmp := filepath.Join(cm, "..data_tmp")
		must(os.Symlink(v, tmp))
		must(os.Rename(tmp, filepath.Join(cm, "..data")))
		deadline := time.Now().Add(3 * time.Second)
		for statusOf(t, c).Rules.Hash == last {
			if time.Now().After(deadline) {
				t.Fatalf("swap to %s not seen by notifications", v)
			}
			time.Sleep(20 * time.Millisecond)
		}
		last = statusOf(t, c).Rules.Hash
		must(os.RemoveAll(filepath.Join(cm, map[string]string{"..v2": "..v1", "..v3": "..v2"}[v]))) // kubelet removes the old version
	}
}

// Reloads asked at once apply in the order they read the file: a slow load of older,
// broken content that finishes last neither replaces the newer rules nor leaves its
// error in status.
func TestConcurrentReloadsKeepNewest(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	c, _ := start(t, cfg)
	var big strings.Builder
	big.WriteString("default: direct\nrules:\n")
	for i := range 40000 {
		fmt.Fprintf(&big, "  - cidr: \"10.%d.%d.0/24\"\n    action: direct\n", i/256%256, i%256)
	}
	big.WriteString("  - cidr: \"192.0.2.0/24\"\n    action: sideways\n")
	if err := os.WriteFile(cfg.Rules, []byte(big.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Call(context.Background(), http.MethodPost, "/v1/reload", nil, nil) })
	time.Sleep(50 * time.Millisecond) // the slow load has read the broken file
	if err := os.WriteFile(cfg.Rules, []byte("default: deny\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Call(context.Background(), http.MethodPost, "/v1/reload", nil, nil); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	sum := sha256.Sum256([]byte("default: deny\n"))
	want := hex.EncodeToString(sum[:])
	if r := statusOf(t, c).Rules; r.Hash != want || r.LastError != "" {
		t.Errorf("after concurrent reloads: %+v, want hash %s and no error", r, want)
	}
}

// A saved registration that a descriptor shortage keeps from being restored stays saved
// and opens at a retry, instead of being dropped as if its pod were gone (the pod's
// capture table would then send its connections to a port nobody listens on until the
// pod is recreated). The shortage is real: the process's descriptor limit is lowered
// below what it has open while restore runs.
func TestRestoreKeepsRegistrationThroughShortage(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	logs := &bytes.Buffer{}
	d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Register(self()); err != nil {
		t.Fatal(err)
	}
	d.shutdown(nil)
	if listening(cfg.RedirectPort) {
		t.Fatal("listener still open after shutdown")
	}
	d, err = New(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer d.shutdown(nil)

	withoutDescriptors(t, func() { d.restore(context.Background()) })
	if ents, _ := mustStore(t, cfg).Load(); len(ents) != 1 {
		t.Fatalf("saved registrations after a restore short of descriptors: %d, want 1 kept; logs:\n%s", len(ents), logs)
	}
	if len(d.Registrations()) != 0 {
		t.Fatalf("registered %d with no descriptor to open; logs:\n%s", len(d.Registrations()), logs)
	}
	d.retryPending()
	if len(d.Registrations()) != 1 || len(d.pending) != 0 {
		t.Fatalf("after the retry: registered %d, pending %d; want 1 and 0; logs:\n%s", len(d.Registrations()), len(d.pending), logs)
	}
	if !listening(cfg.RedirectPort) {
		t.Fatalf("restored registration does not listen: %v", lastDialErr)
	}
}

// withoutDescriptors runs fn with the process's descriptor limit below every descriptor
// but stdin, stdout and stderr: no open can get one, whatever closes meanwhile.
func withoutDescriptors(t *testing.T, fn func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	short := old
	short.Cur = 3
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &short); err != nil {
		t.Fatal(err)
	}
	fn()
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
}

// The reaper takes a descriptor shortage for what it is, not for a netns that is gone.
func TestSweepKeepsRegistrationThroughShortage(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	d, err := New(cfg, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer d.shutdown(nil)
	if _, err := d.Register(self()); err != nil {
		t.Fatal(err)
	}
	withoutDescriptors(t, func() { d.sweep(d.sweep(nil)) })
	if len(d.Registrations()) != 1 {
		t.Fatal("two sweeps short of descriptors dropped a live registration")
	}
}

// Hit counts are per rules: after other rules load, rule numbers name other rules, so
// the counts start again (and say since when); reloading the same rules keeps them.
func TestHitsStartAgainWithOtherRules(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	if err := os.WriteFile(cfg.Rules, []byte("default: direct\nrules:\n  - image: builder*\n    action: deny\n  - cidr: 10.0.0.0/8\n    action: direct\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer d.shutdown(nil)
	d.audit.Add(audit.Record{Rule: 1, Dimension: "image", Exit: "deny"})
	d.audit.Add(audit.Record{Rule: 2, Dimension: "cidr", Exit: "direct"})
	first := d.Status()
	if want := []api.RuleHit{{Rule: 1, Dimension: "image", Count: 1}, {Rule: 2, Dimension: "cidr", Count: 1}}; !slices.Equal(first.Hits, want) {
		t.Fatalf("hits = %+v, want %+v", first.Hits, want)
	}
	if err := d.Reload(); err != nil { // the same rules
		t.Fatal(err)
	}
	if s := d.Status(); len(s.Hits) != 2 || !s.HitsSince.Equal(first.HitsSince) {
		t.Errorf("reloading the same rules changed the counts: %+v since %v", s.Hits, s.HitsSince)
	}
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(cfg.Rules, []byte("default: direct\nrules:\n  - label: team=pay\n    action: proxy\n  - image: builder*\n    action: deny\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Reload(); err != nil {
		t.Fatal(err)
	}
	d.audit.Add(audit.Record{Rule: 1, Dimension: "label", Exit: "proxy"})
	s := d.Status()
	if want := []api.RuleHit{{Rule: 1, Dimension: "label", Count: 1}}; !slices.Equal(s.Hits, want) {
		t.Errorf("hits after other rules loaded = %+v, want only the new rule 1's %+v", s.Hits, want)
	}
	if !s.HitsSince.After(first.HitsSince) {
		t.Errorf("hits since %v, want after the first rules' %v", s.HitsSince, first.HitsSince)
	}
}

// A watched rules file grown huge (a runaway generator, a wrong file moved in place) is
// refused without being read: the daemon keeps running on the rules it has.
func TestWatchRefusesHugeFile(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.RulesPoll = 50 * time.Millisecond
	c, _ := start(t, cfg)
	live := statusOf(t, c).Rules.Hash
	if err := os.Truncate(cfg.Rules, 8<<30); err != nil { // sparse: costs no disk
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := statusOf(t, c)
		if s.Rules.LastErrorCode == "E_TOO_LARGE" {
			if s.Rules.Hash != live {
				t.Errorf("rules hash %s after a refused file, want the live %s", s.Rules.Hash, live)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status after the file grew to 8 GiB: %+v; want E_TOO_LARGE and the same rules", s.Rules)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
