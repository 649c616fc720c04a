package hook

import (
	"cmp"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/publish"
	"github.com/kl-egress/kl/shim/config"
)

// fakeRelay keeps registrations as kl-relayd does: it holds each one's netns file open
// (as the relay's listeners hold the netns), and refuses with 409 a registration whose
// netns another one serves, comparing the files themselves, not their paths. Netns paths
// that do not exist (setup's /fakeproc) are not compared.
type fakeRelay struct {
	regs   map[string]api.Registration
	held   map[string]*os.File
	calls  []string
	err    error
	regErr error // Register alone fails
}

func (f *fakeRelay) Register(_ context.Context, w api.Workload) (api.Registration, error) {
	f.calls = append(f.calls, "register "+w.ID)
	if err := cmp.Or(f.err, f.regErr); err != nil {
		return api.Registration{}, err
	}
	if fi, err := os.Stat(w.Netns); err == nil {
		for id, h := range f.held {
			if hi, err := h.Stat(); err == nil && id != w.ID && os.SameFile(hi, fi) {
				return api.Registration{}, &api.HTTPError{Status: 409, Msg: "conflict: netns " + w.Netns + " is already served for workload " + id}
			}
		}
	}
	f.release(w.ID)
	if h, err := os.Open(w.Netns); err == nil {
		if f.held == nil {
			f.held = map[string]*os.File{}
		}
		f.held[w.ID] = h
	}
	r := api.Registration{Workload: w, Listeners: api.Listeners{Redirect: 16001}}
	f.regs[w.ID] = r
	return r, nil
}

func (f *fakeRelay) Deregister(_ context.Context, id string) error {
	f.calls = append(f.calls, "deregister "+id)
	delete(f.regs, id)
	f.release(id)
	return f.err
}

func (f *fakeRelay) release(id string) {
	if h := f.held[id]; h != nil {
		h.Close()
		delete(f.held, id)
	}
}

func (f *fakeRelay) Get(_ context.Context, id string) (api.Registration, bool, error) {
	r, ok := f.regs[id]
	return r, ok, f.err
}

func (f *fakeRelay) List(context.Context) ([]api.Registration, error) {
	var out []api.Registration
	for _, r := range f.regs {
		out = append(out, r)
	}
	return out, f.err
}

// setup fakes /proc: netns files are plain files compared by name through the sameNs seam.
func setup(t *testing.T) (*Hook, *fakeRelay, *netns.Fake) {
	t.Helper()
	fr := &fakeRelay{regs: map[string]api.Registration{}}
	fb := netns.NewFake()
	backend = fb
	procRoot = "/fakeproc"
	hostNet = "/fakeproc/1/ns/net"
	sameNs = func(a, b string) (bool, error) {
		if strings.Contains(a, "gone") || strings.Contains(b, "gone") {
			return false, os.ErrNotExist
		}
		return a == b || (strings.Contains(a, "shared") && strings.Contains(b, "/100/")), nil
	}
	lookup = func(*config.Config) workloadLookup { return nil }
	t.Cleanup(func() {
		backend, procRoot, hostNet, sameNs = nil, "/proc", "/proc/self/ns/net", netns.SameNetns
		for id := range fr.held {
			fr.release(id)
		}
	})
	cfg := &config.Config{Hook: "/x/kl-hook", Rules: "-"}
	if err := cfg.Default(); err != nil {
		t.Fatal(err)
	}
	return &Hook{Config: cfg, Relay: fr, Log: config.Discard(), Shares: t.TempDir()}, fr, fb
}

