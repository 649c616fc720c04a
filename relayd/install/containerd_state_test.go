package install

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// defaultLine is the default_runtime_name line of the containerd-v*-default.toml files.
var defaultLine = regexp.MustCompile(`(?m)^ *default_runtime_name = .*\n`)

// priorDefault rewrites the default_runtime_name of a test config: to value (quoted
// as the file quotes it), or, with value "absent", removes the line.
func priorDefault(t *testing.T, data []byte, value string) []byte {
	t.Helper()
	if !defaultLine.Match(data) {
		t.Fatalf("no default_runtime_name line in\n%s", data)
	}
	return defaultLine.ReplaceAllFunc(data, func(l []byte) []byte {
		if value == "absent" {
			return nil
		}
		return regexp.MustCompile(`(["'])runc(["'])`).ReplaceAll(l, []byte("${1}"+value+"${2}"))
	})
}

// install --default remembers the default_runtime_name it replaces (beside config.toml,
// in StatePath) and uninstall puts exactly that back, in place: the file is byte for
// byte what it was, however many times kl was installed in between. The installed
// config.toml and state file are golden, per layout and prior default.
func TestContainerdDefaultRestore(t *testing.T) {
	cases := []struct {
		name  string
		prior string // default_runtime_name before install: "runc", "", or "absent"
		steps []string
	}{
		{"prior-runc", "runc", []string{stepDefault, stepUninstall}},
		{"prior-empty", "", []string{stepDefault, stepUninstall}},
		{"prior-absent", "absent", []string{stepDefault, stepUninstall}},
		{"reinstall-twice", "runc", []string{stepDefault, stepDefault, stepDefault, stepUninstall}},
		{"reinstall-twice-absent", "absent", []string{stepDefault, stepDefault, stepDefault, stepUninstall}},
		{"reinstall-without-default", "runc", []string{stepDefault, stepInstall, stepUninstall}},
		{"uninstall-twice", "runc", []string{stepDefault, stepUninstall, stepUninstall}},
		{"uninstall-twice-absent", "absent", []string{stepDefault, stepUninstall, stepUninstall}},
	}
	for _, layout := range []string{"v2", "v3"} {
		for _, tc := range cases {
			t.Run(layout+"/"+tc.name, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "config.toml")
				orig := read(t, "containerd-"+layout+"-default.toml")
				if tc.prior != "runc" {
					orig = priorDefault(t, orig, tc.prior)
				}
				prior := cmp.Or(tc.prior, "empty")
				restoreSteps(t, path, orig, "containerd-state/"+layout+"-prior-"+prior+".installed", tc.steps,
					func(def bool) Editor { return Containerd{Default: def} })
				// install --default makes kl the default as the parser reads it, too.
				if _, err := Apply(path, Containerd{Default: true}, Options{NoBackup: true}); err != nil {
					t.Fatal(err)
				}
				if got := (Containerd{}).currentDefault(mustRead(t, path)); got != "kl" {
					t.Errorf("default_runtime_name after install --default = %q, want kl", got)
				}
			})
		}
	}
}

// install --default takes over only a runc, empty or absent default: kl-runtime execs
// runc, so replacing another default runtime would change how every pod runs. It says
// what is in the way, and writes nothing.
func TestContainerdDefaultRefused(t *testing.T) {
	cases := []struct {
		name, file, prior, want string
	}{
		{"v2 crun", "containerd-v2-default.toml", "crun", `default_runtime_name is "crun"; kl would replace it`},
		{"v2 nvidia", "containerd-v2-default.toml", "nvidia", `default_runtime_name is "nvidia"; kl would replace it`},
		{"v3 runsc", "containerd-v3-default.toml", "runsc", `default_runtime_name is "runsc"; kl would replace it`},
		{"v3 kl-gpu", "containerd-v3-default.toml", "kl-gpu", `default_runtime_name is "kl-gpu"; kl would replace it`},
		{"containerd table as dotted keys", "containerd-v2-dotted.toml", "", `[plugins."io.containerd.grpc.v1.cri".containerd] is not written as a table kl can add the key to`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "config.toml")
			in := read(t, tc.file)
			if tc.prior != "" {
				in = priorDefault(t, in, tc.prior)
			}
			if err := os.WriteFile(path, in, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Apply(path, Containerd{Default: true}, Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("Apply error = %v, want one naming %s and saying %q", err, path, tc.want)
			}
			if got := mustRead(t, path); !bytes.Equal(got, in) {
				t.Errorf("config.toml written despite the error:\n%s", UnifiedDiff("before", "after", in, got))
			}
			if ents, _ := readConfigDir(dir); len(ents) != 1 {
				t.Errorf("%d files in the directory after a refused install, want only config.toml", len(ents))
			}
		})
	}
}

