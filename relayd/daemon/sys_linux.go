package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// raiseNofile lifts the soft descriptor limit to the hard one: every registered pod holds a
// listener and every flow two sockets.
func raiseNofile() (soft, hard uint64, err error) {
	var l unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &l); err != nil {
		return 0, 0, fmt.Errorf("getrlimit: %w", err)
	}
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &l); err != nil {
			return 0, 0, fmt.Errorf("setrlimit: %w", err)
		}
	}
	return l.Cur, l.Max, nil
}

func fdLimit() (uint64, error) {
	var l unix.Rlimit
	err := unix.Getrlimit(unix.RLIMIT_NOFILE, &l)
	return l.Cur, err
}

func fdCount() (int, error) {
	des, err := os.ReadDir("/proc/self/fd")
	return len(des), err
}

// disableCoreDumps keeps credentials and flow data out of core files (SPEC §5).
func disableCoreDumps(log *slog.Logger) {
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		log.Warn("cannot disable core dumps", "err", err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		log.Warn("cannot disable core dumps", "err", err)
	}
}

// nsGetNstype is NS_GET_NSTYPE (linux/nsfs.h): the CLONE_NEW* type of a namespace file.
const nsGetNstype = 0xb703

// netnsID identifies a network namespace file (a bind mount or /proc/PID/ns/net) by device
// and inode, after checking it is one: a namespace file of another type (/proc/PID/ns/mnt)
// is refused here, not when entering it fails later.
func netnsID(path string) (dev, ino uint64, err error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("netns %s: %w", path, &os.PathError{Op: "open", Path: path, Err: err})
	}
	defer unix.Close(fd)
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return 0, 0, fmt.Errorf("netns %s: %w", path, &os.PathError{Op: "statfs", Path: path, Err: err})
	}
	if fs.Type != unix.NSFS_MAGIC {
		return 0, 0, fmt.Errorf("netns %s: %w", path, errNotNetns)
	}
	typ, err := unix.IoctlRetInt(fd, nsGetNstype)
	if err != nil {
		return 0, 0, fmt.Errorf("netns %s: %w", path, &os.PathError{Op: "NS_GET_NSTYPE", Path: path, Err: err})
	}
	if typ != unix.CLONE_NEWNET {
		return 0, 0, fmt.Errorf("netns %s: %w", path, errNotNetns)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, 0, fmt.Errorf("netns %s: %w", path, &os.PathError{Op: "stat", Path: path, Err: err})
	}
	return st.Dev, st.Ino, nil
}

var errNotNetns = errors.New("not a network namespace file")

// lockState takes the state directory's lock (flock on kl-relayd.lock, which holds the
// owner's pid), held until the daemon's process ends or release: a second kl-relayd on
// the same state, started by hand to try a configuration, must stop before it touches
// what the running one owns: the saved registrations (restore would find their ports
// taken and drop them), the published rules, the API socket.
func lockState(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	path := filepath.Join(dir, "kl-relayd.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state directory: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		owner, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("state directory %s: another kl-relayd (pid %s) is using it", dir, strings.TrimSpace(string(owner)))
		}
		return nil, fmt.Errorf("state directory %s: lock %s: %w", dir, path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return func() { f.Close() }, nil
}