func TestCreate(t *testing.T) {
	tests := []struct {
		name      string
		st        State
		mode      string
		existing  []api.Workload
		wantReg   bool
		wantTable bool
	}{
		{name: "transparent", st: State{ID: "c1", Pid: 42}, mode: "transparent", wantReg: true, wantTable: true},
		{name: "proxy: no table", st: State{ID: "c1", Pid: 42}, mode: "proxy", wantReg: true},
		{name: "mode from annotation", st: State{ID: "c1", Pid: 42, Annotations: map[string]string{"kl.egress.mode": "proxy"}}, wantReg: true},
		{name: "env: nothing", st: State{ID: "c1", Pid: 42}, mode: "env"},
		{name: "host network", st: State{ID: "c1", Pid: 1}, mode: "transparent"},
		{name: "netns already registered by cni", st: State{ID: "c1", Pid: 100}, mode: "transparent",
			existing: []api.Workload{{ID: "gone", Netns: "/var/run/netns/gone"}, {ID: "sandbox", Netns: "/var/run/netns/shared", Mode: "transparent", Source: "cni"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, fr, fb := setup(t)
			for _, w := range tt.existing {
				fr.regs[w.ID] = api.Registration{Workload: w}
			}
			if err := h.Create(context.Background(), tt.st, tt.mode); err != nil {
				t.Fatal(err)
			}
			reg, ok := fr.regs[tt.st.ID]
			if ok != tt.wantReg {
				t.Fatalf("registered = %v, want %v (calls %q)", ok, tt.wantReg, fr.calls)
			}
			if ok && (reg.Workload.Source != "hook" || reg.Workload.Netns != "/fakeproc/"+itoa(tt.st.Pid)+"/ns/net") {
				t.Errorf("registration = %+v", reg.Workload)
			}
			tbl, _ := fb.Get("/fakeproc/"+itoa(tt.st.Pid)+"/ns/net", netns.TableName)
			if (tbl != nil) != tt.wantTable {
				t.Errorf("capture table present = %v, want %v", tbl != nil, tt.wantTable)
			}
			if tt.wantTable {
				want := netns.Capture{RedirectPort: 16001, Mark: api.DefaultMark, IPv6: true, RejectQUIC: true}
				if err := netns.VerifyWith(fb, "/fakeproc/42/ns/net", want); err != nil {
					t.Errorf("capture: %v", err)
				}
			}
		})
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestCreateFailures(t *testing.T) {
	h, fr, _ := setup(t)
	fr.err = api.ErrUnreachable
	err := h.Create(context.Background(), State{ID: "c1", Pid: 42}, "transparent")
	if !errors.Is(err, api.ErrUnreachable) {
		t.Errorf("relay down: %v", err)
	}

	// A capture that cannot be installed rolls the registration back.
	h, fr, _ = setup(t)
	h.Config.Capture.Mark = 0
	h.Config.Capture.RedirectPort = 0
	backend = failBackend{}
	err = h.Create(context.Background(), State{ID: "c1", Pid: 42}, "transparent")
	if err == nil || !strings.Contains(err.Error(), "capture") {
		t.Fatalf("capture failure: %v", err)
	}
	if _, ok := fr.regs["c1"]; ok || !strings.Contains(strings.Join(fr.calls, ","), "deregister c1") {
		t.Errorf("registration not rolled back: %q", fr.calls)
	}
	if err := h.Create(context.Background(), State{ID: "c1"}, "transparent"); !errors.Is(err, ErrBadState) {
		t.Errorf("no pid: %v", err)
	}
}

type failBackend struct{}

func (failBackend) Apply(string, *netns.Table) error {
	return errors.New("nft: operation not permitted")
}
func (failBackend) Delete(string, string) error              { return nil }
func (failBackend) Get(string, string) (*netns.Table, error) { return nil, netns.ErrNoTable }

func TestDelete(t *testing.T) {
	h, fr, _ := setup(t)
	fr.regs["mine"] = api.Registration{Workload: api.Workload{ID: "mine", Source: "hook"}}
	fr.regs["sandbox"] = api.Registration{Workload: api.Workload{ID: "sandbox", Source: "cni"}}
	for _, id := range []string{"mine", "sandbox", "unknown", "mine"} {
		if err := h.Delete(context.Background(), State{ID: id}); err != nil {
			t.Fatalf("Delete(%s): %v", id, err)
		}
	}
	if _, ok := fr.regs["mine"]; ok {
		t.Errorf("own registration kept")
	}
	if _, ok := fr.regs["sandbox"]; !ok {
		t.Errorf("kl-cni's registration removed")
	}
	fr.err = api.ErrUnreachable
	if err := h.Delete(context.Background(), State{ID: "x"}); !errors.Is(err, api.ErrUnreachable) {
		t.Errorf("relay down: %v", err)
	}
}

func TestRunConfigErrors(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "runtime.yaml")
	os.WriteFile(p, []byte("mode: sideways\n"), 0o644)
	err := Run(context.Background(), []string{"kl-hook", "--config", p, "create"}, strings.NewReader(`{"id":"x","pid":1}`))
	if !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), p) {
		t.Errorf("bad config: %v", err)
	}
	err = Run(context.Background(), []string{"kl-hook", "--config", filepath.Join(dir, "none.yaml"), "delete"}, strings.NewReader(`{"id":"x"}`))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing config: %v", err)
	}
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte("default: direct\n"), 0o644)
	hookBin := filepath.Join(dir, "kl-hook")
	os.WriteFile(hookBin, []byte("#!/bin/sh\n"), 0o755)
	p := filepath.Join(dir, "runtime.yaml")
	os.WriteFile(p, []byte("runtime: sh\npublishedRules: "+filepath.Join(dir, "published")+"\nrules: "+rules+"\nhook: "+hookBin+
		"\ndockerSocket: "+filepath.Join(dir, "none.sock")+"\nrelaySocket: "+filepath.Join(dir, "relayd.sock")+"\n"), 0o644)
	fr := &fakeRelay{regs: map[string]api.Registration{"a": {}}}
	newRelay = func(*config.Config) Relay { return fr }
	t.Cleanup(func() {
		newRelay = func(cfg *config.Config) Relay { return api.NewClient(cfg.RelaySocket, cfg.RelayTimeout) }
	})
	var out strings.Builder
	if err := run(context.Background(), []string{"kl-hook", "--config", p, "check"}, nil, &out); err != nil {
		t.Fatalf("check: %v\n%s", err, out.String())
	}
	for _, want := range []string{"ok   runtime  /", "ok   hook     " + hookBin, "warn rules    " + rules, "(1 workloads registered)", "absent or not listening",
		"ok   shares   " + filepath.Join(dir, "hook")} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("check output lacks %q:\n%s", want, out.String())
		}
	}
	// Once kl-relayd published its rules, the directory is what containers get.
	if err := publish.Publish(filepath.Join(dir, "published"), []byte("default: direct\n")); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"kl-hook", "--config", p, "check"}, nil, &out); err != nil {
		t.Fatalf("check: %v\n%s", err, out.String())
	}
	if want := "ok   rules    " + filepath.Join(dir, "published") + " -> /etc/kl (read-only, follows reloads)"; !strings.Contains(out.String(), want) {
		t.Errorf("check output lacks %q:\n%s", want, out.String())
	}
	os.RemoveAll(filepath.Join(dir, "published"))
	fr.err = api.ErrUnreachable
	out.Reset()
	os.Remove(rules)
	err := run(context.Background(), []string{"kl-hook", "--config", p, "check"}, nil, &out)
	if err == nil || !strings.Contains(out.String(), "FAIL relay") || !strings.Contains(out.String(), "FAIL rules") {
		t.Errorf("check with relay down and rules missing: %v\n%s", err, out.String())
	}
}

