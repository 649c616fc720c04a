// Package pkgtest builds the kl Debian package with packaging/deb/build.sh, installs it
// with dpkg into a throwaway root directory (dpkg --root, maintainer scripts run
// chrootless with DPKG_ROOT set), and checks that every file lands where docs/install.md
// says, with the mode it says, that the installed binaries run and the installed
// configuration loads, and that purging leaves nothing behind.
package pkgtest

import (
	"bufio"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/kl-egress/kl/relayd/config"
	"github.com/kl-egress/kl/rules"
	shimconfig "github.com/kl-egress/kl/shim/config"
	"github.com/kl-egress/kl/tests/testutil"
)

const version = "0.0.0~test"

// docEntry is one row of the table in docs/install.md.
type docEntry struct {
	path string // absolute; a trailing slash marks a directory
	mode fs.FileMode
}

func docTable(t *testing.T, root string) []docEntry {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `(/[^`]+)` \\| (0[0-7]{3}) \\|")
	var out []docEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := row.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		var mode fs.FileMode
		for _, c := range m[2][1:] {
			mode = mode<<3 | fs.FileMode(c-'0')
		}
		out = append(out, docEntry{m[1], mode})
	}
	if len(out) < 10 {
		t.Fatalf("docs/install.md lists %d paths; the table is missing or malformed", len(out))
	}
	return out
}

func run(t *testing.T, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestDebianPackage(t *testing.T) {
	testutil.SkipShort(t, "builds the whole package (static binaries and nfpm)")
	testutil.RequirePrivileged(t) // dpkg --root installs as root, with root-owned files
	testutil.RequireTool(t, "dpkg", "dpkg-deb", "go")
	mod := testutil.ModuleRoot(t)

	out := t.TempDir()
	lines := strings.Split(strings.TrimSpace(run(t, []string{"KL_VERSION=" + version, "KL_DEB_OUT=" + out},
		filepath.Join(mod, "packaging", "deb", "build.sh"))), "\n")
	deb := lines[len(lines)-1]
	if want := filepath.Join(out, "kl_"+version+"_amd64.deb"); deb != want {
		t.Fatalf("build.sh produced %q, want %q", deb, want)
	}

	for field, want := range map[string]string{"Package": "kl", "Version": version, "Architecture": "amd64"} {
		if got := strings.TrimSpace(run(t, nil, "dpkg-deb", "-f", deb, field)); got != want {
			t.Errorf("control field %s = %q, want %q", field, got, want)
		}
	}
	conffiles := run(t, nil, "sh", "-c", "dpkg-deb --ctrl-tarfile \"$0\" | tar -xOf - ./conffiles", deb)
	for _, c := range []string{"/etc/kl/rules.yaml", "/etc/kl/relayd.yaml", "/etc/kl/runtime.yaml", "/etc/default/kl-relayd"} {
		if !strings.Contains(conffiles, c+"\n") {
			t.Errorf("%s is not a conffile (conffiles: %q)", c, conffiles)
		}
	}

	// A throwaway dpkg database and root.
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"var/lib/dpkg/status", "var/lib/dpkg/available"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dpkg := func(args ...string) string {
		t.Helper()
		return run(t, nil, "dpkg", append([]string{"--root=" + root, "--force-script-chrootless", "--log=/dev/null"}, args...)...)
	}
	dpkg("-i", deb)
	if st := dpkg("-s", "kl"); !strings.Contains(st, "Status: install ok installed") {
		t.Fatalf("dpkg -s kl:\n%s", st)
	}
	dpkg("--verify", "kl")

	// Every path the docs list is there with its mode, and nothing else is installed.
	table := docTable(t, mod)
	for _, e := range table {
		st, err := os.Lstat(filepath.Join(root, e.path))
		if err != nil {
			t.Errorf("docs/install.md lists %s: %v", e.path, err)
			continue
		}
		if isDir := strings.HasSuffix(e.path, "/"); isDir != st.IsDir() {
			t.Errorf("%s: directory = %v, the docs say %v", e.path, st.IsDir(), isDir)
		}
		if st.Mode().Perm() != e.mode {
			t.Errorf("%s: mode %04o, the docs say %04o", e.path, st.Mode().Perm(), e.mode)
		}
		if sys, ok := st.Sys().(interface{ Uid() uint32 }); ok && sys.Uid() != 0 {
			t.Errorf("%s is not owned by root", e.path)
		}
	}
	covered := func(p string) bool {
		for _, e := range table {
			dir := strings.HasSuffix(e.path, "/")
			switch {
			case p == strings.TrimSuffix(e.path, "/"):
				return true
			case dir && strings.HasPrefix(p, e.path):
				return true
			case strings.HasPrefix(e.path, p+"/"): // an ancestor of a listed path
				return true
			}
		}
		return false
	}
	var stray []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := "/" + strings.TrimPrefix(path, root+"/")
		if path == root || rel == "/var/lib/dpkg" && d.IsDir() {
			if path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !covered(rel) {
			stray = append(stray, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(stray)
	if len(stray) > 0 {
		t.Errorf("installed but not in docs/install.md: %v", stray)
	}

	// The installed files work: the static binaries run from the package, and the
	// shipped configuration loads as each component loads it.
	check := run(t, nil, filepath.Join(root, "usr/bin/kl-relayd"), "check",
		"--settings", filepath.Join(root, "etc/kl/relayd.yaml"), "--config", filepath.Join(root, "etc/kl/rules.yaml"))
	if !strings.Contains(check, "rules ok") {
		t.Errorf("kl-relayd check on the shipped configuration:\n%s", check)
	}
	if v := run(t, []string{"CNI_COMMAND=VERSION"}, filepath.Join(root, "opt/cni/bin/kl-cni")); !strings.Contains(v, "supportedVersions") {
		t.Errorf("kl-cni VERSION printed %q", v)
	}
	read := func(p string) []byte {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := rules.Parse("/etc/kl/rules.yaml", read("etc/kl/rules.yaml"), rules.LoadOptions{}); err != nil {
		t.Errorf("shipped rules: %v", err)
	}
	if _, err := config.Parse("/etc/kl/relayd.yaml", read("etc/kl/relayd.yaml")); err != nil {
		t.Errorf("shipped relayd settings: %v", err)
	}
	if _, err := shimconfig.Parse("/etc/kl/runtime.yaml", read("etc/kl/runtime.yaml")); err != nil {
		t.Errorf("shipped runtime settings: %v", err)
	}
	for _, b := range []string{"usr/bin/kl-relayd", "usr/bin/kl-ctl", "usr/bin/kl-runtime", "usr/bin/kl-hook", "opt/cni/bin/kl-cni"} {
		if out, _ := exec.Command("file", "-b", filepath.Join(root, b)).Output(); len(out) > 0 && strings.Contains(string(out), "dynamically linked") {
			t.Errorf("%s is dynamically linked (%s); the package declares no library dependencies", b, strings.TrimSpace(string(out)))
		}
	}

	// Purge removes everything, conffiles, state and logs included.
	dpkg("--purge", "kl")
	var left []string
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == root {
			return err
		}
		rel := strings.TrimPrefix(path, root+"/")
		if strings.HasPrefix(rel, "var/lib/dpkg") {
			return nil
		}
		if !d.IsDir() {
			left = append(left, rel)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("dpkg --purge left files behind: %v", left)
	}
	for _, d := range []string{"etc/kl", "var/lib/kl", "var/log/kl"} {
		if _, err := os.Stat(filepath.Join(root, d)); err == nil {
			t.Errorf("dpkg --purge left /%s", d)
		}
	}
}
