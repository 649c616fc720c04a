package install

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
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
	src := filepath.Join(dir, "kl-cni")
	if err := os.WriteFile(src, []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
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
	if b, err := os.ReadFile(filepath.Join(binDir, "kl-cni")); err != nil || string(b) != "binary" {
		t.Errorf("kl-cni binary: %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(confDir); len(ents) != 1 {
		t.Errorf("the agent left %d files in the conf dir, want only the conflist", len(ents))
	}
}
