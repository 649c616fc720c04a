package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/publish"
	"github.com/kl-egress/kl/shim/config"
	"github.com/kl-egress/kl/shim/docker"
	"github.com/kl-egress/kl/shim/oci"
	"github.com/kl-egress/kl/shim/workload"
)

type fakeDocker map[string]docker.Container

func (f fakeDocker) Lookup(_ context.Context, id string) (docker.Container, bool, error) {
	c, ok := f[id]
	return c, ok, nil
}

func testConfig(t *testing.T, yaml string) *config.Config {
	t.Helper()
	dir := t.TempDir()
	rules := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rules, []byte("default: direct\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "runtime.yaml")
	body := "rules: " + rules + "\nhook: /opt/kl/kl-hook\n" + yaml
	if !strings.Contains(yaml, "publishedRules:") {
		// Hermetic: never the node's own /run/kl/rules.
		body += "publishedRules: " + filepath.Join(dir, "published") + "\n"
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func writeBundle(t *testing.T, spec string) string {
	t.Helper()
	b := t.TempDir()
	if err := os.WriteFile(filepath.Join(b, "config.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return b
}

const baseSpec = `{"process":{"env":["PATH=/bin"],"args":["sh"]},"linux":{"namespaces":[{"type":"network"}]},"future":{"x":1}%s}`

func specWith(extra string) string { return strings.Replace(baseSpec, "%s", extra, 1) }

// netnsSpec is a spec that joins the network namespace at path.
func netnsSpec(path string) string {
	return `{"process":{"env":["PATH=/bin"],"args":["sh"]},"linux":{"namespaces":[{"type":"network","path":"` + path + `"}]},"future":{"x":1}}`
}

func TestPrepare(t *testing.T) {
	tests := []struct {
		name     string
		cfg      string
		spec     string
		docker   fakeDocker
		wantEnv  []string // must be present
		noEnv    []string // must be absent (name= prefix)
		wantHook string   // mode passed to the hook, "" = no hooks
		wantNone bool     // spec untouched
	}{
		{name: "node default transparent", cfg: "mode: transparent\n", spec: specWith(""),
			noEnv: []string{"HTTP_PROXY=", "NODE_USE_ENV_PROXY="}, wantHook: "transparent"},
		{name: "annotation proxy", cfg: "mode: transparent\n", spec: specWith(`,"annotations":{"kl.egress.mode":"proxy"}`),
			wantEnv: []string{"HTTP_PROXY=http://127.0.0.1:15080", "https_proxy=http://127.0.0.1:15080", "ALL_PROXY=socks5h://127.0.0.1:15081",
				"NO_PROXY=localhost,127.0.0.1,::1,169.254.169.254,fd00:ec2::254,corp.example,10.0.0.0/8", "NODE_USE_ENV_PROXY=1"}, wantHook: "proxy"},
		{name: "docker label proxy", cfg: "mode: transparent\n", spec: specWith(""),
			docker:  fakeDocker{"c1": {ID: "c1", Image: "busybox", Labels: map[string]string{"kl.egress.mode": "proxy"}}},
			wantEnv: []string{"HTTP_PROXY=http://127.0.0.1:15080"}, wantHook: "proxy"},
		{name: "env mode from config", cfg: "mode: env\nenv:\n  httpProxy: http://corp:3128\n  noProxy: .internal,*.svc\n", spec: specWith(""),
			wantEnv: []string{"HTTP_PROXY=http://corp:3128", "http_proxy=http://corp:3128", "NO_PROXY=localhost,127.0.0.1,::1,169.254.169.254,fd00:ec2::254,internal,svc,corp.example,10.0.0.0/8"},
			noEnv:   []string{"HTTPS_PROXY=", "ALL_PROXY="}},
		{name: "env mode from kl-runtime's environment", cfg: "mode: env\n", spec: specWith(""),
			wantEnv: []string{"HTTP_PROXY=http://from-env:1", "http_proxy=http://from-env:1", "NODE_USE_ENV_PROXY=1"},
			noEnv:   []string{"HTTPS_PROXY=", "ALL_PROXY="}},
		{name: "host network proxy gets no variables", cfg: "mode: proxy\n", spec: `{"process":{"env":[]},"linux":{"namespaces":[{"type":"pid"}]},"future":1}`,
			noEnv: []string{"HTTP_PROXY="}, wantHook: "proxy"},
		// Docker keeps the network entry for --network host and points it at the host's
		// netns (/var/run/docker/netns/default), and --network container:X at X's
		// /proc/PID/ns/net: here, paths naming the test's own netns.
		{name: "host netns by path gets no variables", cfg: "mode: proxy\n", spec: netnsSpec("/proc/self/ns/net"),
			noEnv: []string{"HTTP_PROXY=", "NODE_USE_ENV_PROXY="}, wantHook: "proxy"},
		{name: "netns of a host-network container gets no variables", cfg: "mode: proxy\n", spec: netnsSpec(fmt.Sprintf("/proc/%d/ns/net", os.Getpid())),
			noEnv: []string{"HTTP_PROXY="}, wantHook: "proxy"},
		// A path that cannot be compared is the container's own netns: its variables
		// then point at the relay's listeners, never at nothing on the host.
		{name: "netns path not there", cfg: "mode: proxy\n", spec: netnsSpec("/var/run/netns/kl-none"),
			wantEnv: []string{"HTTP_PROXY=http://127.0.0.1:15080"}, wantHook: "proxy"},
		// The image's NO_PROXY used to take the whole group: loopback, where the relay
		// listens, then went through the proxy.
		{name: "image NO_PROXY merged", cfg: "mode: proxy\n", spec: strings.Replace(specWith(""), `"PATH=/bin"`, `"PATH=/bin","NO_PROXY=internal.example,.Corp.Example"`, 1),
			wantEnv: []string{"NO_PROXY=internal.example,corp.example,localhost,127.0.0.1,::1,169.254.169.254,fd00:ec2::254,10.0.0.0/8",
				"no_proxy=internal.example,corp.example,localhost,127.0.0.1,::1,169.254.169.254,fd00:ec2::254,10.0.0.0/8", "HTTP_PROXY=http://127.0.0.1:15080"},
			wantHook: "proxy"},
		{name: "image no_proxy merged in env mode", cfg: "mode: env\nenv:\n  httpProxy: http://corp:3128\n", spec: strings.Replace(specWith(""), `"PATH=/bin"`, `"PATH=/bin","no_proxy=internal.example"`, 1),
			wantEnv: []string{"NO_PROXY=internal.example,localhost,127.0.0.1,::1,169.254.169.254,fd00:ec2::254,corp.example,10.0.0.0/8"}},
		{name: "forced NO_PROXY replaces the image's", cfg: "mode: proxy\nforce: [no_proxy]\n", spec: strings.Replace(specWith(""), `"PATH=/bin"`, `"PATH=/bin","NO_PROXY=internal.example"`, 1),
			wantEnv: []string{"NO_PROXY=localhost,127.0.0.1,::1,169.254.169.254,fd00:ec2::254,corp.example,10.0.0.0/8"}, noEnv: []string{"NO_PROXY=internal"}, wantHook: "proxy"},
		{name: "exempt image", cfg: "mode: proxy\nexempt:\n  images: ['docker.io/library/registry:*']\n", spec: specWith(`,"annotations":{"io.kubernetes.cri.image-name":"registry:2"}`), wantNone: true},
		{name: "exempt namespace", cfg: "mode: proxy\nexempt:\n  namespaces: [kube-system]\n", spec: specWith(`,"annotations":{"io.kubernetes.cri.sandbox-namespace":"kube-system"}`), wantNone: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, tt.cfg+"noProxy: [corp.example, 10.0.0.0/8]\n")
			dockerFrom = func(*config.Config) workload.Lookup { return tt.docker }
			t.Cleanup(func() { dockerFrom = func(*config.Config) workload.Lookup { return nil } })
			b := writeBundle(t, tt.spec)
			before, _ := os.ReadFile(filepath.Join(b, "config.json"))
			err := Prepare(context.Background(), cfg, Invocation{Command: "create", ContainerID: "c1", Bundle: b}, []string{"HTTP_PROXY=http://from-env:1"}, config.Discard())
			if err != nil {
				t.Fatal(err)
			}
			after, _ := os.ReadFile(filepath.Join(b, "config.json"))
			if tt.wantNone {
				if string(before) != string(after) {
					t.Errorf("exempt container's spec changed:\n%s", after)
				}
				return
			}
			s, err := oci.Load(b)
			if err != nil {
				t.Fatal(err)
			}
			env, _ := s.Env()
			checkEnv(t, env, tt.wantEnv, tt.noEnv)
			hooks, _ := s.Field("hooks")
			if tt.wantHook == "" {
				if hooks != nil {
					t.Errorf("hooks = %v, want none", hooks)
				}
			} else {
				cr := hooks.(map[string]any)["createRuntime"].([]any)[0].(map[string]any)
				args := cr["args"].([]any)
				if cr["path"] != "/opt/kl/kl-hook" || args[len(args)-1] != "create" || args[len(args)-2] != tt.wantHook || args[2] != cfg.Path() {
					t.Errorf("createRuntime hook = %v", cr)
				}
			}
			mounts, _ := s.Field("mounts")
			m := mounts.([]any)[0].(map[string]any)
			if m["destination"] != "/etc/kl/rules.yaml" || m["source"] != cfg.Rules {
				t.Errorf("mount = %v", m)
			}
			if f, _ := s.Field("future"); f == nil {
				t.Errorf("unknown field lost")
			}
		})
	}
}

func TestRulesMount(t *testing.T) {
	published := func(t *testing.T) string {
		dir := filepath.Join(t.TempDir(), "rules")
		if err := publish.Publish(dir, []byte("default: direct\n")); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	tests := []struct {
		name      string
		published func(t *testing.T) string // "" leaves the test config's (missing) directory
		rules     string                    // overrides the test config's rules file
		wantDst   string                    // "" = no mount
		wantLog   string
		wantErr   string
	}{
		{name: "published directory", published: published, wantDst: "/etc/kl"},
		{name: "published directory without a rules file", published: published, rules: "/nonexistent/rules.yaml", wantDst: "/etc/kl"},
		{name: "missing directory falls back", wantDst: "/etc/kl/rules.yaml", wantLog: "no such file"},
		{name: "foreign directory falls back", published: func(t *testing.T) string {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, "relayd.yaml"), []byte("secret"), 0o600)
			os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte("default: direct\n"), 0o644)
			return dir
		}, wantDst: "/etc/kl/rules.yaml", wantLog: "relayd.yaml"},
		{name: "published disabled", published: func(*testing.T) string { return "-" }, wantDst: "/etc/kl/rules.yaml"},
		{name: "rules disabled", published: published, rules: "-"},
		{name: "neither", rules: "/nonexistent/rules.yaml", wantErr: "rules file to mount at /etc/kl/rules.yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, "")
			if tt.published != nil {
				cfg.PublishedRules = tt.published(t)
			}
			if tt.rules != "" {
				cfg.Rules = tt.rules
			}
			var logs strings.Builder
			m, ok, err := RulesMount(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("RulesMount = %v, want error %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				if tt.wantDst != "" {
					t.Fatalf("no mount, want one at %s", tt.wantDst)
				}
				return
			}
			if m.Destination != tt.wantDst || m.Type != "bind" || !slices.Equal(m.Options, []string{"rbind", "ro", "nosuid", "nodev", "noexec"}) {
				t.Errorf("mount = %+v, want %s", m, tt.wantDst)
			}
			wantSrc, wantReplace := cfg.Rules, "/etc/kl"
			if tt.wantDst == "/etc/kl" {
				wantSrc, wantReplace = cfg.PublishedRules, "/etc/kl/rules.yaml"
			}
			if m.Source != wantSrc || !slices.Equal(m.Replace, []string{wantReplace}) {
				t.Errorf("mount = %+v, want source %s replacing %s", m, wantSrc, wantReplace)
			}
			if tt.wantLog == "" && logs.Len() > 0 {
				t.Errorf("unexpected log: %s", logs.String())
			}
			if tt.wantLog != "" && (!strings.Contains(logs.String(), tt.wantLog) || !strings.Contains(logs.String(), "level=WARN")) {
				t.Errorf("log %q lacks a warning with %q", logs.String(), tt.wantLog)
			}
		})
	}
}

