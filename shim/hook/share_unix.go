//go:build unix

package hook

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// nsID is the device and inode of a netns file (what tells two namespaces apart).
func nsID(path string) (dev, ino uint64, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	return uint64(st.Dev), st.Ino, nil
}

// lockShares takes the exclusive lock on the share records in dir, creating dir. The
// runtime's hook timeout bounds the wait: the holder's relay calls are bounded too.
func lockShares(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("share records: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("share records: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("share records: lock %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil
}
