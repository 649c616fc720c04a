// Package install puts kl into a node's existing configuration and takes it out again:
// the kl-cni entry of the CNI conflist, the kl runtime of containerd's config.toml and of
// dockerd's daemon.json. Every edit is idempotent, touches only kl's own entry (the rest
// of the file keeps its bytes: order, comments, formatting), is checked by re-parsing
// the result and comparing it with the original, keeps a timestamped backup, and comes
// with a unified diff so `kl-ctl install … --dry-run` can show what would change.
//
// It does not restart containerd or dockerd, and it does not install packages; kl-ctl
// and the Kubernetes install-cni container call it.
package install

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kl-egress/kl/atomicfile"
)

// Where the things kl edits live on a stock node.
const (
	DefaultCNIConfDir       = "/etc/cni/net.d"
	DefaultCNIBinDir        = "/opt/cni/bin"
	DefaultContainerdConfig = "/etc/containerd/config.toml"
	DefaultDockerConfig     = "/etc/docker/daemon.json"
	DefaultRuntimeBinary    = "/usr/bin/kl-runtime"
	DefaultRuntimeName      = "kl"
	DefaultCNIType          = "kl-cni"
)

// Editor turns the bytes of one configuration file into its form with kl installed, or
// uninstalled. Both directions are idempotent, and Uninstall(Install(x)) == x for a file
// that did not hold kl before; for an edit that replaces one of the operator's values
// (docker or containerd --default), fills daemon.json's empty "runtimes", or creates the
// file, only through Apply, which records what uninstall needs in StatePath.
type Editor interface {
	Install(old []byte) ([]byte, error)
	Uninstall(old []byte) ([]byte, error)
}

// noter is an Editor that explains what an edit changed beyond kl's own entry (kl-ctl
// prints the notes). st is what the state file recorded before the edit (nil: nothing).
type noter interface {
	notes(old, next []byte, uninstall bool, st *defaultState) []string
}

// Options control how Apply writes.
type Options struct {
	Uninstall bool             // take kl out instead of putting it in
	DryRun    bool             // compute the change and its diff, write nothing
	NoBackup  bool             // write without keeping the previous contents
	Now       func() time.Time // clock for the backup's name; time.Now when nil
	// LockWait is how long Apply waits for another kl install or uninstall of the same
	// file to finish (DefaultLockWait when zero) before it gives up with a LockedError.
	LockWait time.Duration
}

// DefaultLockWait bounds the wait for the lock of a file another kl-ctl or agent is
// editing; an edit holds it for milliseconds.
const DefaultLockWait = 10 * time.Second

// ErrLocked is what a LockedError is: another kl install or uninstall held the lock of
// the file for longer than the wait.
var ErrLocked = errors.New("locked by another kl install or uninstall")

// LockedError is the error of an Apply that could not take the lock of its file within
// Options.LockWait.
type LockedError struct {
	Lock   string        // the lock file
	Config string        // the file to edit
	Wait   time.Duration // how long Apply waited
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("%s is %v: lock file %s still held after %v (a kl-ctl install/uninstall or kl's install-cni agent is editing it; try again)", e.Config, ErrLocked, e.Lock, e.Wait)
}

func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// LockPath is the lock file that every kl install and uninstall of config holds while
// it reads, edits and writes it: kl-ctl run by hand and the DaemonSet's agent alike, so
// neither overwrites the other's edit. It lives beside the file (hidden, and named so
// that neither libcni nor dockerd reads it) because the configuration's directory is
// the one place both are sure to see: the agent's container mounts the node's CNI
// directories, not /run/kl. It stays after the edit (see lockFile).
func LockPath(config string) string {
	return filepath.Join(filepath.Dir(config), "."+filepath.Base(config)+".kl-lock")
}

// StatePath is where kl keeps, beside config, what an uninstall must put back and the
// file itself cannot hold: the default runtime before `install docker|containerd
// --default` (daemon.json's "default-runtime", config.toml's default_runtime_name;
// dockerd refuses keys it does not know in daemon.json, and a comment in config.toml
// would be the operator's to edit), and that install created the file (or, for
// daemon.json, found "runtimes" empty), so that uninstall removes it (or leaves that)
// again. It exists only while kl's change is in the file.
func StatePath(config string) string { return config + ".kl-state" }

// errBadState marks an error in the state file, which Apply names.
var errBadState = errors.New("not a kl state file (remove it if the configuration is as you want it)")

