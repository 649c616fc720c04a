package install

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/kl-egress/kl/tests/testutil"
	"golang.org/x/sys/unix"
)

// inReadOnlyDir runs fn where dir is read-only: on a thread of its own in a mount
// namespace of its own, with dir bind-mounted read-only over itself (chmod does not stop
// root). The namespace, and the mount, end with the thread.
func inReadOnlyDir(t *testing.T, dir string, fn func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.Unavailable(t, "not root: cannot mount a read-only directory")
		return
	}
	setup := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread, in its namespace, exits with this goroutine
		err := unix.Unshare(unix.CLONE_NEWNS)
		if err == nil {
			err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "")
		}
		if err == nil {
			err = unix.Mount(dir, dir, "", unix.MS_BIND, "")
		}
		if err == nil {
			err = unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
		}
		setup <- err
		if err == nil {
			fn()
		}
	}()
	if err := <-setup; err != nil {
		<-done
		testutil.Unavailable(t, "cannot mount a read-only directory: "+err.Error())
		return
	}
	<-done
}

// In a directory kl cannot write in (a read-only /etc, or an operator without the right
// to write there), an install or uninstall that finds nothing to change says so, as a
// dry run does: it only reads, and needs no lock file. One that has to write fails with
// an error naming the directory, and writes nothing. (Before, every one of them failed
// to create the lock file, even with nothing to do.)
func TestApplyReadOnlyDir(t *testing.T) {
	klIn := func(t *testing.T, e Editor, name string) []byte {
		b, err := e.Install(read(t, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name    string
		file    string
		content func(t *testing.T) []byte
		editor  Editor
		opts    Options
		changed bool
		write   bool // the edit has to write: it fails
	}{
		{"install, kl already in", "config.toml", func(t *testing.T) []byte { return klIn(t, Containerd{}, "containerd-v2.toml") },
			Containerd{}, Options{}, false, false},
		{"install cni, kl already in", "10-calico.conflist", func(t *testing.T) []byte { return klIn(t, CNI{}, "10-calico.conflist") },
			CNI{}, Options{}, false, false},
		{"uninstall, kl not in", "daemon.json", func(t *testing.T) []byte { return read(t, "daemon.json") },
			Docker{}, Options{Uninstall: true}, false, false},
		{"dry run", "config.toml", func(t *testing.T) []byte { return read(t, "containerd-v2.toml") },
			Containerd{}, Options{DryRun: true}, true, false},
		{"install", "config.toml", func(t *testing.T) []byte { return read(t, "containerd-v2.toml") },
			Containerd{}, Options{}, true, true},
		{"uninstall", "daemon.json", func(t *testing.T) []byte { return klIn(t, Docker{}, "daemon.json") },
			Docker{}, Options{Uninstall: true}, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "etc")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, tc.file)
			orig := tc.content(t)
			if err := os.WriteFile(path, orig, 0o644); err != nil {
				t.Fatal(err)
			}
			var ch Change
			var err error
			inReadOnlyDir(t, dir, func() { ch, err = Apply(path, tc.editor, tc.opts) })
			switch {
			case tc.write:
				if !errors.Is(err, syscall.EROFS) || !strings.Contains(err.Error(), "cannot write in "+dir+":") {
					t.Errorf("Apply = %v; want an error saying it cannot write in %s (read-only file system)", err, dir)
				}
			case err != nil:
				t.Errorf("Apply = %v; want no error (nothing to write)", err)
			case ch.Changed != tc.changed:
				t.Errorf("Changed = %v, want %v", ch.Changed, tc.changed)
			}
			if cur := mustRead(t, path); !bytes.Equal(cur, orig) {
				t.Errorf("the file changed:\n%s", UnifiedDiff("before", "after", orig, cur))
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Errorf("%d files in the directory, want only %s", len(ents), tc.file)
			}
		})
	}
}