func TestPrepareBad(t *testing.T) {
	cfg := testConfig(t, "")
	dockerFrom = func(*config.Config) workload.Lookup { return nil }
	tests := []struct {
		name, spec, want string
		bundle           func(b string) string
		cfg              *config.Config
	}{
		{name: "malformed", spec: `{"process":`, want: "malformed OCI spec"},
		{name: "not object", spec: `"x"`, want: "not an object"},
		{name: "missing config", spec: "", want: "config.json: no such file"},
		{name: "missing bundle", spec: `{}`, want: "no such file", bundle: func(b string) string { return b + "/nope" }},
		{name: "bad mode", spec: `{"process":{},"annotations":{"kl.egress.mode":"off"}}`, want: `kl.egress.mode="off"`},
		{name: "rules file missing", spec: `{"process":{}}`, want: "rules file", cfg: func() *config.Config { c := *cfg; c.Rules = "/nonexistent/rules.yaml"; return &c }()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := t.TempDir()
			if tt.spec != "" {
				os.WriteFile(filepath.Join(b, "config.json"), []byte(tt.spec), 0o644)
			}
			before, _ := os.ReadFile(filepath.Join(b, "config.json"))
			bundle := b
			if tt.bundle != nil {
				bundle = tt.bundle(b)
			}
			c := cfg
			if tt.cfg != nil {
				c = tt.cfg
			}
			err := Prepare(context.Background(), c, Invocation{Command: "create", ContainerID: "c1", Bundle: bundle}, nil, config.Discard())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Prepare = %v, want error containing %q", err, tt.want)
			}
			after, _ := os.ReadFile(filepath.Join(b, "config.json"))
			if string(before) != string(after) {
				t.Errorf("bundle changed on error")
			}
			if ents, _ := os.ReadDir(b); len(ents) > 1 {
				t.Errorf("bundle has leftovers: %v", ents)
			}
		})
	}
}

