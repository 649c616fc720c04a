package ctl

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCLI runs kl-ctl as a whole and compares stdout, stderr and the exit status with
// testdata/golden/NAME.golden (regenerate with KL_UPDATE_GOLDEN=1).
func TestCLI(t *testing.T) {
	ex := "../../examples/"
	tests := []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"explain-image-wins", nil, []string{"explain", "--rules", ex + "ci-builder.yaml", "--image", "registry.cn-hangzhou.aliyuncs.com/acme/builder/go:1.22", "--ip", "10.1.2.3", "--port", "443"}},
		{"explain-image-wins-json", nil, []string{"explain", "--rules", ex + "ci-builder.yaml", "--image", "registry.cn-hangzhou.aliyuncs.com/acme/builder/go:1.22", "--ip", "10.1.2.3", "--port", "443", "--json"}},
		{"explain-guard", nil, []string{"explain", "--rules", ex + "ci-builder.yaml", "--image", "registry.cn-hangzhou.aliyuncs.com/acme/builder/go", "--ip", "169.254.169.254", "--port", "80"}},
		{"explain-guard-json", nil, []string{"explain", "--rules", ex + "forced-direct.yaml", "--ip", "169.254.169.254", "--json"}},
		{"explain-default", nil, []string{"explain", "--rules", ex + "forced-direct.yaml", "--host", "github.com", "--port", "443"}},
		{"explain-default-json", nil, []string{"explain", "--rules", ex + "forced-direct.yaml", "--host", "github.com", "--port", "443", "--json"}},
		{"explain-named-exit-json", nil, []string{"explain", "--rules", ex + "multi-exit.yaml", "--label", "kl.route=proxy-b", "--json"}},
		{"explain-tiers", nil, []string{"explain", "--rules", "testdata/mixed.yaml", "--label", "kl.route=proxy", "--process", "npm", "--host", "registry.npmjs.org", "--ip", "10.0.0.7", "--port", "443"}},
		{"explain-same-tier", nil, []string{"explain", "--rules", "testdata/mixed.yaml", "--host", "Registry.NPMJS.org.", "--port", "80"}},
		{"explain-pattern", nil, []string{"explain", "--rules", ex + "pattern.yaml", "--host", "git.corp.example", "--ip", "10.1.2.3", "--port", "22"}},
		{"explain-routes-json", nil, []string{"explain", "--egress-route", "*.corp.example=client", "--egress-route", "10.0.0.0/8=cluster", "--egress-default", "deny", "--host", "x.corp.example", "--json"}},
		{"explain-routes-default", nil, []string{"explain", "--egress-route", "*.corp.example=client", "--egress-default", "deny", "--ip", "192.0.2.1", "--port", "443"}},
		{"explain-routes-bad", nil, []string{"explain", "--egress-route", "10.0.0.0/8:http=cluster", "--ip", "10.0.0.1"}},
		{"explain-pac-json", nil, []string{"explain", "--egress-pac", "testdata/egress.pac", "--host", "git.corp.example", "--port", "443", "--at", "2026-11-30T06:00:00Z", "--json"}},
		{"explain-pac-and-routes", nil, []string{"explain", "--egress-pac", "testdata/egress.pac", "--egress-route", "*=deny", "--host", "a.example"}},
		{"lint-pac", nil, []string{"lint", "--egress-pac", "testdata/egress.pac"}},
		{"explain-invalid-file", nil, []string{"explain", "--rules", "testdata/bad.yaml", "--host", "a.example.com", "--json"}},
		{"explain-missing-file", nil, []string{"explain", "--rules", "testdata/nope.yaml", "--host", "a.example.com"}},
		{"explain-gateway-off", nil, []string{"explain", "--rules", "testdata/gateway.yaml", "--host", "api.example.com", "--port", "443"}},
		{"explain-gateway-on", map[string]string{"KL_EGRESS_GATEWAY": "1"}, []string{"explain", "--rules", "testdata/gateway.yaml", "--host", "api.example.com", "--port", "443", "--json"}},
		{"explain-detached", map[string]string{"KL_EGRESS_GATEWAY": "1"}, []string{"explain", "--detached", "--rules", "testdata/gateway.yaml", "--host", "api.example.com"}},
		{"explain-script-proxy", nil, []string{"explain", "--rules", "testdata/script.yaml", "--host", "proxied.example", "--port", "443", "--at", "2026-01-02T15:04:05Z", "--script-deadline", "10s", "--json"}},
		{"explain-script-client", nil, []string{"explain", "--rules", "testdata/script.yaml", "--host", "git.corp.example", "--port", "443", "--at", "2026-01-02T15:04:05Z", "--script-deadline", "10s"}},
		{"explain-script-failure", nil, []string{"explain", "--rules", "testdata/script.yaml", "--host", "broken.example", "--port", "443", "--at", "2026-01-02T15:04:05Z", "--script-deadline", "10s", "--json"}},
		{"explain-bad-flag", nil, []string{"explain", "--rules", ex + "pattern.yaml", "--port", "70000"}},
		{"explain-no-policy", nil, []string{"explain", "--host", "a.example"}},
		{"lint-ok", nil, []string{"lint", ex + "multi-exit.yaml"}},
		{"lint-warnings", nil, []string{"lint", ex + "forced-direct.yaml"}},
		{"lint-warnings-json", nil, []string{"lint", "testdata/mixed.yaml", "--json"}},
		{"lint-invalid", nil, []string{"lint", "testdata/bad.yaml"}},
		{"lint-invalid-json", nil, []string{"lint", "--json", "testdata/bad.yaml"}},
		{"lint-gateway-off", nil, []string{"lint", "testdata/gateway.yaml"}},
		{"lint-gateway-on", map[string]string{"KL_EGRESS_GATEWAY": "1"}, []string{"lint", "testdata/gateway.yaml"}},
		{"lint-detached", map[string]string{"KL_EGRESS_GATEWAY": "1"}, []string{"lint", "--detached", "testdata/gateway.yaml"}},
		{"lint-routes", nil, []string{"lint", "--egress-route", "*.corp.example=client", "--egress-route", "git.corp.example:22=deny"}},
		{"lint-no-file", nil, []string{"lint"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return tt.env[k] }}
			err := RunEnv(context.Background(), env, append([]string{"kl-ctl"}, tt.args...))
			got := fmt.Sprintf("$ kl-ctl %s\nexit status %d\n--- stdout\n%s--- stderr\n%s", strings.Join(tt.args, " "), ExitStatus(err), stdout.String(), stderr.String())
			golden := filepath.Join("testdata", "golden", tt.name+".golden")
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
				t.Errorf("kl-ctl %s:\n%s\nwant:\n%s", strings.Join(tt.args, " "), got, want)
			}
		})
	}
}