// afterRead is a test seam: it runs between reading the file and writing it back.
var afterRead = func() {}

// Change is what Apply did (or, with DryRun, would do) to one file.
type Change struct {
	Path    string   // the file edited
	Changed bool     // false when kl was already in (or, uninstalling, already out)
	Created bool     // the file did not exist before
	Removed bool     // uninstall removed the file: install had created it, and nothing else is in it
	Backup  string   // where the previous contents were saved; "" when nothing was written
	Diff    string   // unified diff from the old contents to the new; "" when unchanged
	Notes   []string // what the edit changed besides kl's entry, for the operator
}

// Apply runs e on the file at path (following symlinks) and, unless DryRun, writes the
// result atomically (same directory, same mode and owner), after saving the previous
// contents to path.kl-backup-<UTC timestamp>. A file that does not exist is treated as empty when
// installing and left alone when uninstalling. For docker and containerd, a file (and
// directory) install created is recorded in StatePath, and uninstall removes it again
// (the directory when it holds nothing else) once only what install started it with is
// left. Unless DryRun, it holds the file's lock
// (LockPath) from reading to writing, so concurrent installs and uninstalls of one file
// take turns instead of overwriting each other's edits. In a directory it cannot write
// in (a read-only mount, no permission), where the lock file cannot be created either,
// an edit that finds nothing to change reads without the lock and reports so; one that
// must write fails with an error naming the directory.
func Apply(path string, e Editor, o Options) (Change, error) {
	ch := Change{Path: path}
	var readOnly error // the directory cannot be written in: the error of a write
	// A config that is a symlink (configuration management often links them) is edited
	// where it points, so the link stays a link.
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	var createdDir string // the top directory MkdirAll makes for the file
	if !o.DryRun {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) && o.Uninstall {
			return ch, nil // no file, nothing to take out (and no lock file left)
		}
		for d := filepath.Dir(path); ; d = filepath.Dir(d) {
			if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) || d == filepath.Dir(d) {
				break
			}
			createdDir = d
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return ch, fmt.Errorf("create directory for %s: %w", path, err)
		}
		wait := o.LockWait
		if wait <= 0 {
			wait = DefaultLockWait
		}
		unlock, err := lockFile(LockPath(path), path, wait)
		switch {
		case err == nil:
			defer unlock()
		case errors.Is(err, syscall.EROFS) || errors.Is(err, fs.ErrPermission):
			// kl cannot write here, so it cannot lose another's edit: it reads
			// without the lock (writes are atomic renames), and only a write fails.
			readOnly = fmt.Errorf("%s: cannot write in %s: %w", path, filepath.Dir(path), err)
		default:
			return ch, err
		}
	}
	old, err := os.ReadFile(path)
	missing := errors.Is(err, fs.ErrNotExist)
	switch {
	case missing && o.Uninstall:
		return ch, nil
	case missing:
		ch.Created = true
	case err != nil:
		return ch, fmt.Errorf("read %s: %w", path, err)
	}
	var (
		next      []byte
		statePath string
		state     []byte
		nextState []byte
		record    *defaultState // the state file's record before the edit
		remove    bool          // uninstall leaves only what install created the file with
	)
	if de, ok := e.(defaultEditor); ok {
		statePath = StatePath(path)
		if state, err = os.ReadFile(statePath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return ch, fmt.Errorf("read %s: %w", statePath, err)
		}
		record, _ = parseDefaultState(state) // its errors are editDefault's
		next, nextState, remove, err = editDefault(de, old, state, o.Uninstall, missing, createdDir)
		if errors.Is(err, errBadState) {
			return ch, fmt.Errorf("%s: %w", statePath, err)
		}
	} else if o.Uninstall {
		next, err = e.Uninstall(old)
	} else {
		next, err = e.Install(old)
	}
	if err != nil {
		return ch, fmt.Errorf("%s: %w", path, err)
	}
	afterRead()
	stateChanged := statePath != "" && (!bytes.Equal(state, nextState) || (state == nil) != (nextState == nil))
	if bytes.Equal(old, next) && !ch.Created && !remove {
		// The file is as it should be; a state file left by an edit that stopped half
		// way (or by the operator's own change of the file) goes.
		if stateChanged && !o.DryRun {
			if readOnly != nil {
				return ch, readOnly
			}
			if err := writeState(statePath, nextState); err != nil {
				return ch, err
			}
		}
		return ch, nil
	}
	ch.Changed = true
	ch.Diff = UnifiedDiff(path, path, old, next)
	if n, ok := e.(noter); ok {
		ch.Notes = n.notes(old, next, o.Uninstall, record)
	}
	if remove {
		ch.Removed = true
		ch.Diff = UnifiedDiff(path, path, old, nil)
		ch.Notes = append(ch.Notes, "install created this file and nothing else is left in it: removed")
	}
	if stateChanged && nextState != nil {
		ch.Notes = append(ch.Notes, fmt.Sprintf("what uninstall puts back is kept in %s", statePath))
	}
	if o.DryRun {
		return ch, nil
	}
	if readOnly != nil {
		return ch, readOnly
	}
	mode := fs.FileMode(0o644)
	var st fs.FileInfo
	if !missing {
		if st, err = os.Stat(path); err != nil {
			return ch, fmt.Errorf("stat %s: %w", path, err)
		}
		mode = st.Mode().Perm()
		if !o.NoBackup {
			now := time.Now
			if o.Now != nil {
				now = o.Now
			}
			ch.Backup = backupName(path, now())
			if err := atomicfile.Write(ch.Backup, old, mode, st); err != nil {
				return ch, fmt.Errorf("back up %s: %w", path, err)
			}
		}
	}
	// The state file is written before the file and removed after it: an edit that
	// stops in between leaves a state file that describes the file as it is, or one
	// that the next install or uninstall replaces.
	if stateChanged && nextState != nil {
		if err := writeState(statePath, nextState); err != nil {
			return ch, err
		}
	}
	if remove {
		if err := os.Remove(path); err != nil {
			return ch, fmt.Errorf("remove %s: %w", path, err)
		}
		if err := writeState(statePath, nil); err != nil {
			return ch, err
		}
		removeCreatedDirs(path, record.CreatedDir)
		return ch, nil
	}
	if err := atomicfile.Write(path, next, mode, st); err != nil {
		return ch, fmt.Errorf("write %s: %w", path, err)
	}
	if stateChanged && nextState == nil {
		if err := writeState(statePath, nil); err != nil {
			return ch, err
		}
	}
	return ch, nil
}