// TestRunExec checks the exec seam: argv after argv[0] goes to the real runtime unchanged,
// for edited and passthrough commands alike, and errors land in runc's --log file.
func TestRunExec(t *testing.T) {
	cfg := testConfig(t, "runtime: /bin/true\nmode: proxy\n")
	t.Setenv(config.EnvPath, cfg.Path())
	dockerFrom = func(*config.Config) workload.Lookup { return nil }
	var gotPath string
	var gotArgv []string
	execve = func(p string, argv, env []string) error { gotPath, gotArgv = p, argv; return nil }
	t.Cleanup(func() { execve = nil })
	b := writeBundle(t, specWith(""))
	containerState = func(_ context.Context, real string, inv Invocation) (string, error) {
		if real != "/bin/true" || inv.Root != "/r" || inv.ContainerID != "c 1" {
			t.Errorf("state of %+v asked of %s", inv, real)
		}
		return b, nil
	}
	t.Cleanup(func() { containerState = runtimeState })
	pf := filepath.Join(t.TempDir(), "runc-process")
	os.WriteFile(pf, []byte(`{"args":["sh"],"env":["PATH=/bin"]}`), 0o600)
	for _, args := range [][]string{
		{"--root", "/r", "--log", filepath.Join(b, "log.json"), "create", "--bundle", b, "c 1", "--pid-file=x y"},
		{"--root", "/r", "exec", "--process", pf, "--detach", "c 1"},
		{"state", "c1"},
		{"delete", "--force", "c1"},
	} {
		if err := Run(context.Background(), append([]string{"kl-runtime"}, args...)); err != nil {
			t.Fatalf("Run(%q) = %v", args, err)
		}
		if gotPath != "/bin/true" || !slices.Equal(gotArgv[1:], args) {
			t.Errorf("exec %s %q, want /bin/true %q", gotPath, gotArgv, args)
		}
	}
	if p, err := oci.LoadProcessFile(pf); err != nil {
		t.Error(err)
	} else if env, _ := p.Env(); !slices.Contains(env, "HTTP_PROXY=http://127.0.0.1:15080") {
		t.Errorf("exec'd process env = %q, want the proxy variables", env)
	}

	bad := writeBundle(t, `{"process":`)
	logf := filepath.Join(bad, "log.json")
	gotPath = ""
	err := Run(context.Background(), []string{"kl-runtime", "--log", logf, "--log-format", "json", "create", "-b", bad, "c2"})
	if err == nil || gotPath != "" {
		t.Fatalf("Run on a malformed spec = %v, exec %q: want an error and no exec", err, gotPath)
	}
	data, _ := os.ReadFile(logf)
	if !strings.Contains(string(data), `"level":"error"`) || !strings.Contains(string(data), "malformed OCI spec") {
		t.Errorf("runtime log = %s", data)
	}
}

