package systemd

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/tests/testutil"
)

const unitFile = "kl-relayd.service"

// unit reads the unit into key → values (a key may repeat).
func unit(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	kv := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: malformed line %q", unitFile, line)
		}
		kv[k] = append(kv[k], v)
	}
	return kv
}

// copyWithBinary writes the unit into a temporary directory with ExecStart pointing at
// an executable that exists (verify rejects a missing one), and returns its path.
func copyWithBinary(t *testing.T, bin string) string {
	t.Helper()
	data, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	text := strings.ReplaceAll(string(data), "ExecStart=/usr/bin/kl-relayd", "ExecStart="+bin)
	p := filepath.Join(dir, unitFile)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// systemd-analyze verify must accept the unit without a single warning: unknown or
// misspelt keys and bad values are only warnings to it, so any output is a failure.
func TestVerify(t *testing.T) {
	testutil.RequireTool(t, "systemd-analyze")
	bin := filepath.Join(t.TempDir(), "kl-relayd")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := copyWithBinary(t, bin)
	out, err := exec.Command("systemd-analyze", "verify", "--man=no", p).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// The hardening must keep systemd's exposure score low; a change that opens the unit up
// shows here. (3.4 when written.)
func TestSecurityExposure(t *testing.T) {
	testutil.RequireTool(t, "systemd-analyze")
	p := copyWithBinary(t, "/bin/true")
	cmd := exec.Command("systemd-analyze", "security", "--offline=yes", "--no-pager", p)
	cmd.Dir = filepath.Dir(p)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	score, _ := strconv.ParseFloat(string(m[1]), 64)
	if score > 4.0 {
		t.Errorf("exposure level %.1f, want at most 4.0:\n%s", score, out)
	}
}

// The settings the product depends on (SPEC §5, issue 5), checked by name so that a
// careless edit is caught even where systemd would accept it.
func TestUnitSettings(t *testing.T) {
	kv := unit(t)
	for _, tc := range []struct{ key, want string }{
		{"Type", "notify"},
		{"NotifyAccess", "main"},
		{"WatchdogSec", "30s"},
		{"LimitCORE", "0"},
		{"LimitNOFILE", "1048576"},
		{"RuntimeDirectory", "kl"},
		{"RuntimeDirectoryPreserve", "yes"}, // containers mount /run/kl/rules (relayd/publish)
		{"StateDirectory", "kl"},
		{"LogsDirectory", "kl"},
		{"Restart", "always"},
		{"NoNewPrivileges", "yes"},
		{"ProtectSystem", "strict"},
		{"RestrictNamespaces", "net"},
		{"CapabilityBoundingSet", "CAP_NET_ADMIN CAP_SYS_ADMIN CAP_SYS_PTRACE CAP_DAC_READ_SEARCH"},
		{"RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK"},
	} {
		if got := kv[tc.key]; len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s = %q, want exactly %q", tc.key, got, tc.want)
		}
	}
	// Settings that would break setns or the gateway exit must stay out.
	for _, k := range []string{"PrivateNetwork", "PrivateUsers", "ProtectKernelTunables", "NetworkNamespacePath"} {
		if v, ok := kv[k]; ok {
			t.Errorf("%s=%v would break the relay (see the unit's comments)", k, v)
		}
	}
	// The relay's sockets live in /run/kl: the API socket default must be there.
	if dir := "/run/kl/"; !strings.HasPrefix(api.DefaultSocket, dir) {
		t.Errorf("api.DefaultSocket %s is not under the unit's RuntimeDirectory %s", api.DefaultSocket, dir)
	}
}

// The daemon accepts the unit's command line: run `kl-relayd check` with the same flags,
// the two /etc/kl files replaced by temporary ones.
func TestExecStartFlags(t *testing.T) {
	kv := unit(t)
	args := strings.Fields(kv["ExecStart"][0])
	if args[0] != "/usr/bin/kl-relayd" {
		t.Fatalf("ExecStart runs %s, want /usr/bin/kl-relayd (where the .deb puts it)", args[0])
	}
	dir := t.TempDir()
	repl := map[string]string{
		"/etc/kl/relayd.yaml": filepath.Join(dir, "relayd.yaml"),
		"/etc/kl/rules.yaml":  filepath.Join(dir, "rules.yaml"),
	}
	if err := os.WriteFile(repl["/etc/kl/relayd.yaml"], []byte("stateDir: "+dir+"/state\nsocket: "+dir+"/relayd.sock\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(repl["/etc/kl/rules.yaml"], []byte("default: direct\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmdArgs := []string{"check"}
	for _, a := range args[1:] {
		if r, ok := repl[a]; ok {
			a = r
		}
		cmdArgs = append(cmdArgs, a)
	}
	out, err := exec.Command(testutil.Bin(t, "kl-relayd"), cmdArgs...).CombinedOutput()
	if err != nil {
		t.Fatalf("kl-relayd %s: %v\n%s", strings.Join(cmdArgs, " "), err, out)
	}
	if !strings.Contains(string(out), "rules ok") {
		t.Errorf("kl-relayd check printed no rules verdict:\n%s", out)
	}
}