// TestCheckShares: `kl-hook check` fails, naming the directory, when the share records
// directory beside relaySocket cannot be created or written (every container create
// takes its lock), and only warns with failOpen (creates then go on uncaptured).
func TestCheckShares(t *testing.T) {
	fr := &fakeRelay{regs: map[string]api.Registration{}}
	newRelay = func(*config.Config) Relay { return fr }
	t.Cleanup(func() {
		newRelay = func(cfg *config.Config) Relay { return api.NewClient(cfg.RelaySocket, cfg.RelayTimeout) }
	})
	tests := []struct {
		name     string
		setup    func(dir string) // what is at dir before the check
		failOpen bool
		want     string // the line's start
	}{
		{"created", func(string) {}, false, "ok   shares   "},
		{"already there", func(dir string) { os.MkdirAll(filepath.Join(dir, "run", "hook"), 0o700) }, false, "ok   shares   "},
		{"a file in its place", func(dir string) {
			os.MkdirAll(filepath.Join(dir, "run"), 0o755)
			os.WriteFile(filepath.Join(dir, "run", "hook"), nil, 0o600)
		}, false, "FAIL shares   share records directory "},
		{"its parent is a file", func(dir string) { os.WriteFile(filepath.Join(dir, "run"), nil, 0o600) }, false, "FAIL shares   share records directory "},
		{"not writable, failOpen", func(dir string) { os.WriteFile(filepath.Join(dir, "run"), nil, 0o600) }, true, "warn shares   share records directory "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.setup(dir)
			hookBin := filepath.Join(dir, "kl-hook")
			os.WriteFile(hookBin, []byte("#!/bin/sh\n"), 0o755)
			shares := filepath.Join(dir, "run", "hook")
			p := filepath.Join(dir, "runtime.yaml")
			os.WriteFile(p, []byte("runtime: sh\nrules: \"-\"\ndockerSocket: \"-\"\nhook: "+hookBin+"\nrelaySocket: "+filepath.Join(dir, "run", "relayd.sock")+
				"\nfailOpen: "+strconv.FormatBool(tt.failOpen)+"\n"), 0o644)
			var out strings.Builder
			err := run(context.Background(), []string{"kl-hook", "--config", p, "check"}, nil, &out)
			var line string
			for l := range strings.Lines(out.String()) {
				if strings.Contains(l, " shares ") {
					line = l
				}
			}
			if !strings.HasPrefix(line, tt.want) || !strings.Contains(line, shares) {
				t.Errorf("shares line %q, want it to start %q and name %s:\n%s", line, tt.want, shares, out.String())
			}
			if wantFail := strings.HasPrefix(tt.want, "FAIL"); wantFail != (err != nil) {
				t.Errorf("check = %v, want a failure: %v\n%s", err, wantFail, out.String())
			}
			if strings.HasPrefix(tt.want, "ok") {
				if ents, _ := os.ReadDir(shares); len(ents) != 1 || ents[0].Name() != ".lock" {
					t.Errorf("the check left %v in %s, want only the lock file", ents, shares)
				}
			}
		})
	}
}