// When the real runtime cannot say which container an exec is for, kl cannot give the
// process its variables: without failOpen the exec fails, naming the container and the
// cause; with failOpen the process starts without them, and the log says so.
func TestRunExecNoState(t *testing.T) {
	tests := []struct {
		failOpen bool
		wantErr  string // "" : the real runtime is exec'd
		wantLog  string
	}{
		{failOpen: false, wantErr: "exec in container c1: find its bundle: runc state c1: state dir gone", wantLog: "process not started"},
		{failOpen: true, wantLog: "failOpen: starting the process without kl's variables"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("failOpen=%v", tt.failOpen), func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "kl.log")
			cfg := testConfig(t, fmt.Sprintf("runtime: /bin/true\nmode: proxy\nfailOpen: %v\nlogFile: %s\n", tt.failOpen, logFile))
			t.Setenv(config.EnvPath, cfg.Path())
			dockerFrom = func(*config.Config) workload.Lookup { return nil }
			execed := false
			execve = func(string, []string, []string) error { execed = true; return nil }
			t.Cleanup(func() { execve = nil })
			containerState = func(_ context.Context, _ string, inv Invocation) (string, error) {
				return "", fmt.Errorf("runc state %s: state dir gone", inv.ContainerID)
			}
			t.Cleanup(func() { containerState = runtimeState })
			pf := filepath.Join(t.TempDir(), "runc-process")
			os.WriteFile(pf, []byte(`{"args":["sh"],"env":["PATH=/bin"]}`), 0o600)
			err := Run(context.Background(), []string{"kl-runtime", "exec", "--process", pf, "c1"})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || execed {
					t.Errorf("Run = %v, exec'd %v; want %q and no exec", err, execed, tt.wantErr)
				}
			} else if err != nil || !execed {
				t.Errorf("Run = %v, exec'd %v; want the real runtime exec'd", err, execed)
			}
			logged, _ := os.ReadFile(logFile)
			if !strings.Contains(string(logged), tt.wantLog) || !strings.Contains(string(logged), "state dir gone") {
				t.Errorf("log = %s; want %q with the cause", logged, tt.wantLog)
			}
		})
	}
}

func TestNoProxy(t *testing.T) {
	got := NoProxy([]string{"localhost", "127.0.0.1"}, []string{" .Corp.Example ", "*.svc.", "[::1]", "10.1.2.3/8", "localhost", "", "api.example.com:8443"})
	want := "localhost,127.0.0.1,corp.example,svc,::1,10.0.0.0/8,api.example.com:8443"
	if got != want {
		t.Errorf("NoProxy = %q, want %q", got, want)
	}
}

