package runtime

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/tests/testutil"
)

const rulesBody = "# kl test rules\ndefault: direct\nrules:\n  - label: kl.route=proxy\n    action: proxy\n"

// klEnv prepares rules, a fake relay and a runtime.yaml in dir, returning the
// environment kl-runtime needs.
func klEnv(t *testing.T, dir, extra string) (env []string, relay *fakeRelay) {
	t.Helper()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte(rulesBody), 0o644); err != nil {
		t.Fatal(err)
	}
	relay = startFakeRelay(t, dir)
	if !strings.Contains(extra, "dockerSocket:") {
		extra += "dockerSocket: \"-\"\n"
	}
	if !strings.Contains(extra, "publishedRules:") {
		// Hermetic: never the node's own /run/kl/rules; these tests mount the file.
		extra += "publishedRules: " + filepath.Join(dir, "no-published-rules") + "\n"
	}
	cfg := writeConfig(t, dir, fmt.Sprintf("rules: %s\nhook: %s\nrelaySocket: %s\nrelayTimeout: 2s\nlogFile: %s\nlogLevel: debug\nnoProxy: [corp.example, 10.0.0.0/8]\n%s",
		rules, filepath.Join(bins(t), "kl-hook"), relay.Socket, filepath.Join(dir, "kl.log"), extra))
	return []string{"KL_RUNTIME_CONFIG=" + cfg}, relay
}

func cleanupContainer(t *testing.T, root, id string) {
	t.Cleanup(func() { _, _ = testutil.Output("runc", "--root", root, "delete", "--force", id) })
}

