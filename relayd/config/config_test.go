package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
)

func TestParseDefaults(t *testing.T) {
	c, err := Parse("empty", nil)
	if err != nil {
		t.Fatalf("Parse(empty) = %v", err)
	}
	if c.Socket != api.DefaultSocket || c.StateDir != api.DefaultStateDir || c.Rules != api.DefaultRulesPath ||
		c.RedirectPort != api.DefaultRedirectPort || c.Mark != api.DefaultMark || c.IdleTimeout != DefaultIdleTimeout ||
		c.Sniff.Wait != DefaultSniffWait || len(c.Sniff.SkipPorts) == 0 {
		t.Errorf("defaults not filled: %+v", c)
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string // substring; "" = valid
		check   func(t *testing.T, c *Config)
	}{
		{name: "full", in: `
socket: /run/x.sock
stateDir: /var/lib/x
rules: /etc/x/rules.yaml
redirectPort: 16001
mark: 0x99
idleTimeout: 30s
proxy: {url: "http://squid:3128"}
exits:
  egress-b: {url: "socks5://dante:1080", connectTimeout: 2s}
`, check: func(t *testing.T, c *Config) {
			if c.RedirectPort != 16001 || c.Mark != 0x99 || c.IdleTimeout != 30*time.Second {
				t.Errorf("got %+v", c)
			}
			if c.Proxy.ConnectTimeout != DefaultConnectTimeout {
				t.Errorf("proxy connect timeout = %v, want default", c.Proxy.ConnectTimeout)
			}
			if !c.HasExit("egress-b") || c.HasExit("egress-c") || c.Exits["egress-b"].ConnectTimeout != 2*time.Second {
				t.Errorf("exits = %+v", c.Exits)
			}
		}},
		{name: "unknown key", in: "sockt: /x\n", wantErr: "field sockt not found"},
		{name: "loops", in: "loops: 4\n", check: func(t *testing.T, c *Config) {
			if c.Loops != 4 {
				t.Errorf("loops = %d, want 4", c.Loops)
			}
		}},
		{name: "no loops", in: "loops: -1\n", check: func(t *testing.T, c *Config) {
			if c.Loops != -1 {
				t.Errorf("loops = %d, want -1", c.Loops)
			}
		}},
		{name: "loops below -1", in: "loops: -2\n", wantErr: "loops: -2 is not between -1 and 256"},
		{name: "too many loops", in: "loops: 1000\n", wantErr: "loops: 1000 is not between -1 and 256"},
		{name: "relative socket", in: "socket: x.sock\n", wantErr: "socket: \"x.sock\" is not an absolute path"},
		{name: "published rules beside the socket", in: "socket: /run/x/relayd.sock\n", check: func(t *testing.T, c *Config) {
			if c.PublishedRules != "/run/x/rules" {
				t.Errorf("publishedRules = %q, want /run/x/rules", c.PublishedRules)
			}
		}},
		{name: "published rules off", in: "publishedRules: \"-\"\n", check: func(t *testing.T, c *Config) {
			if c.PublishedRules != "-" {
				t.Errorf("publishedRules = %q, want -", c.PublishedRules)
			}
		}},
		{name: "relative published rules", in: "publishedRules: rules\n", wantErr: "publishedRules: \"rules\" is not an absolute path"},
		{name: "port clash", in: "redirectPort: 15080\n", wantErr: "port 15080 is also redirectPort"},
		{name: "short idle", in: "idleTimeout: 10ms\n", wantErr: "idleTimeout"},
		{name: "builtin exit", in: "exits: {direct: {url: 'http://a:1'}}\n", wantErr: `"direct" is a built-in exit`},
		{name: "metrics port out of range", in: "metrics: \":99999\"\n", wantErr: "port \"99999\" is neither 0-65535 nor a service name"},
		{name: "metrics any free port", in: "metrics: 127.0.0.1:0\n", check: func(*testing.T, *Config) {}},
		{name: "metrics named port", in: "metrics: localhost:http\n", check: func(*testing.T, *Config) {}},
		{name: "metrics host with a space", in: "metrics: \"bad host:80\"\n", wantErr: "neither an address nor a name"},
		{name: "socket path too long", in: "socket: /" + strings.Repeat("s", 120) + "\n", wantErr: "fewer than 108"},
		{name: "stateDir a file", in: "stateDir: /etc/passwd\n", wantErr: "not a directory"},
		{name: "audit ring too large", in: "audit: {ring: 1000000000}\n", wantErr: "ring 1000000000 is over 65536"},
		{name: "bad exit name", in: "exits: {'a b': {url: 'http://a:1'}}\n", wantErr: "lower-case letters"},
		// A name rules cannot write in exit: is refused here, not left unreachable.
		{name: "upper-case exit name", in: "exits: {Egress-B: {url: 'socks5://a:1'}}\n", wantErr: `exit name "Egress-B"`},
		{name: "exit name starting with _", in: "exits: {_b: {url: 'socks5://a:1'}}\n", wantErr: `exit name "_b"`},
		{name: "bad scheme", in: "proxy: {url: 'ftp://a:1'}\n", wantErr: `scheme "ftp"`},
		{name: "no port", in: "proxy: {url: 'http://user:secret@a'}\n", wantErr: "needs a host and a port"},
		{name: "missing url", in: "exits: {b: {}}\n", wantErr: "exits: b: url is missing"},
		{name: "pipeline on http", in: "proxy: {url: 'http://user:secret@a:1', pipeline: true}\n", check: func(t *testing.T, c *Config) {
			if !c.Proxy.Pipeline {
				t.Error("proxy: pipeline not set")
			}
		}},
		{name: "pipeline on socks5", in: "exits: {b: {url: 'socks5://a:1080', pipeline: true}}\n", check: func(t *testing.T, c *Config) {
			if !c.Exits["b"].Pipeline {
				t.Error("exits: b: pipeline not set")
			}
		}},
		{name: "proxy connect timeout too short", in: "proxy: {url: 'http://squid:3128', connectTimeout: 1ns}\n", wantErr: "proxy: connectTimeout 1ns is shorter than 10ms"},
		{name: "exit connect timeout too short", in: "exits: {b: {url: 'socks5://a:1080', connectTimeout: 9ms}}\n", wantErr: "exits: b: connectTimeout 9ms is shorter than 10ms"},
		{name: "exit connect timeout negative", in: "exits: {b: {url: 'socks5://a:1080', connectTimeout: -1s}}\n", wantErr: "exits: b: connectTimeout -1s is negative"},
		{name: "connect timeout too short", in: "connectTimeout: 1us\nproxy: {url: 'http://squid:3128'}\n", wantErr: "connectTimeout: 1µs is shorter than 10ms"},
		{name: "connect timeout at the floor", in: "connectTimeout: 10ms\nproxy: {url: 'http://squid:3128'}\nexits: {b: {url: 'socks5://a:1080', connectTimeout: 10ms}}\n", check: func(t *testing.T, c *Config) {
			if c.ConnectTimeout != MinConnectTimeout || c.Proxy.ConnectTimeout != MinConnectTimeout || c.Exits["b"].ConnectTimeout != MinConnectTimeout {
				t.Errorf("connect timeouts = %v, proxy %v, exit b %v; want 10ms each", c.ConnectTimeout, c.Proxy.ConnectTimeout, c.Exits["b"].ConnectTimeout)
			}
		}},
		{name: "metrics", in: "metrics: nonsense\n", wantErr: "metrics"},
		{name: "second document", in: "httpPort: 3128\n---\nproxy: {url: 'http://squid:3128'}\n", wantErr: "more than one YAML document"},
		{name: "empty first document", in: "---\n---\nhttpPort: 3128\n", wantErr: "more than one YAML document"},
		{name: "explicit start of one document", in: "---\nhttpPort: 3128\n", check: func(t *testing.T, c *Config) {
			if c.HTTPPort != 3128 {
				t.Errorf("httpPort = %d, want 3128", c.HTTPPort)
			}
		}},
		{name: "sniff wait", in: "sniff: {wait: 1m}\n", wantErr: "sniff: wait"},
		{name: "containerd default namespaces", in: "containerd: {socket: /run/containerd/containerd.sock}\n", check: func(t *testing.T, c *Config) {
			if got := strings.Join(c.Containerd.Namespaces, ","); got != "k8s.io,default" {
				t.Errorf("containerd namespaces = %q, want k8s.io,default", got)
			}
		}},
		{name: "containerd namespaces", in: "containerd: {socket: /c.sock, namespaces: [moby]}\n", check: func(t *testing.T, c *Config) {
			if got := strings.Join(c.Containerd.Namespaces, ","); got != "moby" {
				t.Errorf("containerd namespaces = %q, want moby", got)
			}
		}},
		{name: "containerd off", in: "", check: func(t *testing.T, c *Config) {
			if c.Containerd.Socket != "" || c.Containerd.Namespaces != nil {
				t.Errorf("containerd = %+v, want off", c.Containerd)
			}
		}},
		{name: "containerd relative socket", in: "containerd: {socket: c.sock}\n", wantErr: `containerd: socket "c.sock" is not an absolute path`},
		{name: "containerd bad namespace", in: "containerd: {socket: /c.sock, namespaces: [k8s.io, 'a/b']}\n", wantErr: `containerd namespace "a/b"`},
		{name: "containerd namespaces alone", in: "containerd: {namespaces: [default]}\n", wantErr: "containerd: namespaces without a socket"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("t.yaml", []byte(tt.in))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Parse = %v", err)
				}
				tt.check(t, c)
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Parse = %v, want error containing %q", err, tt.wantErr)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error leaks a password: %v", err)
			}
		})
	}
}