// containerd and dockerd build an exec'd process from their own copy of the spec, which
// never had kl's variables: `kubectl exec` and `docker exec` in proxy mode ran without
// them. PrepareExec gives the process file the container's variables by create's rules.
func TestPrepareExec(t *testing.T) {
	const proc = `{"terminal":true,"user":{"uid":0,"gid":0},"args":["sh"],"env":["PATH=/bin"%s],"cwd":"/","x-future":{"n":1.50}}`
	proxyVars := []string{"HTTP_PROXY=http://127.0.0.1:15080", "https_proxy=http://127.0.0.1:15080", "ALL_PROXY=socks5h://127.0.0.1:15081", "NODE_USE_ENV_PROXY=1"}
	tests := []struct {
		name     string
		cfg      string
		spec     string // the bundle's config.json before create
		procEnv  string // extra env entries of the process file
		noState  bool   // the real runtime does not know the container
		wantEnv  []string
		noEnv    []string
		wantSame bool // process file untouched
		wantErr  string
	}{
		{name: "proxy by annotation", cfg: "mode: transparent\n", spec: specWith(`,"annotations":{"kl.egress.mode":"proxy"}`), wantEnv: proxyVars},
		{name: "user's variable kept", cfg: "mode: proxy\n", spec: specWith(""), procEnv: `,"HTTPS_PROXY=http://mine:3128"`,
			wantEnv: []string{"HTTP_PROXY=http://127.0.0.1:15080", "HTTPS_PROXY=http://mine:3128"}, noEnv: []string{"https_proxy="}},
		{name: "process's NO_PROXY merged", cfg: "mode: proxy\nnoProxy: [corp.example]\n", spec: specWith(""), procEnv: `,"no_proxy=internal.example"`,
			wantEnv: []string{"NO_PROXY=internal.example,localhost,127.0.0.1,::1,169.254.169.254,fd00:ec2::254,corp.example",
				"no_proxy=internal.example,localhost,127.0.0.1,::1,169.254.169.254,fd00:ec2::254,corp.example"}},
		{name: "forced variable replaced", cfg: "mode: proxy\nforce: [http_proxy]\n", spec: specWith(""), procEnv: `,"http_proxy=http://mine:3128"`,
			wantEnv: []string{"HTTP_PROXY=http://127.0.0.1:15080", "http_proxy=http://127.0.0.1:15080"}, noEnv: []string{"http_proxy=http://mine"}},
		{name: "env mode", cfg: "mode: env\nenv:\n  httpsProxy: http://corp:3128\n", spec: specWith(""), wantEnv: []string{"HTTPS_PROXY=http://corp:3128", "https_proxy=http://corp:3128"}},
		{name: "transparent: nothing", cfg: "mode: transparent\n", spec: specWith(""), wantSame: true},
		{name: "host network proxy: nothing", cfg: "mode: proxy\n", spec: `{"process":{"env":[]},"linux":{"namespaces":[{"type":"pid"}]}}`, wantSame: true},
		{name: "host netns by path, proxy: nothing", cfg: "mode: proxy\n", spec: netnsSpec("/proc/self/ns/net"), wantSame: true},
		{name: "exempt: nothing", cfg: "mode: proxy\nexempt:\n  namespaces: [kube-system]\n", spec: specWith(`,"annotations":{"io.kubernetes.cri.sandbox-namespace":"kube-system"}`), wantSame: true},
		{name: "no state: fails", cfg: "mode: proxy\n", spec: specWith(""), noState: true, wantErr: "exec in container c1: find its bundle: container does not exist"},
		{name: "bad process file", cfg: "mode: proxy\n", spec: specWith(""), procEnv: `,1`, wantErr: "malformed OCI spec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, tt.cfg)
			dockerFrom = func(*config.Config) workload.Lookup { return nil }
			b := writeBundle(t, tt.spec)
			if err := Prepare(context.Background(), cfg, Invocation{Command: "create", ContainerID: "c1", Bundle: b}, nil, config.Discard()); err != nil {
				t.Fatal(err)
			}
			containerState = func(_ context.Context, real string, inv Invocation) (string, error) {
				if tt.noState || inv.ContainerID != "c1" {
					return "", errors.New("container does not exist")
				}
				return b, nil
			}
			t.Cleanup(func() { containerState = runtimeState })
			pf := filepath.Join(t.TempDir(), "runc-process1")
			before := strings.Replace(proc, "%s", tt.procEnv, 1)
			if err := os.WriteFile(pf, []byte(before), 0o600); err != nil {
				t.Fatal(err)
			}
			err := PrepareExec(context.Background(), cfg, "runc", Invocation{Command: "exec", ContainerID: "c1", ProcessFile: pf}, nil, config.Discard())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("PrepareExec = %v, want an error containing %q", err, tt.wantErr)
				}
				if after, _ := os.ReadFile(pf); string(after) != before {
					t.Errorf("process file changed on failure:\n%s", after)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			after, _ := os.ReadFile(pf)
			if tt.wantSame {
				if string(after) != before {
					t.Errorf("process file changed:\n%s", after)
				}
				return
			}
			p, err := oci.ParseProcess(pf, after)
			if err != nil {
				t.Fatal(err)
			}
			env, _ := p.Env()
			checkEnv(t, env, tt.wantEnv, tt.noEnv)
			if !strings.Contains(string(after), `"x-future"`) || !strings.Contains(string(after), "1.50") || strings.Contains(string(after), `"process"`) {
				t.Errorf("process file lost or wrapped fields:\n%s", after)
			}
		})
	}
}

