package install

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// lockPoll is how often a held lock is tried again until the wait runs out.
const lockPoll = 20 * time.Millisecond

// lockOpened is a test seam: it runs when lockFile has opened the lock file, before it
// tries to lock it.
var lockOpened = func() {}

// lockFile takes an exclusive flock(2) on the file name, creating it, and waits at most
// wait for another holder to let go. unlock removes the file and releases the lock, so
// nothing stays beside the configuration. A waiter can therefore end up holding a file
// that its holder has just removed: it checks, after locking, that name is still the
// file it locked, and starts again otherwise. A holder that dies releases the lock with
// its descriptor; the file it leaves behind is locked and removed by the next one.
func lockFile(name, config string, wait time.Duration) (unlock func(), err error) {
	deadline := time.Now().Add(wait)
	for {
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, fmt.Errorf("open lock file: %w", err)
		}
		lockOpened()
		for {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
				break
			}
			if !time.Now().Before(deadline) {
				f.Close()
				return nil, &LockedError{Lock: name, Config: config, Wait: wait}
			}
			time.Sleep(min(lockPoll, time.Until(deadline)))
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", name, err)
		}
		if sameFile(f, name) {
			return func() {
				os.Remove(name)
				f.Close()
			}, nil
		}
		// The previous holder removed the file while this one waited for it: lock the
		// file that is there now (or create it).
		f.Close()
		if !time.Now().Before(deadline) {
			return nil, &LockedError{Lock: name, Config: config, Wait: wait}
		}
	}
}

// sameFile reports whether the open file f is the one at name.
func sameFile(f *os.File, name string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(name)
	return err == nil && os.SameFile(a, b)
}
