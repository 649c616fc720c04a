package install

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// lockPoll is how often a held lock is tried again until the wait runs out.
const lockPoll = 20 * time.Millisecond

// lockFile takes an exclusive flock(2) on the file name, creating it, and waits at most
// wait for another holder to let go. The file stays when unlocked: removing it would let
// a waiter lock the removed file while a third installer locks a new one (a re-check
// after locking can rule that out, at the cost of more code), and would add a create and
// a remove to the configuration's directory at every edit (the agent edits every few
// seconds, and containerd's CRI reloads its CNI configuration on such events in
// /etc/cni/net.d). A holder that dies releases the lock with its descriptor.
func lockFile(name, config string, wait time.Duration) (unlock func(), err error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is in the words below
		}
		return nil, fmt.Errorf("lock file %s: %w", name, err)
	}
	deadline := time.Now().Add(wait)
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", name, err)
		}
		if !time.Now().Before(deadline) {
			f.Close()
			return nil, &LockedError{Lock: name, Config: config, Wait: wait}
		}
		time.Sleep(min(lockPoll, time.Until(deadline)))
	}
}