// The mode kl chose at create (kl-hook's --mode) decides, not today's node default: the
// relay registered the container with it.
func TestPrepareExecCreatedMode(t *testing.T) {
	cfg := testConfig(t, "mode: proxy\n")
	dockerFrom = func(*config.Config) workload.Lookup { return nil }
	b := writeBundle(t, specWith(""))
	if err := Prepare(context.Background(), cfg, Invocation{Command: "create", ContainerID: "c1", Bundle: b}, nil, config.Discard()); err != nil {
		t.Fatal(err)
	}
	containerState = func(context.Context, string, Invocation) (string, error) { return b, nil }
	t.Cleanup(func() { containerState = runtimeState })
	pf := filepath.Join(t.TempDir(), "process.json")
	os.WriteFile(pf, []byte(`{"args":["sh"],"env":["PATH=/bin"]}`), 0o600)
	cfg.Mode = "transparent" // the operator changed the node default since
	if err := PrepareExec(context.Background(), cfg, "runc", Invocation{Command: "exec", ContainerID: "c1", ProcessFile: pf}, nil, config.Discard()); err != nil {
		t.Fatal(err)
	}
	p, err := oci.LoadProcessFile(pf)
	if err != nil {
		t.Fatal(err)
	}
	if env, _ := p.Env(); !slices.Contains(env, "HTTP_PROXY=http://127.0.0.1:15080") {
		t.Errorf("env %q: want the proxy variables of the mode chosen at create", env)
	}
}

// The mode chosen at create is recorded for every mode: an env-mode container, which has
// no kl-hook to carry --mode, keeps env mode's variables after the node default becomes
// proxy, whose variables would point at listeners no relay opened for it. A container an
// older kl-runtime created (no annotation) is still read from its hook's --mode.
func TestPrepareExecCreatedModeRecorded(t *testing.T) {
	tests := []struct {
		name, createMode, execMode string
		legacy                     bool // drop the annotation, as an older kl-runtime wrote the spec
		want, not                  []string
	}{
		{name: "env, then proxy default", createMode: "env", execMode: "proxy",
			want: []string{"HTTP_PROXY=http://corp:3128"}, not: []string{"HTTP_PROXY=http://127.0.0.1"}},
		{name: "transparent, then proxy default", createMode: "transparent", execMode: "proxy", not: []string{"HTTP_PROXY="}},
		{name: "proxy, then env default", createMode: "proxy", execMode: "env", want: []string{"HTTP_PROXY=http://127.0.0.1:15080"}},
		{name: "proxy by an older kl-runtime", createMode: "proxy", execMode: "env", legacy: true, want: []string{"HTTP_PROXY=http://127.0.0.1:15080"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, "mode: "+tt.createMode+"\nenv:\n  httpProxy: http://corp:3128\n")
			dockerFrom = func(*config.Config) workload.Lookup { return nil }
			b := writeBundle(t, specWith(""))
			if err := Prepare(context.Background(), cfg, Invocation{Command: "create", ContainerID: "c1", Bundle: b}, nil, config.Discard()); err != nil {
				t.Fatal(err)
			}
			s, err := oci.Load(b)
			if err != nil {
				t.Fatal(err)
			}
			if ann, _ := s.Annotations(); ann[workload.AnnotCreatedMode] != tt.createMode {
				t.Fatalf("annotations %v: want %s=%s", ann, workload.AnnotCreatedMode, tt.createMode)
			}
			if tt.legacy {
				if err := (oci.Annotation{Key: workload.AnnotCreatedMode}).Modify(s); err != nil {
					t.Fatal(err)
				}
				if err := s.Save(b); err != nil {
					t.Fatal(err)
				}
			}
			containerState = func(context.Context, string, Invocation) (string, error) { return b, nil }
			t.Cleanup(func() { containerState = runtimeState })
			pf := filepath.Join(t.TempDir(), "process.json")
			os.WriteFile(pf, []byte(`{"args":["sh"],"env":["PATH=/bin"]}`), 0o600)
			cfg.Mode = tt.execMode // the operator changed the node default since
			if err := PrepareExec(context.Background(), cfg, "runc", Invocation{Command: "exec", ContainerID: "c1", ProcessFile: pf}, nil, config.Discard()); err != nil {
				t.Fatal(err)
			}
			p, err := oci.LoadProcessFile(pf)
			if err != nil {
				t.Fatal(err)
			}
			env, _ := p.Env()
			checkEnv(t, env, tt.want, tt.not)
		})
	}
}

