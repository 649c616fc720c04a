// Package runtime holds kl's end-to-end tests of the OCI wrapper and hook against real
// runc, containerd and dockerd, each started by the test with its state under a temporary
// directory, plus a recording fake runtime that proves the command line is forwarded
// byte for byte.
package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/tests/testutil"
)

// bins returns the directory holding kl-runtime and kl-hook: $KL_BIN when it has both,
// else a build of just those two (the rest of the module is not needed here).
func bins(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("KL_BIN"); d != "" {
		_, e1 := os.Stat(filepath.Join(d, "kl-runtime"))
		_, e2 := os.Stat(filepath.Join(d, "kl-hook"))
		if e1 == nil && e2 == nil {
			return d
		}
	}
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "kl-shim-bin-")
		if binErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binDir+"/", "./shim/kl-runtime", "./shim/kl-hook")
		cmd.Dir = testutil.ModuleRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = &buildError{err, out}
		}
	})
	if binErr != nil {
		t.Fatalf("build kl-runtime and kl-hook: %v", binErr)
	}
	return binDir
}

// relaydBin builds kl-relayd (for the traffic tests), or takes it from $KL_BIN.
func relaydBin(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("KL_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "kl-relayd")); err == nil {
			return filepath.Join(d, "kl-relayd")
		}
	}
	dir := bins(t)
	relaydOnce.Do(func() {
		cmd := exec.Command("go", "build", "-o", dir+"/", "./relayd/kl-relayd")
		cmd.Dir = testutil.ModuleRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			relaydErr = &buildError{err, out}
		}
	})
	if relaydErr != nil {
		t.Fatalf("build kl-relayd: %v", relaydErr)
	}
	return filepath.Join(dir, "kl-relayd")
}

var (
	relaydOnce sync.Once
	relaydErr  error
	binOnce    sync.Once
	binDir     string
	binErr     error
)

type buildError struct {
	err error
	out []byte
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + string(e.out) }

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// busyboxRootfs fills dir with a static busybox and the applets the tests use.
func busyboxRootfs(t *testing.T, dir string) {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		testutil.RequireTool(t, "busybox")
	}
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"bin", "etc", "tmp", "proc", "dev", "sys"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "bin/busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"sh", "cat", "env", "echo", "sleep", "wget", "nc", "ls", "grep", "true", "false", "tr", "cut"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", app)); err != nil {
			t.Fatal(err)
		}
	}
}

// newBundle makes an OCI bundle with a busybox rootfs from `runc spec`, running args;
// edit changes the generic spec before it is written.
func newBundle(t *testing.T, dir string, args []string, edit func(spec map[string]any)) string {
	t.Helper()
	b := filepath.Join(dir, "bundle")
	busyboxRootfs(t, filepath.Join(b, "rootfs"))
	testutil.Run(t, "runc", "spec", "--bundle", b)
	spec := readSpec(t, b)
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = toAny(args)
	if edit != nil {
		edit(spec)
	}
	writeSpec(t, b, spec)
	return b
}

func readSpec(t *testing.T, bundle string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

func writeSpec(t *testing.T, bundle string, spec map[string]any) {
	t.Helper()
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// writeConfig writes a kl runtime.yaml into dir and returns its path.
func writeConfig(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "runtime.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// result of one command.
type result struct {
	stdout, stderr string
	code           int
}

// run runs a command with extra environment and returns its output and exit code.
// Output goes through files, not pipes, so a container that inherits them cannot make
// the wait hang.
func run(t *testing.T, env []string, name string, args ...string) result {
	t.Helper()
	dir := t.TempDir()
	ofile, _ := os.Create(filepath.Join(dir, "stdout"))
	efile, _ := os.Create(filepath.Join(dir, "stderr"))
	defer ofile.Close()
	defer efile.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = ofile, efile
	began := time.Now()
	err := cmd.Run()
	if os.Getenv("KL_TEST_TIMING") == "1" {
		t.Logf("%.2fs %s %.60q", time.Since(began).Seconds(), name, args)
	}
	r := result{code: cmd.ProcessState.ExitCode()}
	if err != nil && r.code < 0 {
		t.Fatalf("%s %q: %v", name, args, err)
	}
	o, _ := os.ReadFile(ofile.Name())
	e, _ := os.ReadFile(efile.Name())
	r.stdout, r.stderr = string(o), string(e)
	return r
}

// fakeRelay answers kl-relayd's registration API on a unix socket and records calls.
type fakeRelay struct {
	Socket string
	mu     sync.Mutex
	regs   map[string]api.Registration
	calls  []string
	fail   bool
}

func startFakeRelay(t *testing.T, dir string) *fakeRelay {
	t.Helper()
	f := &fakeRelay{Socket: filepath.Join(dir, "relay.sock"), regs: map[string]api.Registration{}}
	ln, err := net.Listen("unix", f.Socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/ready", func(w http.ResponseWriter, r *http.Request) { f.record("ready") })
	mux.HandleFunc("GET /v1/workloads", func(w http.ResponseWriter, r *http.Request) {
		f.record("list")
		f.mu.Lock()
		defer f.mu.Unlock()
		list := []api.Registration{}
		for _, r := range f.regs {
			list = append(list, r)
		}
		json.NewEncoder(w).Encode(list)
	})
	mux.HandleFunc("POST /v1/workloads", func(w http.ResponseWriter, r *http.Request) {
		var wl api.Workload
		if err := json.NewDecoder(r.Body).Decode(&wl); err != nil {
			http.Error(w, `{"error":"bad body"}`, http.StatusBadRequest)
			return
		}
		f.record("register " + wl.ID + " " + wl.Mode)
		reg := api.Registration{Workload: wl, Since: time.Now(), Listeners: api.Listeners{Redirect: api.DefaultRedirectPort}}
		if wl.Mode == api.ModeProxy {
			reg.Listeners.HTTP, reg.Listeners.SOCKS = api.DefaultHTTPPort, api.DefaultSOCKSPort
		}
		f.mu.Lock()
		f.regs[wl.ID] = reg
		f.mu.Unlock()
		json.NewEncoder(w).Encode(reg)
	})
	mux.HandleFunc("GET /v1/workloads/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		f.record("get " + id)
		f.mu.Lock()
		reg, ok := f.regs[id]
		f.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":"not registered"}`))
			return
		}
		json.NewEncoder(w).Encode(reg)
	})
	mux.HandleFunc("DELETE /v1/workloads/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		f.record("deregister " + id)
		f.mu.Lock()
		delete(f.regs, id)
		f.mu.Unlock()
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return f
}

func (f *fakeRelay) record(c string) {
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
}

// Calls returns the recorded calls, "list" and "get" included.
func (f *fakeRelay) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// Registered returns the registration of id, if any.
func (f *fakeRelay) Registered(id string) (api.Registration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.regs[id]
	return r, ok
}

// has reports whether calls contains c.
func has(calls []string, c string) bool {
	for _, x := range calls {
		if x == c {
			return true
		}
	}
	return false
}

// waitFor polls cond every 50ms for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return cond()
}

func contains(s string, subs ...string) (missing []string) {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			missing = append(missing, x)
		}
	}
	return missing
}

var _ = bytes.Equal

// runStdin is run with stdin.
func runStdin(t *testing.T, env []string, stdin, name string, args ...string) result {
	t.Helper()
	var o, e bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	r := result{code: cmd.ProcessState.ExitCode(), stdout: o.String(), stderr: e.String()}
	if err != nil && r.code < 0 {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}