// TestFakeRuntimeArgv proves the command line reaches the real runtime byte for byte and
// its exit code comes back, for the edited commands and for passthrough ones. The fake
// runtime is found on PATH by name, as runc would be.
func TestFakeRuntimeArgv(t *testing.T) {
	dir := t.TempDir()
	env, _ := klEnv(t, dir, "runtime: runc\nmode: proxy\n")
	fakeBin := filepath.Join(dir, "fakebin")
	os.MkdirAll(fakeBin, 0o755)
	out := filepath.Join(dir, "argv")
	// kl-runtime's own `state` call (before exec) is answered with the bundle when
	// KL_FAKE_BUNDLE is set; every other call records its argv and exits KL_FAKE_RC.
	script := "#!/bin/sh\n" +
		"if [ -n \"$KL_FAKE_BUNDLE\" ] && [ \"$1\" = state ]; then printf '{\"id\":\"%s\",\"bundle\":\"%s\"}' \"$2\" \"$KL_FAKE_BUNDLE\"; exit 0; fi\n" +
		"printf '%s\\0' \"$@\" > \"$KL_FAKE_OUT\"\nexit \"${KL_FAKE_RC:-0}\"\n"
	if err := os.WriteFile(filepath.Join(fakeBin, "runc"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	env = append(env, "PATH="+fakeBin+":"+os.Getenv("PATH"), "KL_FAKE_OUT="+out)
	b := filepath.Join(dir, "b ü")
	os.MkdirAll(b, 0o755)
	spec := `{"ociVersion":"1.0.2","process":{"args":["sh"],"env":["PATH=/bin"]},"root":{"path":"rootfs"},` +
		`"linux":{"namespaces":[{"type":"network"}]},"x-unknown":{"keep":[1,2.50,"<&>"]}}`
	os.WriteFile(filepath.Join(b, "config.json"), []byte(spec), 0o644)
	rt := filepath.Join(bins(t), "kl-runtime")
	proc := filepath.Join(dir, "p.json") // exec's process, which kl-runtime edits in place
	os.WriteFile(proc, []byte(`{"args":["sh"],"env":["PATH=/bin"],"cwd":"/"}`), 0o644)

	tests := []struct {
		name string
		args []string
		rc   int
	}{
		{"create", []string{"--root", dir + "/r w", "--log", dir + "/log.json", "--log-format", "json", "create", "--bundle=" + b, "--pid-file", "p i d", "id-1"}, 0},
		{"create flags after id", []string{"create", "id-2", "-b", b, "--console-socket", "/s", "--no-pivot", "", "é"}, 5},
		{"state", []string{"--root", "/r", "state", "x y"}, 0},
		{"kill", []string{"kill", "id-1", "SIGKILL"}, 1},
		{"delete", []string{"delete", "--force", "id-1"}, 0},
		{"exec", []string{"exec", "--process", proc, "id-1"}, 126},
		{"version", []string{"--version"}, 0},
		{"unknown command", []string{"frobnicate", "--bundle", "/nonexistent"}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			os.Remove(out)
			e := append(env, fmt.Sprintf("KL_FAKE_RC=%d", tt.rc))
			if tt.name == "exec" {
				e = append(e, "KL_FAKE_BUNDLE="+b)
			}
			r := run(t, e, rt, tt.args...)
			if r.code != tt.rc {
				t.Fatalf("exit %d, want %d; stderr: %s", r.code, tt.rc, r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("kl-runtime wrote to stdout: %q", r.stdout)
			}
			data, err := os.ReadFile(out)
			if err != nil {
				t.Fatalf("fake runtime not run: %v (stderr %s)", err, r.stderr)
			}
			got := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
			if !slices.Equal(got, tt.args) {
				t.Errorf("runtime got %q, want %q", got, tt.args)
			}
		})
	}
	// The create calls edited the spec and kept what kl does not model.
	s := readSpec(t, b)
	data, _ := os.ReadFile(filepath.Join(b, "config.json"))
	if !strings.Contains(string(data), `"keep": [`) || !strings.Contains(string(data), "2.50") || !strings.Contains(string(data), `"<&>"`) {
		t.Errorf("unknown field changed:\n%s", data)
	}
	hooks := s["hooks"].(map[string]any)
	if n := len(hooks["createRuntime"].([]any)); n != 1 {
		t.Errorf("createRuntime hooks after two creates: %d, want 1", n)
	}
	env2 := fmt.Sprint(s["process"].(map[string]any)["env"])
	if strings.Count(env2, "HTTP_PROXY=") != 1 {
		t.Errorf("env after two creates: %s", env2)
	}
}

// TestRuncProxyMode runs a container through kl-runtime and real runc: the proxy
// variables and the read-only rules file are inside, unknown spec fields survive, and the
// hook registered the container's netns with the relay and deregistered it at poststop.
func TestRuncProxyMode(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "runc", "busybox")
	dir := t.TempDir()
	env, relay := klEnv(t, dir, "runtime: runc\nmode: transparent\n")
	script := `env; echo ---; cat /etc/kl/rules.yaml; echo ---; if echo x >> /etc/kl/rules.yaml; then echo WRITE-OK; else echo WRITE-FAILED; fi; grep ' /etc/kl/rules.yaml ' /proc/self/mounts`
	b := newBundle(t, dir, []string{"sh", "-c", script}, func(s map[string]any) {
		s["annotations"] = map[string]any{"kl.egress.mode": "proxy", "org.example/keep": "yes"}
		s["x-kl-test"] = map[string]any{"n": json.Number("18446744073709551615")}
		s["process"].(map[string]any)["env"] = toAny([]string{"PATH=/bin", "https_proxy=http://image-set:1"})
	})
	root := filepath.Join(dir, "runc-root")
	id := testutil.Name("klp")
	cleanupContainer(t, root, id)
	r := run(t, env, filepath.Join(bins(t), "kl-runtime"), "--root", root, "run", "--bundle", b, id)
	if r.code != 0 {
		t.Fatalf("kl-runtime run: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if m := contains(r.stdout,
		"HTTP_PROXY=http://127.0.0.1:15080\n", "http_proxy=http://127.0.0.1:15080\n",
		"ALL_PROXY=socks5h://127.0.0.1:15081\n", "all_proxy=socks5h://127.0.0.1:15081\n",
		"NO_PROXY=localhost,127.0.0.1,::1,169.254.169.254,fd00:ec2::254,corp.example,10.0.0.0/8\n",
		"no_proxy=localhost,127.0.0.1,::1,169.254.169.254,fd00:ec2::254,corp.example,10.0.0.0/8\n",
		"NODE_USE_ENV_PROXY=1\n", "https_proxy=http://image-set:1\n",
		rulesBody, "WRITE-FAILED", " ro,nosuid,nodev,noexec"); len(m) > 0 {
		t.Errorf("container output lacks %q:\n%s\nstderr: %s", m, r.stdout, r.stderr)
	}
	if strings.Contains(r.stdout, "HTTPS_PROXY=http://127.0.0.1") {
		t.Errorf("the image's own https_proxy was overridden:\n%s", r.stdout)
	}
	data, _ := os.ReadFile(filepath.Join(b, "config.json"))
	if m := contains(string(data), `"x-kl-test"`, "18446744073709551615", `"org.example/keep": "yes"`); len(m) > 0 {
		t.Errorf("spec lost %q", m)
	}
	calls := relay.Calls()
	if !has(calls, "register "+id+" proxy") || !has(calls, "deregister "+id) {
		t.Errorf("relay calls = %q, want a proxy registration and a deregistration", calls)
	}
	if _, still := relay.Registered(id); still {
		t.Errorf("still registered after poststop")
	}
}

// TestRuncLifecycle creates and starts a transparent-mode container through kl-runtime,
// checks the capture table in its netns, and compares state, kill, delete and errors with
// runc's own answers and exit codes.
func TestRuncLifecycle(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "runc", "busybox", "nft")
	dir := t.TempDir()
	env, relay := klEnv(t, dir, "runtime: runc\nmode: transparent\n")
	b := newBundle(t, dir, []string{"sleep", "60"}, nil)
	root := filepath.Join(dir, "runc-root")
	rt := filepath.Join(bins(t), "kl-runtime")
	id := testutil.Name("klt")
	cleanupContainer(t, root, id)

	if r := run(t, env, rt, "--root", root, "create", "--bundle", b, id); r.code != 0 {
		t.Fatalf("create: exit %d: %s", r.code, r.stderr)
	}
	reg, ok := relay.Registered(id)
	if !ok || reg.Workload.Mode != api.ModeTransparent || reg.Workload.Source != "hook" {
		t.Fatalf("registration = %+v, %v; calls %q", reg, ok, relay.Calls())
	}
	klState := run(t, env, rt, "--root", root, "state", id)
	runcState := run(t, nil, "runc", "--root", root, "state", id)
	if klState.code != 0 || klState.stdout != runcState.stdout {
		t.Fatalf("state through kl-runtime (exit %d):\n%s\nrunc:\n%s", klState.code, klState.stdout, runcState.stdout)
	}
	var st struct {
		Pid    int    `json:"pid"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal([]byte(klState.stdout), &st); err != nil || st.Status != "created" {
		t.Fatalf("state = %s (%v)", klState.stdout, err)
	}
	nsPath := fmt.Sprintf("/proc/%d/ns/net", st.Pid)
	if reg.Workload.Netns != nsPath {
		t.Errorf("registered netns %s, want %s", reg.Workload.Netns, nsPath)
	}
	want := netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: api.DefaultMark, IPv6: true, RejectQUIC: true}
	if err := netns.Verify(nsPath, want); err != nil {
		t.Errorf("capture in the container netns: %v", err)
	}
	if host, _ := netns.SameNetns(nsPath, "/proc/self/ns/net"); host {
		t.Fatalf("container shares the test's netns")
	}
	if r := run(t, env, rt, "--root", root, "start", id); r.code != 0 {
		t.Fatalf("start: exit %d: %s", r.code, r.stderr)
	}
	if r := run(t, env, rt, "--root", root, "kill", id, "KILL"); r.code != 0 {
		t.Fatalf("kill: exit %d: %s", r.code, r.stderr)
	}
	if !waitFor(10*time.Second, func() bool {
		return strings.Contains(run(t, nil, "runc", "--root", root, "state", id).stdout, `"stopped"`)
	}) {
		t.Fatalf("container did not stop")
	}
	if r := run(t, env, rt, "--root", root, "delete", id); r.code != 0 {
		t.Fatalf("delete: exit %d: %s", r.code, r.stderr)
	}
	if _, still := relay.Registered(id); still {
		t.Errorf("still registered after delete; calls %q", relay.Calls())
	}
	// Errors come back with runc's exit codes and messages.
	for _, args := range [][]string{{"state", id}, {"kill", id, "KILL"}, {"delete", id}, {"start", id}, {"nosuchcommand"}} {
		a := append([]string{"--root", root}, args...)
		k, rr := run(t, env, rt, a...), run(t, nil, "runc", a...)
		if k.code != rr.code || k.code == 0 || k.stdout != rr.stdout {
			t.Errorf("%q: kl-runtime exit %d stdout %q, runc exit %d stdout %q", args, k.code, k.stdout, rr.code, rr.stdout)
		}
	}
}

// TestRuncFailClosed: a relay that does not answer fails container creation with a clear
// message and leaves nothing behind; a malformed spec is refused before runc runs and the
// bundle is untouched; failOpen lets the container start anyway.
func TestRuncFailClosed(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "runc", "busybox")
	dir := t.TempDir()
	env, _ := klEnv(t, dir, "runtime: runc\nmode: transparent\n")
	cfgPath := strings.TrimPrefix(env[0], "KL_RUNTIME_CONFIG=")
	cfg, _ := os.ReadFile(cfgPath)
	// Point the relay socket at nothing.
	dead := strings.Replace(string(cfg), "relay.sock", "dead.sock", 1)
	os.WriteFile(cfgPath, []byte(dead), 0o644)
	b := newBundle(t, dir, []string{"true"}, nil)
	root := filepath.Join(dir, "runc-root")
	rt := filepath.Join(bins(t), "kl-runtime")
	id := testutil.Name("klf")
	cleanupContainer(t, root, id)
	r := run(t, env, rt, "--root", root, "run", "--bundle", b, id)
	if r.code == 0 || !strings.Contains(r.stderr, "kl-relayd unreachable") {
		t.Errorf("run with the relay down: exit %d, stderr %s; want a failure naming kl-relayd", r.code, r.stderr)
	}
	if s := run(t, nil, "runc", "--root", root, "state", id); s.code == 0 {
		t.Errorf("container exists after a failed create: %s", s.stdout)
	}

	os.WriteFile(cfgPath, []byte(dead+"failOpen: true\n"), 0o644)
	if r := run(t, env, rt, "--root", root, "run", "--bundle", b, id); r.code != 0 {
		t.Errorf("failOpen run: exit %d: %s", r.code, r.stderr)
	}

	bad := filepath.Join(dir, "bad")
	os.MkdirAll(bad, 0o755)
	os.WriteFile(filepath.Join(bad, "config.json"), []byte(`{"process": [`), 0o644)
	os.WriteFile(cfgPath, []byte(dead), 0o644)
	r = run(t, env, rt, "--root", root, "create", "--bundle", bad, id+"b")
	if r.code == 0 || !strings.Contains(r.stderr, "malformed OCI spec") {
		t.Errorf("malformed spec: exit %d, stderr %s", r.code, r.stderr)
	}
	if data, _ := os.ReadFile(filepath.Join(bad, "config.json")); string(data) != `{"process": [` {
		t.Errorf("malformed bundle changed: %s", data)
	}
	r = run(t, env, rt, "--root", root, "create", "--bundle", filepath.Join(dir, "missing"), id+"c")
	if r.code == 0 || !strings.Contains(r.stderr, "bundle") {
		t.Errorf("missing bundle: exit %d, stderr %s", r.code, r.stderr)
	}
}

// TestRuncHostNetwork: a container without its own network namespace runs with the rules
// file but is neither captured nor registered, and the hook says so in its log.
func TestRuncHostNetwork(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "runc", "busybox")
	dir := t.TempDir()
	env, relay := klEnv(t, dir, "runtime: runc\nmode: transparent\n")
	b := newBundle(t, dir, []string{"cat", "/etc/kl/rules.yaml"}, func(s map[string]any) {
		linux := s["linux"].(map[string]any)
		var keep []any
		for _, n := range linux["namespaces"].([]any) {
			if n.(map[string]any)["type"] != "network" {
				keep = append(keep, n)
			}
		}
		linux["namespaces"] = keep
	})
	root := filepath.Join(dir, "runc-root")
	id := testutil.Name("klh")
	cleanupContainer(t, root, id)
	r := run(t, env, filepath.Join(bins(t), "kl-runtime"), "--root", root, "run", "--bundle", b, id)
	if r.code != 0 || r.stdout != rulesBody {
		t.Fatalf("host-network run: exit %d, stdout %q, stderr %s", r.code, r.stdout, r.stderr)
	}
	for _, c := range relay.Calls() {
		if strings.HasPrefix(c, "register") {
			t.Errorf("host-network container registered: %q", relay.Calls())
		}
	}
	logData, _ := os.ReadFile(filepath.Join(dir, "kl.log"))
	if !strings.Contains(string(logData), "host network") {
		t.Errorf("hook log does not mention host network:\n%s", logData)
	}
}

// TestHookBadInput: garbage on the hook's stdin, a bad command line, an unknown mode.
func TestHookBadInput(t *testing.T) {
	dir := t.TempDir()
	env, relay := klEnv(t, dir, "")
	hook := filepath.Join(bins(t), "kl-hook")
	tests := []struct {
		name, stdin, want string
		args              []string
	}{
		{"garbage", "\x00\xffnot json", "bad OCI state", []string{"create"}},
		{"empty", "", "empty input", []string{"create"}},
		{"no id", `{"pid":1}`, "no container id", []string{"create"}},
		{"bad id", `{"id":"../x","pid":1}`, "not allowed", []string{"create"}},
		{"no pid", `{"id":"x","pid":0}`, "without a pid", []string{"create"}},
		{"usage", `{}`, "usage", []string{"frob"}},
		{"bad mode", `{}`, "--mode", []string{"--mode", "off", "create"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runStdin(t, env, tt.stdin, hook, tt.args...)
			if r.code == 0 || !strings.Contains(r.stderr, tt.want) || r.stdout != "" {
				t.Errorf("kl-hook %q <<< %q: exit %d stdout %q stderr %q, want failure mentioning %q", tt.args, tt.stdin, r.code, r.stdout, r.stderr, tt.want)
			}
		})
	}
	if calls := relay.Calls(); len(calls) > 0 {
		t.Errorf("bad input reached the relay: %q", calls)
	}
}