// Under failOpen, a proxy-mode container whose relay is down starts uncaptured, as
// documented: without proxy variables that point at listeners nobody opened. Its exec'd
// processes match it. With the relay up, or without failOpen (the hook then fails the
// start), the variables are there.
func TestPrepareFailOpenRelayDown(t *testing.T) {
	dir := t.TempDir()
	up := filepath.Join(dir, "up.sock")
	ln, err := net.Listen("unix", up)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/ready" {
			http.NotFound(w, r)
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	down := filepath.Join(dir, "down.sock")
	tests := []struct {
		name     string
		cfg      string
		wantVars bool
	}{
		{name: "failOpen, relay down", cfg: "failOpen: true\nrelaySocket: " + down + "\n"},
		{name: "failOpen, relay up", cfg: "failOpen: true\nrelaySocket: " + up + "\n", wantVars: true},
		{name: "fail closed, relay down", cfg: "relaySocket: " + down + "\n", wantVars: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, "mode: proxy\n"+tt.cfg)
			dockerFrom = func(*config.Config) workload.Lookup { return nil }
			b := writeBundle(t, specWith(""))
			var logs strings.Builder
			log := slog.New(slog.NewTextHandler(&logs, nil))
			if err := Prepare(context.Background(), cfg, Invocation{Command: "create", ContainerID: "c1", Bundle: b}, nil, log); err != nil {
				t.Fatal(err)
			}
			s, err := oci.Load(b)
			if err != nil {
				t.Fatal(err)
			}
			env, _ := s.Env()
			ann, _ := s.Annotations()
			if tt.wantVars {
				checkEnv(t, env, []string{"HTTP_PROXY=http://127.0.0.1:15080"}, nil)
				if ann[workload.AnnotEnvOmitted] != "" {
					t.Errorf("annotations %v: variables recorded as omitted", ann)
				}
			} else {
				checkEnv(t, env, nil, []string{"HTTP_PROXY=", "http_proxy=", "ALL_PROXY=", "NO_PROXY=", "NODE_USE_ENV_PROXY="})
				if !strings.Contains(ann[workload.AnnotEnvOmitted], "kl-relayd unreachable") {
					t.Errorf("annotations %v: want why the variables were left out", ann)
				}
				if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "proxy variables left out") {
					t.Errorf("log %q: want a warning saying the variables were left out", logs.String())
				}
			}
			hooks, _ := s.Field("hooks")
			if hooks == nil {
				t.Errorf("no kl-hook: the hook still registers when the relay comes back, and removes at poststop")
			}

			containerState = func(context.Context, string, Invocation) (string, error) { return b, nil }
			t.Cleanup(func() { containerState = runtimeState })
			pf := filepath.Join(t.TempDir(), "process.json")
			os.WriteFile(pf, []byte(`{"args":["sh"],"env":["PATH=/bin"]}`), 0o600)
			if err := PrepareExec(context.Background(), cfg, "runc", Invocation{Command: "exec", ContainerID: "c1", ProcessFile: pf}, nil, config.Discard()); err != nil {
				t.Fatal(err)
			}
			p, _ := oci.LoadProcessFile(pf)
			penv, _ := p.Env()
			if got := slices.Contains(penv, "HTTP_PROXY=http://127.0.0.1:15080"); got != tt.wantVars {
				t.Errorf("exec'd process env %q: proxy variables %v, want %v as the container", penv, got, tt.wantVars)
			}
		})
	}
}

// kl's poststop hook runs first (runc stops a stage at its first failing hook, and kl's
// removes the relay registration); its createRuntime hook stays after the others.
func TestPrepareHookOrder(t *testing.T) {
	cfg := testConfig(t, "mode: transparent\n")
	dockerFrom = func(*config.Config) workload.Lookup { return nil }
	other := `{"path":"/usr/bin/other","args":["other"]}`
	b := writeBundle(t, specWith(`,"hooks":{"createRuntime":[`+other+`],"poststop":[`+other+`]}`))
	for range 2 { // a second create of the same bundle edits it again
		if err := Prepare(context.Background(), cfg, Invocation{Command: "create", ContainerID: "c1", Bundle: b}, nil, config.Discard()); err != nil {
			t.Fatal(err)
		}
	}
	s, err := oci.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	hooks, _ := s.Field("hooks")
	for stage, want := range map[string]string{"createRuntime": "/usr/bin/other /opt/kl/kl-hook", "poststop": "/opt/kl/kl-hook /usr/bin/other"} {
		var got []string
		for _, h := range hooks.(map[string]any)[stage].([]any) {
			got = append(got, h.(map[string]any)["path"].(string))
		}
		if strings.Join(got, " ") != want {
			t.Errorf("%s hooks %q, want %s", stage, got, want)
		}
	}
}

// runtimeState asks the real runtime, under the same --root, for the container's bundle.
func TestRuntimeState(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "runc")
	script := "#!/bin/sh\n[ \"$*\" = \"--root /r state c1\" ] && { echo '{\"ociVersion\":\"1.0.2\",\"id\":\"c1\",\"bundle\":\"/b/c1\",\"annotations\":{}}'; exit 0; }\necho \"container does not exist\" >&2; exit 1\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := runtimeState(context.Background(), fake, Invocation{Root: "/r", ContainerID: "c1"})
	if err != nil || got != "/b/c1" {
		t.Errorf("runtimeState = %q, %v; want /b/c1", got, err)
	}
	if _, err := runtimeState(context.Background(), fake, Invocation{Root: "/r", ContainerID: "c2"}); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("unknown container: %v, want the runtime's error", err)
	}
}

// checkEnv asserts that env holds every entry of want and no entry starting with one of
// not.
func checkEnv(t *testing.T, env, want, not []string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(env, w) {
			t.Errorf("env %q lacks %q", env, w)
		}
	}
	for _, n := range not {
		if slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, n) }) {
			t.Errorf("env %q has %q", env, n)
		}
	}
}