func TestLoadRefusesReadableSecrets(t *testing.T) {
	p := filepath.Join(t.TempDir(), "relayd.yaml")
	if err := os.WriteFile(p, []byte("proxy: {url: 'socks5://u:pw@h:1080'}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("Load(0644 with credentials) = %v, want a refusal", err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err != nil {
		t.Fatalf("Load(0600) = %v", err)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("Load(missing explicit path) succeeded")
	}
}

func TestRedact(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"socks5://u:pw@h:1080", "socks5://h:1080"},
		{"http://h:3128/", "http://h:3128"},
		{"http://kl:1234/Secr3t@proxy.example:3128", "(malformed url)"},
		{"socks5://kl:99#TopSecret@proxy.example:1080", "(malformed url)"},
		{"http://kl:77#", "(malformed url)"},
		{"http://kl:88?TopSecret@proxy.example:3128", "(malformed url)"},
		{"http://kl:abc/TopSecret@proxy.example:3128", "(unparsable url)"},
	} {
		if got := Redact(tt.in); got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestParseHidesMangledCredentials: a password with an unencoded '/', '?', '#' or '%'
// makes url.Parse put part of it in the path, query, fragment, "host:port" or its own
// error message. Such a url is refused (it used to pass when it parsed: the daemon then
// failed to build the exit and printed the url), and the error names the field and the
// problem, never that text.
func TestParseHidesMangledCredentials(t *testing.T) {
	tests := []struct {
		in      string
		wantErr string
		hidden  []string
	}{
		{"proxy: {url: 'http://kl:1234/Secr3t@proxy.example:3128'}\n", "proxy: url has a path", []string{"1234", "Secr3t"}},
		{"exits: {b: {url: 'socks5://kl:99#TopSecret@proxy.example:1080'}}\n", "exits: b: url has a fragment", []string{"99", "TopSecret"}},
		{"proxy: {url: 'http://kl:77#'}\n", "proxy: url has a fragment", []string{"77"}},
		{"proxy: {url: 'http://kl:88?TopSecret@proxy.example:3128'}\n", "proxy: url has a query", []string{"88", "TopSecret"}},
		{"proxy: {url: 'http://kl:abc/TopSecret@proxy.example:3128'}\n", "proxy: url does not parse", []string{"abc", "TopSecret"}},
		{"proxy: {url: 'http://kl:123456/'}\n", "proxy: url: bad port", []string{"123456"}},
		{"proxy: {url: 'socks5:kl:secret@proxy.example:1080'}\n", "proxy: url: want scheme://host:port", []string{"secret"}},
	}
	for _, tt := range tests {
		_, err := Parse("t.yaml", []byte(tt.in))
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("Parse(%q) = %v, want an error saying %q", tt.in, err, tt.wantErr)
			continue
		}
		for _, h := range tt.hidden {
			if strings.Contains(err.Error(), h) {
				t.Errorf("Parse(%q) = %q, shows %q", tt.in, err, h)
			}
		}
	}
}

// A settings path that is not a regular file, or a file over the bound, is refused
// without being read whole (nor waited on).
func TestLoadRefusesNonRegularAndHuge(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte("metrics: 127.0.0.1:9000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 2<<30); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{big: "over", fifo: "not a regular file", dir: "not a regular file"} {
		if _, err := Load(path); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load(%s) = %v, want an error saying %q", path, err, want)
		}
	}
}
