package install

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/tests/testutil"
)

// update regenerates the golden files instead of comparing with them.
var update = os.Getenv("KL_UPDATE_GOLDEN") == "1"

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with KL_UPDATE_GOLDEN=1 to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file:\n%s", name, UnifiedDiff("golden", "got", want, got))
	}
}

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The round trip every editor must honour on realistic configs: the installed form is
// the golden one, installing twice changes nothing, uninstalling gives back the original
// byte for byte, and uninstalling something without kl changes nothing.
func TestRoundTrip(t *testing.T) {
	cases := []struct {
		name  string
		file  string
		e     Editor
		clean bool // the file holds no kl entry to begin with
	}{
		{"calico", "10-calico.conflist", CNI{}, true},
		{"flannel", "10-flannel.conflist", CNI{}, true},
		{"containerd-net", "10-containerd-net.conflist", CNI{Conf: map[string]any{"socket": "/run/kl/relayd.sock"}}, true},
		{"compact-kl-in-middle", "05-compact-kl-in-middle.conflist", CNI{}, false},
		{"containerd-v2", "containerd-v2.toml", Containerd{}, true},
		{"containerd-v2-kubeadm", "containerd-v2-kubeadm.toml", Containerd{}, true},
		{"containerd-v2-minimal", "containerd-v2-minimal.toml", Containerd{}, true},
		{"containerd-v3", "containerd-v3.toml", Containerd{BinaryName: "/usr/local/bin/kl-runtime"}, true},
		{"containerd-v1", "containerd-v1.toml", Containerd{}, true},
		{"docker", "daemon.json", Docker{}, true},
		{"docker-default", "daemon-minimal.json", Docker{Default: true}, false},
		{"docker-minimal", "daemon-minimal.json", Docker{}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			orig := read(t, tc.file)
			got, err := tc.e.Install(orig)
			if err != nil {
				t.Fatalf("Install: %v", err)
			}
			golden(t, tc.name+".installed", got)
			golden(t, tc.name+".diff", []byte(UnifiedDiff("a/"+tc.file, "b/"+tc.file, orig, got)))
			again, err := tc.e.Install(got)
			if err != nil {
				t.Fatalf("second Install: %v", err)
			}
			if !bytes.Equal(again, got) {
				t.Errorf("second Install changed the file:\n%s", UnifiedDiff("once", "twice", got, again))
			}
			back, err := tc.e.Uninstall(got)
			if err != nil {
				t.Fatalf("Uninstall: %v", err)
			}
			if tc.clean && !bytes.Equal(back, orig) {
				t.Errorf("Uninstall(Install(x)) != x:\n%s", UnifiedDiff("original", "uninstalled", orig, back))
			}
			if !tc.clean {
				golden(t, tc.name+".uninstalled", back)
			}
			twice, err := tc.e.Uninstall(back)
			if err != nil {
				t.Fatalf("second Uninstall: %v", err)
			}
			if !bytes.Equal(twice, back) {
				t.Errorf("Uninstall of a file without kl changed it:\n%s", UnifiedDiff("once", "twice", back, twice))
			}
		})
	}
}