// dockerd starts restart-policy containers before it serves its API (the socket listens,
// nothing answers): kl-runtime identifies them from their record in dockerRoot, labels
// and image included. With no record either, create fails as before, naming both.
func TestPrepareDockerSilent(t *testing.T) {
	const id = "4c5e9a1f0b3d27e8c6f1a2b9d0e4f7a3c8b5d1e6f9a0b2c4d7e8f1a3b5c6d9e0"
	dir := t.TempDir()
	sock := filepath.Join(dir, "docker.sock")
	ln, err := net.Listen("unix", sock) // never accepts
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	root := filepath.Join(dir, "docker")
	rec, err := os.ReadFile("../docker/testdata/config.v2.json")
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "containers", id), 0o700)
	if err := os.WriteFile(filepath.Join(root, "containers", id, "config.v2.json"), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, "mode: transparent\ndockerSocket: "+sock+"\ndockerRoot: "+root+"\n")
	dockerFrom = func(cfg *config.Config) workload.Lookup { return workload.Docker(cfg, 200*time.Millisecond) }
	t.Cleanup(func() { dockerFrom = func(*config.Config) workload.Lookup { return nil } })
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))

	b := writeBundle(t, specWith(""))
	if err := Prepare(context.Background(), cfg, Invocation{Command: "create", ContainerID: id, Bundle: b}, nil, log); err != nil {
		t.Fatalf("Prepare with dockerd silent and the container's record there: %v", err)
	}
	s, err := oci.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	env, _ := s.Env()
	checkEnv(t, env, []string{"HTTP_PROXY=http://127.0.0.1:15080"}, nil) // its label kl.egress.mode=proxy
	if !strings.Contains(logs.String(), "image=docker.io/library/nginx:1.27") || !strings.Contains(logs.String(), "engine=docker") {
		t.Errorf("log does not show the Docker image from the record:\n%s", logs.String())
	}

	other := "0" + id[1:]
	b = writeBundle(t, specWith(""))
	err = Prepare(context.Background(), cfg, Invocation{Command: "create", ContainerID: other, Bundle: b}, nil, config.Discard())
	recPath := filepath.Join(root, "containers", other, "config.v2.json")
	if err == nil || !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), recPath) {
		t.Errorf("Prepare with dockerd silent and no record = %v, want an error naming %s and %s", err, sock, recPath)
	}
}

// containerd's runc shim hands `runc create` the container's own stdio: kl-runtime's
// stderr is the workload's. A create that succeeds writes nothing there when the engine
// gave --log (its warnings go there, in runc's format) or the operator a logFile; only
// with neither, as when run by hand, do warnings go to stderr.
func TestRunLogs(t *testing.T) {
	tests := []struct {
		name       string
		logFormat  string // "" : no --log
		logFile    bool
		wantRunc   string // in the --log file
		wantStderr string // "" : stderr empty
	}{
		{name: "runc log json", logFormat: "json", logFile: true, wantRunc: `"level":"warning","msg":"kl-runtime: published rules directory unavailable`},
		{name: "runc log text", logFormat: "text", wantRunc: `level=warning msg="kl-runtime: published rules directory unavailable`},
		{name: "logFile only", logFile: true},
		{name: "neither", wantStderr: "published rules directory unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			yaml := "runtime: /bin/true\nmode: proxy\n"
			if tt.logFile {
				yaml += "logFile: " + filepath.Join(dir, "kl.log") + "\n"
			}
			cfg := testConfig(t, yaml)
			t.Setenv(config.EnvPath, cfg.Path())
			dockerFrom = func(*config.Config) workload.Lookup { return nil }
			execve = func(string, []string, []string) error { return nil }
			t.Cleanup(func() { execve = nil })
			stderr, err := os.Create(filepath.Join(dir, "stderr"))
			if err != nil {
				t.Fatal(err)
			}
			saved := os.Stderr
			os.Stderr = stderr
			t.Cleanup(func() { os.Stderr = saved; stderr.Close() })

			b := writeBundle(t, specWith(""))
			runcLog := filepath.Join(dir, "log.json")
			args := []string{"kl-runtime"}
			if tt.logFormat != "" {
				args = append(args, "--log", runcLog, "--log-format", tt.logFormat)
			}
			args = append(args, "create", "--bundle", b, "c1")
			if err := Run(context.Background(), args); err != nil {
				t.Fatal(err)
			}
			os.Stderr = saved
			got, _ := os.ReadFile(stderr.Name())
			if tt.wantStderr == "" && len(got) > 0 {
				t.Errorf("stderr = %q, want nothing", got)
			}
			if tt.wantStderr != "" && !strings.Contains(string(got), tt.wantStderr) {
				t.Errorf("stderr = %q, want %q", got, tt.wantStderr)
			}
			if tt.wantRunc != "" {
				data, _ := os.ReadFile(runcLog)
				if !strings.Contains(string(data), tt.wantRunc) || strings.Contains(string(data), `level":"info"`) || strings.Contains(string(data), "level=info") {
					t.Errorf("runc log = %s; want %s and no info records", data, tt.wantRunc)
				}
			}
			if tt.logFile {
				data, _ := os.ReadFile(filepath.Join(dir, "kl.log"))
				if !strings.Contains(string(data), "published rules directory unavailable") || !strings.Contains(string(data), `"msg":"spec edited"`) {
					t.Errorf("logFile = %s; want the warning and the info records", data)
				}
			}
		})
	}
}