// removeCreatedDirs removes the directories install made for path, from path's own up to
// top, each only while it is empty but for path's lock file. That lock file goes with
// its directory: an edit that was waiting for it then fails to write (the directory is
// gone) and can be run again.
func removeCreatedDirs(path, top string) {
	dir := filepath.Dir(path)
	if top == "" || (dir != top && !strings.HasPrefix(dir, top+string(filepath.Separator))) {
		return
	}
	if ents, err := os.ReadDir(dir); err != nil || len(ents) != 1 || ents[0].Name() != filepath.Base(LockPath(path)) {
		return
	}
	os.Remove(LockPath(path))
	for d := dir; ; d = filepath.Dir(d) {
		if os.Remove(d) != nil || d == top {
			return
		}
	}
}

// writeState writes kl's state file, or removes it when data is nil.
func writeState(path string, data []byte) error {
	if data == nil {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", path, err)
		}
		return nil
	}
	if err := atomicfile.Write(path, data, 0o644, nil); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// backupName is path.kl-backup-<stamp>; the suffix keeps CNI from reading it as a
// network config (libcni only reads .conf, .conflist and .json files).
func backupName(path string, t time.Time) string {
	base := path + ".kl-backup-" + t.UTC().Format("20060102T150405Z")
	name := base
	for i := 1; ; i++ {
		if _, err := os.Lstat(name); errors.Is(err, fs.ErrNotExist) {
			return name
		}
		name = fmt.Sprintf("%s.%d", base, i)
	}
}

// CopyBinary installs the executable src as dir/name atomically (mode 0755), the way
// the install-cni container puts kl-cni into the node's CNI bin directory. It is a
// no-op when the destination already has the same contents.
func CopyBinary(src, dir, name string) (string, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", src, err)
	}
	dst := filepath.Join(dir, name)
	if cur, err := os.ReadFile(dst); err == nil && bytes.Equal(cur, data) {
		return dst, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	if err := atomicfile.Write(dst, data, 0o755, nil); err != nil {
		return "", fmt.Errorf("install %s: %w", dst, err)
	}
	return dst, nil
}
