package install

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Installers editing one file at the same time (kl-ctl by hand and the DaemonSet's
// agent, or two kl-ctl) take turns: no edit is lost. Each editor adds its own entry, so
// a lost edit shows as an entry missing after the installs (or left after the
// uninstalls). afterRead widens the window between reading and writing that an unlocked
// Apply would lose an edit in.
func TestApplyConcurrent(t *testing.T) {
	old := afterRead
	afterRead = func() { time.Sleep(2 * time.Millisecond) }
	t.Cleanup(func() { afterRead = old })
	cases := []struct {
		name string
		file string
		eds  []Editor
	}{
		{"docker", "daemon.json", []Editor{Docker{Name: "kl-a"}, Docker{Name: "kl-b"}, Docker{Name: "kl-c"}}},
		{"docker default and runtimes", "daemon-minimal.json", []Editor{Docker{Name: "kl-a", Default: true}, Docker{Name: "kl-b"}, Docker{Name: "kl-c"}}},
		{"containerd", "containerd-v2.toml", []Editor{Containerd{Name: "kl-a"}, Containerd{Name: "kl-b"}, Containerd{Name: "kl-c"}}},
		{"cni", "10-calico.conflist", []Editor{CNI{Type: "kl-a"}, CNI{Type: "kl-b"}, CNI{Type: "kl-c"}}},
	}
	const rounds = 5
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, filepath.Base(tc.file))
			orig := read(t, tc.file)
			if err := os.WriteFile(path, orig, 0o644); err != nil {
				t.Fatal(err)
			}
			all := func(uninstall bool) {
				t.Helper()
				var wg sync.WaitGroup
				errs := make([]error, len(tc.eds))
				for i, e := range tc.eds {
					wg.Go(func() {
						_, errs[i] = Apply(path, e, Options{Uninstall: uninstall, NoBackup: true})
					})
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					t.Fatal(err)
				}
			}
			for i := range rounds {
				all(false)
				cur := mustRead(t, path)
				for _, e := range tc.eds {
					// An editor's entry is there when taking it out changes the file.
					if out, err := e.Uninstall(cur); err != nil || bytes.Equal(out, cur) {
						t.Fatalf("round %d: the install of %+v was lost (%v); the file is\n%s", i, e, err, cur)
					}
				}
				all(true)
				if cur := mustRead(t, path); !bytes.Equal(cur, orig) {
					t.Fatalf("round %d: an uninstall was lost:\n%s", i, UnifiedDiff("original", "now", orig, cur))
				}
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 2 {
				t.Errorf("%d files left in the directory, want the config and its lock file", len(ents))
			}
		})
	}
}

// While another installer holds a file's lock, Apply waits at most LockWait and then
// fails with an error that names the lock file, writing nothing; kl-ctl's installs and
// the agent alike. A lock file left by a holder that died does not block.
func TestApplyLocked(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "10-calico.conflist")
	orig := read(t, "10-calico.conflist")
	if err := os.WriteFile(conf, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	lock := LockPath(conf)
	if want := filepath.Join(dir, ".10-calico.conflist.kl-lock"); lock != want {
		t.Fatalf("LockPath = %s, want %s", lock, want)
	}
	unlock, err := lockFile(lock, conf, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const wait = time.Millisecond
	agent := CNIAgent{LockWait: wait, Log: slog.New(slog.DiscardHandler)}
	cases := []struct {
		name  string
		apply func() error
	}{
		{"install", func() error { _, err := Apply(conf, CNI{}, Options{LockWait: wait}); return err }},
		{"uninstall", func() error { _, err := Apply(conf, CNI{}, Options{Uninstall: true, LockWait: wait}); return err }},
		{"uninstall every conflist", func() error {
			_, err := UninstallCNIDir(dir, CNI{}, Options{LockWait: wait})
			return err
		}},
		{"agent", func() error { return agent.once(dir, CNI{}, agent.Log) }},
		{"agent uninstall", func() error { return agent.uninstall(dir, agent.Log) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.apply()
			var le *LockedError
			if !errors.Is(err, ErrLocked) || !errors.As(err, &le) || le.Lock != lock || !strings.Contains(err.Error(), lock) {
				t.Fatalf("error = %v, want ErrLocked naming %s", err, lock)
			}
			if cur := mustRead(t, conf); !bytes.Equal(cur, orig) {
				t.Errorf("the file was written while locked:\n%s", cur)
			}
		})
	}
	// A dry run reads only, and takes no lock.
	if ch, err := Apply(conf, CNI{}, Options{DryRun: true, LockWait: wait}); err != nil || !ch.Changed {
		t.Errorf("dry run while locked = %+v, %v; want the change", ch, err)
	}
	unlock()
	if _, err := Apply(conf, CNI{}, Options{LockWait: wait}); err != nil {
		t.Fatalf("Apply after unlock: %v", err)
	}
}

// The lock file is created once and stays: an edit, even one that changes nothing,
// adds no create or remove event to the directory (containerd reloads its CNI
// configuration on such events in /etc/cni/net.d, and the agent edits every few
// seconds). An uninstall of a file that is not there leaves no lock file.
func TestLockFileStays(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "10-calico.conflist")
	if err := os.WriteFile(conf, read(t, "10-calico.conflist"), 0o644); err != nil {
		t.Fatal(err)
	}
	var first os.FileInfo
	for i, uninstall := range []bool{false, false, true, true, false} {
		if _, err := Apply(conf, CNI{}, Options{Uninstall: uninstall, NoBackup: true}); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(LockPath(conf))
		if err != nil {
			t.Fatalf("edit %d (uninstall %v): %v", i, uninstall, err)
		}
		if first == nil {
			first = fi
		} else if !os.SameFile(first, fi) {
			t.Errorf("edit %d (uninstall %v) replaced the lock file", i, uninstall)
		}
	}
	missing := filepath.Join(dir, "20-none.conflist")
	if _, err := Apply(missing, CNI{}, Options{Uninstall: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(LockPath(missing)); err == nil {
		t.Errorf("uninstall of a missing file left %s", LockPath(missing))
	}
}

// The lock of a symlinked config is the one beside the file it points to, so that
// edits through the link and through the file take turns.
func TestLockPathSymlink(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "managed", "daemon.json")
	if err := os.MkdirAll(filepath.Dir(real), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(real, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "daemon.json")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	unlock, err := lockFile(LockPath(real), real, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if _, err := Apply(link, Docker{}, Options{LockWait: time.Millisecond}); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), LockPath(real)) {
		t.Errorf("Apply through the link while the file is locked = %v, want ErrLocked naming %s", err, LockPath(real))
	}
}