func TestInstallErrors(t *testing.T) {
	cases := []struct {
		name string
		e    Editor
		in   string
		want string // substring of the error
	}{
		{"cni single plugin", CNI{}, string(read(t, "99-single.conf")), "single-plugin"},
		{"cni not json", CNI{}, "{\"plugins\": [", "invalid JSON"},
		{"cni plugins not a list", CNI{}, `{"name":"x","plugins":{}}`, `"plugins" is not a list`},
		{"cni plugin not an object", CNI{}, `{"name":"x","plugins":["bridge"]}`, "plugins[0] is not an object"},
		{"cni empty", CNI{}, "", "empty"},
		{"cni type in Conf", CNI{Conf: map[string]any{"type": "x"}}, `{"plugins":[]}`, "set by Type"},
		{"cni version not supported", CNI{Versions: []string{"1.0.0", "1.1.0"}}, string(read(t, "10-calico.conflist")), `cniVersion is "0.3.1" but kl-cni supports 1.0.0, 1.1.0`},
		{"cni version missing", CNI{Versions: []string{"1.0.0"}}, `{"plugins":[]}`, `cniVersion is ""`},
		{"docker not an object", Docker{}, `[]`, "top level is not an object"},
		{"docker runtimes not an object", Docker{}, `{"runtimes": []}`, `"runtimes" is not an object`},
		{"docker other default", Docker{Default: true}, `{"default-runtime": "nvidia"}`, `"default-runtime" is "nvidia"`},
		{"containerd bad toml", Containerd{}, "version = 2\n[plugins\n", "invalid TOML at line"},
		{"containerd empty no version", Containerd{}, "", "choose the layout"},
		{"containerd version 4", Containerd{}, "version = 4\n", "unsupported containerd config version 4"},
		{"containerd inline runtimes", Containerd{}, string(read(t, "containerd-inline.toml")), "invalid TOML"},
		{"containerd relative binary", Containerd{BinaryName: "kl-runtime"}, "version = 2\n", "absolute path"},
		{"containerd quote in binary", Containerd{BinaryName: "/usr/bin/k\"l"}, "version = 2\n", "without quotes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.e.Install([]byte(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Install(%q) error = %v, want one containing %q", tc.in, err, tc.want)
			}
		})
	}
}

