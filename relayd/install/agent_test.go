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
	if ents, _ := os.ReadDir(confDir); len(ents) != 1 {
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

// An agent whose kl-cni does not accept the network's cniVersion leaves the conflist
// alone (pods keep starting, without kl) instead of breaking every pod on the node.
func TestCNIAgentVersionMismatch(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "10-flannel.conflist")
	orig := read(t, "10-flannel.conflist") // cniVersion 0.3.1
	if err := os.WriteFile(conf, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	// The probe of the plugin runs under this context too: give a loaded machine time
	// to start the fake plugin, then let the agent loop until the deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err := CNIAgent{ConfDir: dir, BinDir: filepath.Join(dir, "bin"), Binary: fakePlugin(t, dir, "1.0.0", "1.1.0"), Interval: 20 * time.Millisecond}.Run(ctx)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := mustRead(t, conf); !bytes.Equal(got, orig) {
		t.Errorf("kl-cni chained into a network it cannot serve:\n%s", got)
	}
}

// An agent told to uninstall on exit on a node whose network is a single-plugin .conf
// (kl could never be chained into it) exits cleanly: there is nothing to take out.
func TestCNIAgentUninstallSingleConf(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "99-single.conf")
	orig := read(t, "99-single.conf")
	if err := os.WriteFile(conf, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err := CNIAgent{ConfDir: dir, BinDir: filepath.Join(dir, "bin"), Binary: fakePlugin(t, dir, "0.4.0"), Interval: 20 * time.Millisecond, UninstallOnExit: true}.Run(ctx)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := mustRead(t, conf); !bytes.Equal(got, orig) {
		t.Errorf("the .conf changed:\n%s", got)
	}
}

// --uninstall-on-exit takes kl out of every conflist, also one the network plugin no
// longer uses (it renamed its file after kl was chained into the old one).
func TestCNIAgentUninstallEveryConflist(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "10-flannel.conflist")
	orig := read(t, "10-flannel.conflist")
	old := filepath.Join(dir, "20-calico.conflist")
	calico := read(t, "10-calico.conflist")
	withKl, err := CNI{}.Install(calico)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(conf, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(old, withKl, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = CNIAgent{ConfDir: dir, BinDir: filepath.Join(dir, "bin"), Binary: fakePlugin(t, dir, "0.3.1"), Interval: 20 * time.Millisecond, UninstallOnExit: true}.Run(ctx)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := mustRead(t, conf); !bytes.Equal(got, orig) {
		t.Errorf("%s not restored:\n%s", conf, got)
	}
	if got := mustRead(t, old); !bytes.Equal(got, calico) {
		t.Errorf("kl left in %s:\n%s", old, got)
	}
}
