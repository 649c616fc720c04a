package daemon

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/rules"
)

// kl-relayd takes the pattern form and PAC scripts from flags too (seed 000), through the
// same parsers as files; `check` proves it without starting the daemon.
func TestPolicyFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	settings := writeSettings(t, dir, cfg)
	pacFile := filepath.Join(dir, "egress.pac")
	os.WriteFile(pacFile, []byte("function FindProxyForURL(url, host) {\n  return \"DIRECT\";\n}\n"), 0o644)
	badPAC := filepath.Join(dir, "bad.pac")
	os.WriteFile(badPAC, []byte("function FindProxyForURL(url, host) {\n  return (;\n}\n"), 0o644)
	for _, tc := range []struct {
		name string
		args []string
		want string // in the output (ok) or the error
		ok   bool
	}{
		{"routes", []string{"--egress-route", "*.corp.example=deny", "--egress-route", "10.0.0.0/8=cluster", "--egress-default", "deny"}, "rules ok: --egress-route", true},
		{"pac file", []string{"--egress-pac", pacFile, "--egress-default", "deny"}, "rules ok: " + pacFile, true},
		{"bad route", []string{"--egress-route", "*.corp.example"}, "E_BAD_PATTERN", false},
		{"gateway without the opt-in", []string{"--egress-route", "*=gateway"}, "E_GATEWAY_DISABLED", false},
		{"bad pac names its line", []string{"--egress-pac", badPAC}, "(line 2)", false},
		{"missing pac", []string{"--egress-pac", filepath.Join(dir, "nope.pac")}, "E_UNREADABLE", false},
		{"config and routes", []string{"--config", cfg.Rules, "--egress-route", "*=deny"}, "use one", false},
		{"pac and routes", []string{"--egress-pac", pacFile, "--egress-route", "*=deny"}, "use one", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			args := append([]string{"kl-relayd", "check", "--settings", settings}, tc.args...)
			err := run(context.Background(), args, &out, &out)
			if tc.ok {
				if err != nil || !strings.Contains(out.String(), tc.want) {
					t.Fatalf("run(%q) = %v, output %q; want success mentioning %q", tc.args, err, out.String(), tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run(%q) = %v; want an error mentioning %q", tc.args, err, tc.want)
			}
		})
	}
}

// A PAC file given with --egress-pac is watched like a rules file: an edit is picked up,
// and an unchanged file is not reloaded at every poll.
func TestPACFlagReloads(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.PAC = filepath.Join(dir, "egress.pac")
	cfg.Rules = cfg.PAC
	cfg.RulesPoll = 30 * time.Millisecond
	os.WriteFile(cfg.PAC, []byte(`function FindProxyForURL(u, h) { return "DIRECT"; }`), 0o644)
	c, _ := start(t, cfg)
	status := func() api.Status {
		var st api.Status
		if err := c.Call(context.Background(), http.MethodGet, "/v1/status", nil, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	before := status()
	time.Sleep(150 * time.Millisecond) // several polls of an unchanged file
	if st := status(); !st.Rules.LoadedAt.Equal(before.Rules.LoadedAt) || st.Rules.Hash != before.Rules.Hash {
		t.Fatalf("an unchanged PAC file was reloaded: %+v then %+v", before.Rules, st.Rules)
	}
	edited := []byte(`function FindProxyForURL(u, h) { return "DENY"; }`)
	os.WriteFile(cfg.PAC, edited, 0o644)
	want := rules.ScriptSource(edited, "")
	p, err := rules.Parse("want", want, rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for status().Rules.Hash != p.Hash() {
		if time.Now().After(deadline) {
			t.Fatalf("edited PAC file not reloaded: status %+v, want hash %s", status().Rules, p.Hash())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The command line: -h is no failure; a bad flag or an extra argument is a usage error
// (main exits 2), printed once, with the usage.
func TestCommandLineUsage(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want error
		says string
	}{
		{[]string{"kl-relayd", "-h"}, nil, "Usage of kl-relayd"},
		{[]string{"kl-relayd", "check", "-h"}, nil, "Usage of kl-relayd"},
		{[]string{"kl-relayd", "--bogus"}, ErrUsage, "flag provided but not defined: -bogus"},
		{[]string{"kl-relayd", "extra"}, ErrUsage, `unexpected arguments: ["extra"]`},
	} {
		var out bytes.Buffer
		err := run(context.Background(), tt.args, &out, &out)
		if !errors.Is(err, tt.want) || !strings.Contains(out.String(), tt.says) || strings.Count(out.String(), tt.says) != 1 {
			t.Errorf("%q: %v, printed:\n%s\nwant %v and %q printed once", tt.args, err, out.String(), tt.want, tt.says)
		}
	}
}