// install --default into a config with no [….containerd] table of its own (only
// `version = 2` or 3, or a CRI plugin table, or runtimes alone) adds the table, holding
// default_runtime_name, before the first of its sub-tables, as it adds the runtimes
// tables kl needs; its state file says so, and uninstall takes the table out again with
// the key: the file is byte for byte what it was. (Before, install --default refused
// such a config.)
func TestContainerdDefaultNoTable(t *testing.T) {
	const runc = "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
	cases := []struct {
		name string
		in   string
	}{
		{"v2-version-only", "version = 2\n"},
		{"v3-version-only", "version = 3\n"},
		{"v2-minimal", string(read(t, "containerd-v2-minimal.toml"))},
		{"v2-runtimes-only", "version = 2\n\n" + runc},
		{"v3-single-quotes", "version = 3\n\n[plugins.'io.containerd.cri.v1.runtime']\n  enable_selinux = false\n"},
		{"v1-cri-only", "[plugins.cri]\n  sandbox_image = \"registry.k8s.io/pause:3.9\"\n"},
	}
	steps := []string{stepDefault, stepDefault, stepInstall, stepUninstall, stepUninstall}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.toml")
			restoreSteps(t, path, []byte(tc.in), "containerd-state/"+tc.name+".installed", steps,
				func(def bool) Editor { return Containerd{Default: def} })
		})
	}
	// A table the operator has put keys in since stays, without kl's default.
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte("version = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(path, Containerd{Default: true}, Options{NoBackup: true}); err != nil {
		t.Fatal(err)
	}
	cur := mustRead(t, path)
	hdr := "[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n"
	if !bytes.Contains(cur, []byte(hdr)) {
		t.Fatalf("no %s after install --default:\n%s", hdr, cur)
	}
	mine := bytes.Replace(cur, []byte(hdr), []byte(hdr+"  snapshotter = \"overlayfs\"\n"), 1)
	if err := os.WriteFile(path, mine, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Apply(path, Containerd{}, Options{Uninstall: true, NoBackup: true}); err != nil {
		t.Fatal(err)
	}
	want := "version = 2\n\n" + hdr + "  snapshotter = \"overlayfs\"\n"
	if got := mustRead(t, path); string(got) != want {
		t.Errorf("after uninstall:\n%s", UnifiedDiff("want", "got", []byte(want), got))
	}
}

// A state file kl cannot read is named, and nothing is written, installing or
// uninstalling.
func TestContainerdBadState(t *testing.T) {
	in := priorDefault(t, read(t, "containerd-v3-default.toml"), "kl")
	states := []string{`[]`, `{"runtime": "kl", "default-runtime": 5}`, `{"runtime": "kl", "default-runtime": "crun"}`,
		`{"runtime": "kl", "default_runtime_name": "runc"}`, `{"default-runtime": "runc"}`, `{`, "runtime = 'kl'\n"}
	for _, state := range states {
		for _, uninstall := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/uninstall=%v", state, uninstall), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "config.toml")
				if err := os.WriteFile(path, in, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(StatePath(path), []byte(state), 0o644); err != nil {
					t.Fatal(err)
				}
				_, err := Apply(path, Containerd{Default: !uninstall}, Options{Uninstall: uninstall, NoBackup: true})
				if err == nil || !strings.Contains(err.Error(), StatePath(path)) || !errors.Is(err, errBadState) {
					t.Errorf("Apply error = %v, want one naming %s", err, StatePath(path))
				}
				if got := mustRead(t, path); !bytes.Equal(got, in) {
					t.Errorf("config.toml written despite the error:\n%s", UnifiedDiff("before", "after", in, got))
				}
				if got := mustRead(t, StatePath(path)); string(got) != state {
					t.Errorf("state file changed despite the error: %q", got)
				}
			})
		}
	}
}

