package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/publish"
)

func TestExample(t *testing.T) {
	c, err := Load("testdata/runtime.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Runtime != "/usr/sbin/runc" || c.Mode != "transparent" || c.Env.HTTPProxy == "" || c.RelayTimeout != 10*time.Second ||
		len(c.Exempt.Namespaces) != 1 || c.Capture.Mark != api.DefaultMark || !filepath.IsAbs(c.Path()) || !strings.HasSuffix(c.Path(), "/testdata/runtime.yaml") {
		t.Errorf("Load(example) = %+v", c)
	}
}

func TestDefaults(t *testing.T) {
	c, err := Parse("empty", nil)
	if err != nil {
		t.Fatal(err)
	}
	exe, _ := os.Executable()
	if c.Runtime != "runc" || c.Mode != api.ModeTransparent || c.Proxy.HTTPPort != 15080 || c.Proxy.SOCKSPort != 15081 || !*c.Proxy.AllProxy ||
		c.Rules != api.DefaultRulesPath || c.PublishedRules != "/run/kl/rules" || c.RelaySocket != api.DefaultSocket || c.Hook != filepath.Join(filepath.Dir(exe), "kl-hook") || c.HookTimeout != 30 ||
		c.DockerSocket != "/var/run/docker.sock" || c.DockerRoot != "/var/lib/docker" {
		t.Errorf("defaults = %+v", c)
	}
}

func TestPublishedRulesDefault(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "/run/kl/rules"},
		{"relaySocket: /var/lib/kl-test/relay.sock\n", "/var/lib/kl-test/rules"},
		{"relaySocket: /var/lib/kl-test/relay.sock\npublishedRules: /srv/rules\n", "/srv/rules"},
		{"publishedRules: \"-\"\n", "-"},
	}
	for _, tt := range tests {
		c, err := Parse("runtime.yaml", []byte(tt.in))
		if err != nil {
			t.Fatalf("Parse(%q): %v", tt.in, err)
		}
		if c.PublishedRules != tt.want {
			t.Errorf("Parse(%q).PublishedRules = %q, want %q", tt.in, c.PublishedRules, tt.want)
		}
	}
	if PublishedRulesFor(api.DefaultSocket) != publish.DefaultDir {
		t.Errorf("the default socket does not give publish.DefaultDir")
	}
}

func TestParseBad(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"unknown key", "modes: proxy\n", "field modes not found"},
		{"bad mode", "mode: off\n", `mode "off"`},
		{"relative rules", "rules: rules.yaml\n", "absolute"},
		{"relative published rules", "publishedRules: run/kl/rules\n", "publishedRules"},
		{"relative hook", "hook: kl-hook\n", "absolute"},
		{"relative docker root", "dockerRoot: var/lib/docker\n", "dockerRoot"},
		{"bad cidr", "capture:\n  excludeCIDRs: [10.0.0.300/8]\n", "excludeCIDRs[0]"},
		// What the capture install would refuse is refused here, where kl-hook check
		// sees it, rather than at every transparent container's start.
		{"whole family excluded", "capture:\n  excludeCIDRs: [10.96.0.0/12, 0.0.0.0/0]\n", "capture: ExcludeCIDRs[1] 0.0.0.0/0"},
		{"IPv4-mapped exclusion", "capture:\n  excludeCIDRs: ['::ffff:10.0.0.0/104']\n", "capture: ExcludeCIDRs[0] ::ffff:10.0.0.0/104"},
		{"port 0 excluded", "capture:\n  excludePorts: [53, 0]\n", "capture: ExcludePorts[1]"},
		{"noProxy list in one", "noProxy: ['a,b']\n", "noProxy[0]"},
		{"bad level", "logLevel: loud\n", "logLevel"},
		{"bad yaml", "mode: [\n", "ERR"},
		{"bad port", "proxy:\n  httpPort: 70000\n", "cannot unmarshal"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("runtime.yaml", []byte(tt.in))
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "runtime.yaml") {
				t.Fatalf("Parse(%q) = %v, want ErrConfig naming the file", tt.in, err)
			}
			if tt.want != "ERR" && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%q) = %v, want %q", tt.in, err, tt.want)
			}
		})
	}
	if _, err := Load(filepath.Join(t.TempDir(), "none.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing explicit file: %v", err)
	}
}

func TestRealRuntime(t *testing.T) {
	self, _ := os.Executable()
	c := &Config{Runtime: self}
	if _, err := c.RealRuntime(); err == nil || !strings.Contains(err.Error(), "kl-runtime itself") {
		t.Errorf("RealRuntime(self) = %v", err)
	}
	c.Runtime = "no-such-runtime-kl"
	if _, err := c.RealRuntime(); err == nil {
		t.Errorf("RealRuntime(missing) = nil")
	}
	c.Runtime = "sh"
	if p, err := c.RealRuntime(); err != nil || !filepath.IsAbs(p) {
		t.Errorf("RealRuntime(sh) = %q, %v", p, err)
	}
}
