//go:build unix

package daemon

import (
	"os"
	"os/signal"
	"syscall"
)

func notifyHUP() chan os.Signal {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGHUP)
	return c
}

func stopHUP(c chan os.Signal) { signal.Stop(c) }