// kl-ctl install containerd --default says what happens to the default runtime and
// where it keeps what uninstall puts back; uninstall then gives the file back as it was.
func TestRunContainerdDefaultNotes(t *testing.T) {
	cases := []struct {
		prior   string
		install string // note of the install
		un      string // note of the uninstall
	}{
		{"runc", `default_runtime_name was "runc"; set to "kl", and uninstall sets it back`, `default_runtime_name was "kl"; set back to "runc", as it was before kl was installed`},
		{"", `default_runtime_name was ""; set to "kl", and uninstall sets it back`, `default_runtime_name was "kl"; set back to "", as it was before kl was installed`},
		{"absent", `default_runtime_name set to "kl"; uninstall removes it again`, `default_runtime_name was "kl"; removed, as it was before kl was installed`},
	}
	for _, tc := range cases {
		t.Run(tc.prior, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "config.toml")
			orig := read(t, "containerd-v2-default.toml")
			if tc.prior != "runc" {
				orig = priorDefault(t, orig, tc.prior)
			}
			if err := os.WriteFile(p, orig, 0o644); err != nil {
				t.Fatal(err)
			}
			steps := []struct {
				args []string
				want []string // lines of stderr
			}{
				{[]string{"install", "containerd", "--config", p, "--default"}, []string{
					p + ": " + tc.install,
					p + ": what uninstall puts back is kept in " + StatePath(p)}},
				{[]string{"install", "containerd", "--config", p, "--default"}, []string{p + ": kl is already in it; nothing to do"}},
				{[]string{"uninstall", "containerd", "--config", p}, []string{p + ": " + tc.un}},
			}
			for _, s := range steps {
				var out, errb bytes.Buffer
				if err := Run(context.Background(), s.args, &out, &errb); err != nil {
					t.Fatalf("Run(%q): %v", s.args, err)
				}
				for _, w := range s.want {
					if !strings.Contains(errb.String(), w) {
						t.Errorf("Run(%q) stderr lacks %q:\n%s", s.args, w, errb.String())
					}
				}
			}
			if cur := mustRead(t, p); !bytes.Equal(cur, orig) {
				t.Errorf("config.toml after uninstall:\n%s", UnifiedDiff("original", "now", orig, cur))
			}
			if _, err := os.Stat(StatePath(p)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("state file after uninstall: %v, want it gone", err)
			}
		})
	}
}

// uninstall containerd says where the default_runtime_name it sets comes from: the
// value install --default recorded (also when that is runc), or, with no record (kl
// made the default by hand), runc because containerd needs a defined default. Only one
// note is printed.
func TestRunContainerdUninstallNotes(t *testing.T) {
	const noRecord = `default_runtime_name was "kl"; set to "runc" (containerd's CRI plugin does not start with a default runtime that is not defined)`
	cases := []struct {
		name    string
		install bool   // install --default first (else default_runtime_name = "kl" by hand)
		want    string // the note of the uninstall
	}{
		{"recorded runc", true, `default_runtime_name was "kl"; set back to "runc", as it was before kl was installed`},
		{"no record", false, noRecord},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "config.toml")
			orig := read(t, "containerd-v2-default.toml")
			in := orig
			if !tc.install {
				if in, _ = (Containerd{}).Install(orig); in == nil {
					t.Fatal("Install failed")
				}
				in = priorDefault(t, in, "kl")
			}
			if err := os.WriteFile(p, in, 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.install {
				if err := Run(context.Background(), []string{"install", "containerd", "--config", p, "--default"}, io.Discard, io.Discard); err != nil {
					t.Fatal(err)
				}
			}
			var out, errb bytes.Buffer
			if err := Run(context.Background(), []string{"uninstall", "containerd", "--config", p}, &out, &errb); err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(errb.String(), "default_runtime_name"); n != 1 || !strings.Contains(errb.String(), p+": "+tc.want+"\n") {
				t.Errorf("uninstall said (%d notes about the default):\n%s\nwant the note %q", n, errb.String(), tc.want)
			}
			if cur := mustRead(t, p); !bytes.Equal(cur, orig) {
				t.Errorf("config.toml after uninstall:\n%s", UnifiedDiff("original", "now", orig, cur))
			}
		})
	}
}

// More layouts round-trip through install --default and uninstall: a [….containerd]
// table with no keys (the added key is its only one), a file without a newline at its
// end (which install adds, and uninstall keeps), and the version 1 layout.
func TestContainerdDefaultLayouts(t *testing.T) {
	const runc = "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
	cases := []struct {
		name, in, want string // want: after uninstall; in when ""
	}{
		{"empty table", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n" + runc, ""},
		{"empty table last", "version = 2\n" + runc + "[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n", ""},
		{"no newline at the end", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n"},
		{"v1 absent", string(read(t, "containerd-v1.toml")), ""},
		{"v1 runc", "[plugins.cri.containerd]\n  default_runtime_name = 'runc' # v1\n", ""},
		{"v3 empty", "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = ''\n", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			if want == "" {
				want = tc.in
			}
			dir := t.TempDir()
			path := filepath.Join(dir, "config.toml")
			if err := os.WriteFile(path, []byte(tc.in), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := Apply(path, Containerd{Default: true}, Options{NoBackup: true}); err != nil {
				t.Fatal(err)
			}
			if got := (Containerd{}).currentDefault(mustRead(t, path)); got != "kl" {
				t.Errorf("default_runtime_name after install --default = %q, want kl:\n%s", got, mustRead(t, path))
			}
			if _, err := Apply(path, Containerd{}, Options{Uninstall: true, NoBackup: true}); err != nil {
				t.Fatal(err)
			}
			if got := mustRead(t, path); string(got) != want {
				t.Errorf("after uninstall:\n%s", UnifiedDiff("want", "got", []byte(want), got))
			}
			if ents, _ := readConfigDir(dir); len(ents) != 1 {
				t.Errorf("%d files in the directory after uninstall, want only config.toml", len(ents))
			}
		})
	}
}