// An empty containerd config gets the layout the caller names; docker's gets created.
func TestInstallIntoEmpty(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    Editor
		want string
	}{
		{"containerd v2", Containerd{Version: 2}, "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kl]\n  runtime_type = \"io.containerd.runc.v2\"\n  pod_annotations = [\"kl.egress.mode\"]\n\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kl.options]\n    BinaryName = \"/usr/bin/kl-runtime\"\n"},
		{"containerd v3", Containerd{Version: 3}, "version = 3\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.kl]\n  runtime_type = \"io.containerd.runc.v2\"\n  pod_annotations = [\"kl.egress.mode\"]\n\n  [plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.kl.options]\n    BinaryName = \"/usr/bin/kl-runtime\"\n"},
		{"docker", Docker{}, "{\n  \"runtimes\": {\n    \"kl\": {\n      \"path\": \"/usr/bin/kl-runtime\"\n    }\n  }\n}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.e.Install(nil)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("Install(empty) =\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

// A config.toml of comments only says no version, so the layout is the one the caller
// names (--config-version), and the file must then say it: containerd reads a file
// without "version" as version 1 and would not see kl's runtime under the newer layout.
func TestContainerdCommentsOnly(t *testing.T) {
	const orig = "# containerd config, managed by config management.\n# Nothing set yet.\n"
	for _, v := range []int{2, 3} {
		t.Run(fmt.Sprintf("version %d", v), func(t *testing.T) {
			c := Containerd{Version: v}
			got, err := c.Install([]byte(orig))
			if err != nil {
				t.Fatalf("Install: %v", err)
			}
			if !bytes.HasPrefix(got, []byte(orig)) {
				t.Errorf("the comments did not stay first:\n%s", got)
			}
			d, err := parseTOML(got, 0)
			if err != nil {
				t.Fatalf("installed config does not parse: %v\n%s", err, got)
			}
			if d.version != v {
				t.Errorf("installed config reads as version %d, want %d:\n%s", d.version, v, got)
			}
			if bin := klRuntime(t, got, "options", "BinaryName"); bin != DefaultRuntimeBinary {
				t.Errorf("kl's BinaryName = %v, want %s:\n%s", bin, DefaultRuntimeBinary, got)
			}
			again, err := c.Install(got)
			if err != nil || !bytes.Equal(again, got) {
				t.Errorf("second Install = %v:\n%s", err, UnifiedDiff("once", "twice", got, again))
			}
			back, err := c.Uninstall(got)
			if err != nil {
				t.Fatalf("Uninstall: %v", err)
			}
			if want := orig + fmt.Sprintf("version = %d\n", v); string(back) != want {
				t.Errorf("Uninstall = %q, want %q", back, want)
			}
		})
	}
}

// A stale kl entry under the same name is replaced, not duplicated.
func TestInstallReplacesStale(t *testing.T) {
	orig := read(t, "containerd-v3.toml")
	old, err := Containerd{BinaryName: "/opt/old/kl-runtime"}.Install(orig)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Containerd{}.Install(old)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(got, []byte("/opt/old")) || bytes.Count(got, []byte("runtimes.kl]")) != 1 {
		t.Errorf("stale runtime not replaced:\n%s", UnifiedDiff("orig", "got", orig, got))
	}
	back, err := Containerd{}.Uninstall(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, orig) {
		t.Errorf("uninstall after replace:\n%s", UnifiedDiff("orig", "back", orig, back))
	}

	d, err := Docker{}.Install([]byte(`{"runtimes": {"kl": {"path": "/old"}, "crun": {"path": "/usr/bin/crun"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"runtimes": {"kl": {"path": "/usr/bin/kl-runtime"}, "crun": {"path": "/usr/bin/crun"}}}`; string(d) != want {
		t.Errorf("docker replace = %s, want %s", d, want)
	}
}

// Re-installing docker corrects only kl's own key of runtimes.kl, in place, as the
// containerd editor does: the operator's keys there and the runtimes' order stay.
func TestDockerReinstallKeepsOperatorKeys(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"stale path",
			"{\n  \"runtimes\": {\n    \"kl\": {\n      \"path\": \"/opt/old/kl-runtime\",\n      \"runtimeArgs\": [\"--debug\"]\n    },\n    \"crun\": {\"path\": \"/usr/bin/crun\"}\n  }\n}\n",
			"{\n  \"runtimes\": {\n    \"kl\": {\n      \"path\": \"/usr/bin/kl-runtime\",\n      \"runtimeArgs\": [\"--debug\"]\n    },\n    \"crun\": {\"path\": \"/usr/bin/crun\"}\n  }\n}\n"},
		{"no path",
			"{\n  \"runtimes\": {\n    \"kl\": {\n      \"runtimeArgs\": [\"--debug\"]\n    },\n    \"crun\": {\"path\": \"/usr/bin/crun\"}\n  }\n}\n",
			"{\n  \"runtimes\": {\n    \"kl\": {\n      \"runtimeArgs\": [\"--debug\"],\n      \"path\": \"/usr/bin/kl-runtime\"\n    },\n    \"crun\": {\"path\": \"/usr/bin/crun\"}\n  }\n}\n"},
		{"right path already", `{"runtimes": {"kl": {"runtimeArgs": [], "path": "/usr/bin/kl-runtime"}, "crun": {}}}`, `{"runtimes": {"kl": {"runtimeArgs": [], "path": "/usr/bin/kl-runtime"}, "crun": {}}}`},
		{"not an object", `{"runtimes": {"kl": "x", "crun": {}}}`, `{"runtimes": {"kl": {"path":"/usr/bin/kl-runtime"}, "crun": {}}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Docker{}.Install([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("Install:\n%s", UnifiedDiff("want", "got", []byte(tc.want), got))
			}
			if again, err := (Docker{}).Install(got); err != nil || !bytes.Equal(again, got) {
				t.Errorf("second Install = %s, %v", again, err)
			}
		})
	}
	// A runtime defined twice under kl's name (dockerd reads the last): install sets the
	// one dockerd uses, uninstall takes both out.
	got, err := Docker{}.Install([]byte(`{"runtimes": {"kl": {"path": "/a"}, "crun": {}, "kl": {"path": "/b"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"runtimes": {"kl": {"path": "/a"}, "crun": {}, "kl": {"path": "/usr/bin/kl-runtime"}}}`; string(got) != want {
		t.Errorf("Install of a repeated kl = %s, want %s", got, want)
	}
	back, err := Docker{}.Uninstall(got)
	if want := `{"runtimes": {"crun": {}}}`; err != nil || string(back) != want {
		t.Errorf("Uninstall of a repeated kl = %s, %v; want %s", back, err, want)
	}
}

// SystemdCgroup follows the default runtime, so kl's pods use the kubelet's driver.
func TestContainerdSystemdCgroup(t *testing.T) {
	got, err := Containerd{}.Install(read(t, "containerd-v2-kubeadm.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(got, []byte("BinaryName = \"/usr/bin/kl-runtime\"\n            SystemdCgroup = true\n")) {
		t.Errorf("SystemdCgroup not copied from runc:\n%s", got)
	}
}

func TestApply(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "10-calico.conflist")
	orig := read(t, "10-calico.conflist")
	if err := os.WriteFile(path, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	now := func() time.Time { return time.Date(2026, 11, 30, 4, 5, 6, 0, time.UTC) }

	// Dry run: a diff, nothing written.
	ch, err := Apply(path, CNI{}, Options{DryRun: true, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if !ch.Changed || ch.Diff == "" || ch.Backup != "" {
		t.Errorf("dry run = %+v, want a change with a diff and no backup", ch)
	}
	if cur, _ := os.ReadFile(path); !bytes.Equal(cur, orig) {
		t.Error("dry run wrote the file")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("dry run left %d files in the directory", len(ents))
	}

	// The diff is a real patch: applying it gives the installed file (tests/deps.sh
	// installs patch; without it the subtest skips, and fails in CI).
	t.Run("diff applies with patch", func(t *testing.T) {
		testutil.RequireTool(t, "patch")
		cp := filepath.Join(t.TempDir(), "patched")
		if err := os.WriteFile(cp, orig, 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("patch", "-s", cp)
		cmd.Stdin = strings.NewReader(ch.Diff)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("patch: %v\n%s\n%s", err, out, ch.Diff)
		}
		want, _ := CNI{}.Install(orig)
		if got, _ := os.ReadFile(cp); !bytes.Equal(got, want) {
			t.Errorf("patched file differs from Install's output:\n%s", UnifiedDiff("install", "patched", want, got))
		}
	})

	// Install: backup with the old contents, same mode, CNI ignores the backup.
	ch, err = Apply(path, CNI{}, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	wantBackup := path + ".kl-backup-20261130T040506Z"
	if ch.Backup != wantBackup {
		t.Errorf("backup = %q, want %q", ch.Backup, wantBackup)
	}
	if b, _ := os.ReadFile(wantBackup); !bytes.Equal(b, orig) {
		t.Error("backup does not hold the original contents")
	}
	for _, p := range []string{path, wantBackup} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("mode of %s = %v (%v), want 0600", p, st.Mode().Perm(), err)
		}
	}
	if found, err := FindCNIConfig(dir); err != nil || found != path {
		t.Errorf("FindCNIConfig = %q, %v; want %q", found, err, path)
	}

	// Again: nothing to do, no second backup.
	ch, err = Apply(path, CNI{}, Options{Now: now})
	if err != nil || ch.Changed || ch.Backup != "" {
		t.Errorf("second Apply = %+v, %v; want no change", ch, err)
	}

	// Uninstall restores the original bytes, with a second backup beside the first.
	ch, err = Apply(path, CNI{}, Options{Uninstall: true, Now: now})
	if err != nil || !ch.Changed {
		t.Fatalf("uninstall = %+v, %v", ch, err)
	}
	if ch.Backup != wantBackup+".1" {
		t.Errorf("second backup = %q, want %q", ch.Backup, wantBackup+".1")
	}
	if cur, _ := os.ReadFile(path); !bytes.Equal(cur, orig) {
		t.Errorf("uninstall did not restore the original:\n%s", UnifiedDiff("orig", "cur", orig, cur))
	}

	// A missing file: uninstall leaves it missing, install creates it.
	missing := filepath.Join(dir, "docker", "daemon.json")
	if ch, err := Apply(missing, Docker{}, Options{Uninstall: true}); err != nil || ch.Changed {
		t.Errorf("uninstall of a missing file = %+v, %v", ch, err)
	}
	ch, err = Apply(missing, Docker{}, Options{})
	if err != nil || !ch.Created || !ch.Changed {
		t.Fatalf("install into a missing file = %+v, %v", ch, err)
	}
	if st, err := os.Stat(missing); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("created daemon.json: %v %v", st, err)
	}

	// Errors name the file and leave it alone.
	bad := filepath.Join(dir, "bad.conflist")
	if err := os.WriteFile(bad, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(bad, CNI{}, Options{}); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("Apply(bad) error = %v, want one naming %s", err, bad)
	}
}

// Uninstalling from a single-plugin .conf changes nothing: kl is never in one.
func TestCNIUninstallSingleConf(t *testing.T) {
	orig := read(t, "99-single.conf")
	got, err := CNI{}.Uninstall(orig)
	if err != nil || !bytes.Equal(got, orig) {
		t.Fatalf("Uninstall(.conf) = %q, %v; want it unchanged", got, err)
	}
}

func TestFindCNIConfig(t *testing.T) {
	dir := t.TempDir()
	if _, err := FindCNIConfig(dir); err == nil {
		t.Error("empty directory: want an error")
	}
	for _, n := range []string{"99-b.conf", "10-a.conflist.kl-backup-x", "README", "20-c.conflist", "05-z.json"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := FindCNIConfig(dir); err != nil || filepath.Base(got) != "05-z.json" {
		t.Errorf("FindCNIConfig = %q, %v; want 05-z.json", got, err)
	}
}

func TestCopyBinary(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dst, err := CopyBinary(src, filepath.Join(dir, "bin"), "kl-cni")
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dst)
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("installed binary: %v %v", st, err)
	}
	if _, err := CopyBinary(filepath.Join(dir, "nope"), dir, "x"); err == nil {
		t.Error("missing source: want an error")
	}
}

// A symlinked config is edited where it points; the link stays.
func TestApplySymlink(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "managed", "daemon.json")
	if err := os.MkdirAll(filepath.Dir(real), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(real, read(t, "daemon.json"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "daemon.json")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	ch, err := Apply(link, Docker{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if ch.Path != link || filepath.Dir(ch.Backup) != filepath.Dir(real) {
		t.Errorf("change = %+v, want path %s and the backup beside %s", ch, link, real)
	}
	if st, err := os.Lstat(link); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the link was replaced: %v %v", st, err)
	}
	if b, _ := os.ReadFile(real); !bytes.Contains(b, []byte(`"kl"`)) {
		t.Errorf("the target was not edited:\n%s", b)
	}
}

// A key given twice counts as libcni and dockerd read it, with encoding/json: the last
// one. kl edits that one, so that what it installs (or takes out) is what they see.
func TestRepeatedKeyLastWins(t *testing.T) {
	cases := []struct {
		name      string
		in        string
		e         Editor
		uninstall bool
		want      func(m map[string]any) bool
	}{
		{"cni plugins", `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"old"}],"plugins":[{"type":"bridge"}]}`, CNI{}, false,
			func(m map[string]any) bool {
				ps, _ := m["plugins"].([]any)
				last, _ := ps[len(ps)-1].(map[string]any)
				return len(ps) == 2 && last["type"] == "kl-cni"
			}},
		{"docker runtimes", `{"runtimes":{"x":{"path":"/x"}},"runtimes":{"y":{"path":"/y"}}}`, Docker{}, false,
			func(m map[string]any) bool {
				rts, _ := m["runtimes"].(map[string]any)
				return rts["kl"] != nil && rts["y"] != nil
			}},
		{"docker default-runtime", `{"default-runtime":"crun","default-runtime":"runc"}`, Docker{Default: true}, false,
			func(m map[string]any) bool { return m["default-runtime"] == "kl" }},
		{"docker uninstall default-runtime", `{"default-runtime":"runc","default-runtime":"kl","runtimes":{"kl":{"path":"/usr/bin/kl-runtime"}}}`, Docker{}, true,
			func(m map[string]any) bool { return m["default-runtime"] == "runc" && m["runtimes"] == nil }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			edit := tc.e.Install
			if tc.uninstall {
				edit = tc.e.Uninstall
			}
			got, err := edit([]byte(tc.in))
			if err != nil {
				t.Fatalf("uninstall %v: %v", tc.uninstall, err)
			}
			var m map[string]any
			if err := json.Unmarshal(got, &m); err != nil || !tc.want(m) {
				t.Errorf("edit (uninstall %v) of %s =\n%s\nwhich encoding/json reads as %v (err %v)", tc.uninstall, tc.in, got, m, err)
			}
		})
	}
}

// readConfigDir is os.ReadDir without the lock files (LockPath), which stay beside the
// files kl edited.
func readConfigDir(dir string) ([]os.DirEntry, error) {
	ents, err := os.ReadDir(dir)
	kept := ents[:0]
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".kl-lock") {
			kept = append(kept, e)
		}
	}
	return kept, err
}
