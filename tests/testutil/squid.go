package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
)

var squids atomic.Int64

// SquidArgs are the arguments that run squid in the foreground with config file conf
// under a service name of its own, and remove removes the shared memory segments squid
// names after it (call it once squid is stopped: a squid killed before its shutdown
// leaves them). Squid will not start while a segment of its name exists: two squids of
// the default name at once (test packages run in parallel), or one killed earlier, made
// the next fail with "shm_open(/squid-cf__queues.shm): (17) File exists".
func SquidArgs(conf string) (args []string, remove func()) {
	name := fmt.Sprintf("kl%d%d", os.Getpid(), squids.Add(1))
	return []string{"-N", "-n", name, "-f", conf}, func() {
		shm, _ := filepath.Glob("/dev/shm/" + name + "-*.shm")
		for _, f := range shm {
			_ = os.Remove(f)
		}
	}
}
