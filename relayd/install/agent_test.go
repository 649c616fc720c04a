package install

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The agent chains kl-cni in, puts it back when the network plugin rewrites its
// conflist, and takes it out when told to stop.
func TestCNIAgent(t *testing.T) {
	dir := t.TempDir()
	confDir, binDir := filepath.Join(dir, "net.d"), filepath.Join(dir, "bin")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	src := fakePlugin(t, dir, "0.3.1", "1.0.0")
	conf := filepath.Join(confDir, "10-calico.conflist")
	orig := read(t, "10-calico.conflist")
	installed, err := CNI{}.Install(orig)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- CNIAgent{ConfDir: confDir, BinDir: binDir, Binary: src, Interval: 10 * time.Millisecond, UninstallOnExit: true}.Run(ctx)
	}()
	waitFor := func(what string, want []byte) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			got, _ := os.ReadFile(conf)
			if bytes.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: conflist is\n%s", what, got)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The network plugin writes its config after the agent started.
	time.Sleep(30 * time.Millisecond)
	if err := os.WriteFile(conf, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("first install", installed)
	// The network plugin restarts and rewrites it.
	if err := os.WriteFile(conf, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("after a rewrite", installed)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if got, _ := os.ReadFile(conf); !bytes.Equal(got, orig) {
		t.Errorf("not uninstalled on exit:\n%s", got)
	}
	if b, err := os.ReadFile(filepath.Join(binDir, "kl-cni")); err != nil || !bytes.Equal(b, mustRead(t, src)) {
		t.Errorf("kl-cni binary: %q, %v", b, err)
	}
	if ents, _ := readConfigDir(confDir); len(ents) != 1 {
		t.Errorf("the agent left %d files in the conf dir, want only the conflist", len(ents))
	}
}

// fakePlugin writes a kl-cni stand-in into dir that answers CNI VERSION with versions.
func fakePlugin(t *testing.T, dir string, versions ...string) string {
	t.Helper()
	p := filepath.Join(dir, "kl-cni-"+strings.Join(versions, "-"))
	script := "#!/bin/sh\n[ \"$CNI_COMMAND\" = VERSION ] || exit 1\necho '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"" + strings.Join(versions, "\",\"") + "\"]}'\n"
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runAgent writes files into a fresh conf dir and runs a CNI agent there, with a kl-cni
// that answers versions, until timeout. It returns the conf dir.
func runAgent(t *testing.T, files map[string][]byte, versions []string, timeout time.Duration, uninstallOnExit bool) string {
	t.Helper()
	dir := t.TempDir()
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	a := CNIAgent{ConfDir: dir, BinDir: filepath.Join(dir, "bin"), Binary: fakePlugin(t, dir, versions...), Interval: 20 * time.Millisecond, UninstallOnExit: uninstallOnExit}
	if err := a.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	return dir
}

// An agent whose kl-cni does not accept the network's cniVersion leaves the conflist
// alone (pods keep starting, without kl) instead of breaking every pod on the node.
func TestCNIAgentVersionMismatch(t *testing.T) {
	orig := read(t, "10-flannel.conflist") // cniVersion 0.3.1
	// The probe of the plugin runs under the agent's context too: give a loaded machine
	// time to start the fake plugin, then let the agent loop until the deadline.
	dir := runAgent(t, map[string][]byte{"10-flannel.conflist": orig}, []string{"1.0.0", "1.1.0"}, 3*time.Second, false)
	if got := mustRead(t, filepath.Join(dir, "10-flannel.conflist")); !bytes.Equal(got, orig) {
		t.Errorf("kl-cni chained into a network it cannot serve:\n%s", got)
	}
}

// An agent told to uninstall on exit on a node whose network is a single-plugin .conf
// (kl could never be chained into it) exits cleanly: there is nothing to take out.
func TestCNIAgentUninstallSingleConf(t *testing.T) {
	orig := read(t, "99-single.conf")
	dir := runAgent(t, map[string][]byte{"99-single.conf": orig}, []string{"0.4.0"}, 500*time.Millisecond, true)
	if got := mustRead(t, filepath.Join(dir, "99-single.conf")); !bytes.Equal(got, orig) {
		t.Errorf("the .conf changed:\n%s", got)
	}
}

// --uninstall-on-exit takes kl out of every conflist, also one the network plugin no
// longer uses (it renamed its file after kl was chained into the old one).
func TestCNIAgentUninstallEveryConflist(t *testing.T) {
	orig := read(t, "10-flannel.conflist")
	calico := read(t, "10-calico.conflist")
	withKl, err := CNI{}.Install(calico)
	if err != nil {
		t.Fatal(err)
	}
	dir := runAgent(t, map[string][]byte{"10-flannel.conflist": orig, "20-calico.conflist": withKl}, []string{"0.3.1"}, 500*time.Millisecond, true)
	conf, old := filepath.Join(dir, "10-flannel.conflist"), filepath.Join(dir, "20-calico.conflist")
	if got := mustRead(t, conf); !bytes.Equal(got, orig) {
		t.Errorf("%s not restored:\n%s", conf, got)
	}
	if got := mustRead(t, old); !bytes.Equal(got, calico) {
		t.Errorf("kl left in %s:\n%s", old, got)
	}
}

// While the agent cannot chain kl-cni into the configuration runtimes use (Multus's
// single-plugin .conf sorts first), the readiness check fails; once that file is gone
// the agent chains kl-cni into the conflist and the check passes.
func TestCNIAgentReadiness(t *testing.T) {
	dir := t.TempDir()
	confDir, binDir := filepath.Join(dir, "net.d"), filepath.Join(dir, "bin")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		t.Fatal(err)
	}
	multus := filepath.Join(confDir, "00-multus.conf")
	if err := os.WriteFile(multus, []byte(`{"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(confDir, "10-calico.conflist"), read(t, "10-calico.conflist"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- CNIAgent{ConfDir: confDir, BinDir: binDir, Binary: fakePlugin(t, dir, "0.3.1"), Interval: 10 * time.Millisecond}.Run(ctx)
	}()
	check := func() error {
		return Run(ctx, []string{"install", "cni", "--check", "--cni-conf-dir", confDir, "--cni-bin-dir", binDir}, io.Discard, io.Discard)
	}
	waitCheck := func(what string, ok bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			err := check()
			if (err == nil) == ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: check = %v, want ok = %v", what, err, ok)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Give the agent time to install kl-cni and try the .conf a few times.
	time.Sleep(100 * time.Millisecond)
	waitCheck("with 00-multus.conf first", false)
	if err := check(); !errors.Is(err, ErrNotChained) || !strings.Contains(err.Error(), "single-plugin") {
		t.Errorf("check = %v, want a single-plugin ErrNotChained", err)
	}
	if err := os.Remove(multus); err != nil {
		t.Fatal(err)
	}
	waitCheck("after 00-multus.conf is gone", true)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