// TestUsage checks the command list without pinning it (other files add commands).
func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"kl-ctl"}, {"kl-ctl", "frobnicate"}, {"kl-ctl", "help"}} {
		var stdout, stderr bytes.Buffer
		err := RunEnv(context.Background(), &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}, args)
		out := stdout.String() + stderr.String()
		for _, c := range []string{"explain", "lint", "usage: kl-ctl COMMAND"} {
			if !strings.Contains(out, c) {
				t.Errorf("%v: output lacks %q:\n%s", args, c, out)
			}
		}
		want := 2
		if len(args) == 2 && args[1] == "help" {
			want = 0
		}
		if got := ExitStatus(err); got != want {
			t.Errorf("%v: exit status %d, want %d", args, got, want)
		}
	}
}

// Flag values that would otherwise fall back to a default unsaid are refused, naming the
// flag.
func TestBadFlagValues(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"lint", "--script-deadline", "0s", "testdata/egress.pac"}, "--script-deadline"},
		{[]string{"explain", "--egress-pac", "testdata/egress.pac", "--script-deadline", "-1s", "--host", "a.example"}, "--script-deadline"},
		{[]string{"explain", "--egress-route", "*=direct", "--host", "x.example:443"}, "the port goes in --port"},
		{[]string{"explain", "--egress-route", "*=direct", "--host", "https://x.example/"}, "the port goes in --port"},
		{[]string{"install", "docker", "--config", "/nonexistent/daemon.json", "--runtime-name", ""}, "--runtime-name is empty"},
		{[]string{"install", "containerd", "--config", "/nonexistent/config.toml", "--runtime-binary", ""}, "--runtime-binary is empty"},
		{[]string{"install", "cni", "--watch", "--interval", "-1s"}, "--interval"},
	} {
		var stdout, stderr bytes.Buffer
		env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
		err := RunEnv(context.Background(), env, append([]string{"kl-ctl"}, tt.args...))
		msg := stderr.String()
		if err != nil {
			msg += err.Error()
		}
		if ExitStatus(err) != ExitInvalid || !strings.Contains(msg, tt.want) {
			t.Errorf("kl-ctl %q: exit %d, %q; want exit %d naming %s", tt.args, ExitStatus(err), msg, ExitInvalid, tt.want)
		}
	}
	// An IPv6 literal is a host with colons of its own.
	var stdout bytes.Buffer
	env := &Env{Stdout: &stdout, Stderr: &bytes.Buffer{}, Getenv: func(string) string { return "" }}
	if err := RunEnv(context.Background(), env, []string{"kl-ctl", "explain", "--egress-route", "*=direct", "--host", "fd00::1"}); err != nil {
		t.Errorf("explain --host fd00::1: %v", err)
	}
}
