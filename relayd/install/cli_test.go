package install

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	dir := t.TempDir()
	netd := filepath.Join(dir, "net.d")
	if err := os.MkdirAll(netd, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		filepath.Join(netd, "10-flannel.conflist"): "10-flannel.conflist",
		filepath.Join(netd, "20-other.conflist"):   "10-calico.conflist",
		filepath.Join(dir, "config.toml"):          "containerd-v3.toml",
		filepath.Join(dir, "daemon.json"):          "daemon.json",
	}
	orig := map[string][]byte{}
	for dst, src := range files {
		b := read(t, src)
		orig[dst] = b
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	flannel := filepath.Join(netd, "10-flannel.conflist")
	toml, dj := filepath.Join(dir, "config.toml"), filepath.Join(dir, "daemon.json")
	src := fakePlugin(t, dir, "0.3.1", "1.0.0", "1.1.0")
	bin := filepath.Join(dir, "bin")
	old := fakePlugin(t, dir, "1.1.0")

	steps := []struct {
		name     string
		args     []string
		wantOut  string // substring of stdout
		wantErr  string // substring of the error, "" for none
		file     string // file to check afterwards
		original bool   // whether file must hold its original bytes
	}{
		{"no kl-cni installed", []string{"install", "cni", "--cni-conf-dir", netd, "--cni-bin-dir", bin}, "", "kl-cni is not installed", flannel, true},
		{"kl-cni without the network's version", []string{"install", "cni", "--cni-conf-dir", netd, "--cni-binary", old, "--dry-run"}, "", `cniVersion is "0.3.1" but kl-cni supports 1.1.0`, flannel, true},
		{"dry run prints a diff", []string{"install", "cni", "--dry-run", "--cni-conf-dir", netd, "--cni-binary", src}, `+      "type": "kl-cni"`, "", flannel, true},
		{"install cni picks the first conflist", []string{"install", "cni", "--cni-conf-dir", netd, "--cni-bin-dir", bin, "--cni-binary", src, "--conf", `{"mode":"proxy"}`}, `+      "mode": "proxy"`, "", flannel, false},
		{"install cni again", []string{"install", "cni", "--cni-conf-dir", netd, "--cni-bin-dir", bin, "--conf", `{"mode":"proxy"}`}, "", "", flannel, false},
		{"install cni --uninstall", []string{"install", "cni", "--uninstall", "--cni-conf-dir", netd}, `-      "type": "kl-cni",`, "", flannel, true},
		{"the other conflist is untouched", []string{"uninstall", "cni", "--cni-conf-file", filepath.Join(netd, "20-other.conflist")}, "", "", filepath.Join(netd, "20-other.conflist"), true},
		{"install containerd", []string{"install", "containerd", "--config", toml}, "+        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.kl]", "", toml, false},
		{"uninstall containerd", []string{"uninstall", "containerd", "--config", toml}, "-        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.kl]", "", toml, true},
		{"install docker --default", []string{"install", "docker", "--config", dj, "--default", "--runtime-binary", "/opt/kl/kl-runtime"}, `+	"default-runtime": "kl"`, "", dj, false},
		{"uninstall docker", []string{"uninstall", "docker", "--config", dj}, `-	"default-runtime": "kl"`, "", dj, true},
		{"unknown target", []string{"install", "cri-o"}, "", `unknown target "cri-o"`, "", false},
		{"unknown verb", []string{"reinstall", "cni"}, "", `unknown command "reinstall"`, "", false},
		{"bad conf", []string{"install", "cni", "--cni-conf-dir", netd, "--conf", "[1]"}, "", "--conf: want a JSON object", flannel, true},
		{"watch with dry run", []string{"install", "cni", "--watch", "--dry-run"}, "", "--watch installs", "", false},
		{"stray argument", []string{"install", "docker", "--config", dj, "extra"}, "", "unexpected arguments", dj, true},
		{"no conflist", []string{"install", "cni", "--cni-bin-dir", bin, "--cni-conf-dir", bin + "/none"}, "", "read CNI configuration directory", "", false},
	}
	for _, s := range steps {
		var out, errb bytes.Buffer
		err := Run(context.Background(), s.args, &out, &errb)
		switch {
		case s.wantErr == "" && err != nil:
			t.Fatalf("%s: Run(%q): %v\n%s", s.name, s.args, err, errb.String())
		case s.wantErr != "" && (err == nil || !strings.Contains(err.Error(), s.wantErr)):
			t.Fatalf("%s: Run(%q) error = %v, want %q", s.name, s.args, err, s.wantErr)
		}
		if !strings.Contains(out.String(), s.wantOut) {
			t.Errorf("%s: stdout lacks %q:\n%s", s.name, s.wantOut, out.String())
		}
		if s.file != "" {
			cur, _ := os.ReadFile(s.file)
			if same := bytes.Equal(cur, orig[s.file]); same != s.original {
				t.Errorf("%s: %s unchanged = %v, want %v:\n%s", s.name, s.file, same, s.original, cur)
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(bin, "kl-cni")); err != nil || !bytes.Equal(b, mustRead(t, src)) {
		t.Errorf("--cni-binary not copied: %q %v", b, err)
	}
}

// --watch runs the agent until the context ends.
func TestRunWatch(t *testing.T) {
	netd := t.TempDir()
	conf := filepath.Join(netd, "10-flannel.conflist")
	orig := read(t, "10-flannel.conflist")
	if err := os.WriteFile(conf, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	var out, errb bytes.Buffer
	go func() {
		errc <- Run(ctx, []string{"install", "cni", "--watch", "--uninstall-on-exit", "--interval", "10ms", "--cni-conf-dir", netd,
			"--cni-bin-dir", filepath.Join(netd, "bin"), "--cni-binary", fakePlugin(t, t.TempDir(), "0.3.1")}, &out, &errb)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if cur, _ := os.ReadFile(conf); bytes.Contains(cur, []byte("kl-cni")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("--watch never chained kl-cni")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if cur, _ := os.ReadFile(conf); !bytes.Equal(cur, orig) {
		t.Errorf("--uninstall-on-exit left:\n%s", cur)
	}
}

// Uninstalling docker says that the default runtime went back to runc, as the containerd
// uninstall does.
func TestRunDockerUninstallNote(t *testing.T) {
	p := filepath.Join(t.TempDir(), "daemon.json")
	if err := os.WriteFile(p, []byte(`{"default-runtime": "kl", "runtimes": {"kl": {"path": "/usr/bin/kl-runtime"}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if err := Run(context.Background(), []string{"uninstall", "docker", "--config", p}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errb.String(), `"default-runtime" was "kl"; removed`) {
		t.Errorf("kl-ctl did not say it removed the default runtime:\n%s", errb.String())
	}
}

// kl-ctl says what happens to dockerd's default runtime, and where it keeps what
// uninstall puts back; uninstall then gives the file back as it was.
func TestRunDockerDefaultNotes(t *testing.T) {
	p := filepath.Join(t.TempDir(), "daemon.json")
	orig := read(t, "daemon-minimal.json")
	if err := os.WriteFile(p, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		args []string
		want []string // lines of stderr
	}{
		{[]string{"install", "docker", "--config", p, "--default"}, []string{
			p + `: "default-runtime" was "runc"; set to "kl", and uninstall sets it back`,
			p + ": what uninstall puts back is kept in " + StatePath(p)}},
		{[]string{"install", "docker", "--config", p, "--default"}, []string{p + ": kl is already in it; nothing to do"}},
		{[]string{"uninstall", "docker", "--config", p}, []string{p + `: "default-runtime" was "kl"; set back to "runc", as it was before kl was installed`}},
	}
	for _, s := range steps {
		var out, errb bytes.Buffer
		if err := Run(context.Background(), s.args, &out, &errb); err != nil {
			t.Fatalf("Run(%q): %v", s.args, err)
		}
		for _, w := range s.want {
			if !strings.Contains(errb.String(), w+"\n") {
				t.Errorf("Run(%q) stderr lacks %q:\n%s", s.args, w, errb.String())
			}
		}
	}
	if cur := mustRead(t, p); !bytes.Equal(cur, orig) {
		t.Errorf("daemon.json after uninstall:\n%s", UnifiedDiff("original", "now", orig, cur))
	}
}

// kl is never in a single-plugin .conf (it cannot chain anything), so uninstalling when
// the runtime's file is one has nothing to do; it is not an error.
func TestRunUninstallSingleConf(t *testing.T) {
	netd := t.TempDir()
	conf := filepath.Join(netd, "99-single.conf")
	orig := read(t, "99-single.conf")
	if err := os.WriteFile(conf, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"uninstall", "cni", "--cni-conf-dir", netd},
		{"uninstall", "cni", "--cni-conf-file", conf},
	} {
		var out, errb bytes.Buffer
		if err := Run(context.Background(), args, &out, &errb); err != nil {
			t.Fatalf("Run(%q): %v", args, err)
		}
		if want := conf + ": kl is not in it; nothing to do"; !strings.Contains(errb.String(), want) {
			t.Errorf("Run(%q) said %q, want %q", args, errb.String(), want)
		}
		if cur := mustRead(t, conf); !bytes.Equal(cur, orig) || out.Len() != 0 {
			t.Errorf("Run(%q) changed the .conf or printed a diff:\n%s", args, out.String())
		}
	}
}

// uninstall cni takes kl out of every conflist of the directory that chains it, not only
// the one the runtime uses now, and says what it did to each file; --cni-conf-file
// still edits just that file.
func TestRunUninstallEveryConflist(t *testing.T) {
	netd := t.TempDir()
	clean := read(t, "10-flannel.conflist")
	calico := read(t, "10-calico.conflist")
	withKl, err := CNI{}.Install(calico)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"10-flannel.conflist": clean,
		"20-calico.conflist":  withKl,
		"30-calico.conflist":  withKl,
		"99-single.conf":      read(t, "99-single.conf"),
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(netd, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// One file named: only that one.
	var out, errb bytes.Buffer
	if err := Run(context.Background(), []string{"uninstall", "cni", "--cni-conf-file", filepath.Join(netd, "20-calico.conflist")}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, filepath.Join(netd, "20-calico.conflist")); !bytes.Equal(got, calico) {
		t.Errorf("--cni-conf-file: kl not taken out:\n%s", got)
	}
	if got := mustRead(t, filepath.Join(netd, "30-calico.conflist")); !bytes.Equal(got, withKl) {
		t.Errorf("--cni-conf-file edited another file:\n%s", got)
	}

	out.Reset()
	errb.Reset()
	if err := os.WriteFile(filepath.Join(netd, "20-calico.conflist"), withKl, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Run(context.Background(), []string{"uninstall", "cni", "--cni-conf-dir", netd}, &out, &errb); err != nil {
		t.Fatalf("%v\n%s", err, errb.String())
	}
	for n, want := range map[string][]byte{"10-flannel.conflist": clean, "20-calico.conflist": calico, "30-calico.conflist": calico, "99-single.conf": files["99-single.conf"]} {
		if got := mustRead(t, filepath.Join(netd, n)); !bytes.Equal(got, want) {
			t.Errorf("%s after uninstall:\n%s", n, UnifiedDiff("want", "got", want, got))
		}
	}
	for _, want := range []string{
		filepath.Join(netd, "10-flannel.conflist") + ": kl is not in it; nothing to do",
		filepath.Join(netd, "20-calico.conflist") + ": written; previous contents in ",
		filepath.Join(netd, "30-calico.conflist") + ": written; previous contents in ",
		filepath.Join(netd, "99-single.conf") + ": kl is not in it; nothing to do",
	} {
		if !strings.Contains(errb.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errb.String())
		}
	}
	if n := strings.Count(out.String(), `-      "type": "kl-cni",`); n != 2 {
		t.Errorf("stdout has %d diffs removing kl-cni, want 2:\n%s", n, out.String())
	}
}