// On containerd, kl-cni reads a pod's kl.egress.mode from every pod annotation while
// kl-runtime sees it only when the runtime allow-lists it (pod_annotations). When they
// disagree the hook must not leave the container as it is: a proxy-mode registration has
// no capture table, and a transparent-mode container gets no proxy variables, so its
// traffic would leave direct, unclassified. It fails the start and names both modes.
func TestCreateModeMismatch(t *testing.T) {
	criAnnotations := map[string]string{
		"io.kubernetes.cri.container-type":    "container",
		"io.kubernetes.cri.sandbox-id":        "sb1",
		"io.kubernetes.cri.sandbox-namespace": "default",
		"io.kubernetes.cri.container-name":    "app",
	}
	tests := []struct {
		name       string
		registered string // mode of kl-cni's registration
		mode       string // --mode from kl-runtime; "" = the hook resolves it
		ann        map[string]string
		wantErr    []string
	}{
		{name: "pod proxy, wrapper node default transparent", registered: "proxy", ann: criAnnotations,
			wantErr: []string{`mode "proxy"`, `mode "transparent"`, "node default", "sb1", "pod_annotations"}},
		{name: "pod transparent, wrapper proxy", registered: "transparent", mode: "proxy", ann: criAnnotations,
			wantErr: []string{`mode "transparent"`, `mode "proxy"`}},
		{name: "agree", registered: "proxy", ann: map[string]string{"kl.egress.mode": "proxy", "io.kubernetes.cri.sandbox-id": "sb1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, fr, fb := setup(t)
			h.Config.Mode = "transparent"
			fr.regs["sb1"] = api.Registration{Workload: api.Workload{ID: "sb1", Netns: "/var/run/netns/shared-sb1", Mode: tt.registered, Source: "cni"}}
			err := h.Create(context.Background(), State{ID: "c1", Pid: 100, Annotations: tt.ann}, tt.mode)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Create = %v, want nil", err)
				}
			} else {
				if !errors.Is(err, ErrModeMismatch) {
					t.Fatalf("Create = %v, want ErrModeMismatch", err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %q", err, w)
					}
				}
			}
			if _, ok := fr.regs["c1"]; ok {
				t.Errorf("container registered on its own (calls %q)", fr.calls)
			}
			if tbl, _ := fb.Get("/fakeproc/100/ns/net", netns.TableName); tbl != nil {
				t.Errorf("capture table installed in kl-cni's netns")
			}
		})
	}
}
