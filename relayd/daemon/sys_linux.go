package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

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

// netnsID identifies a network namespace file (a bind mount or /proc/PID/ns/net) by device
// and inode, after checking it is one.
func netnsID(path string) (dev, ino uint64, err error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return 0, 0, fmt.Errorf("netns %s: %w", path, &os.PathError{Op: "statfs", Path: path, Err: err})
	}
	if fs.Type != unix.NSFS_MAGIC {
		return 0, 0, fmt.Errorf("netns %s: %w", path, errNotNetns)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, fmt.Errorf("netns %s: %w", path, &os.PathError{Op: "stat", Path: path, Err: err})
	}
	return st.Dev, st.Ino, nil
}

var errNotNetns = errors.New("not a namespace file")
