package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"
)

// sdNotify sends a systemd notification (sd_notify(3)) when the service manager asked
// for them with NOTIFY_SOCKET; otherwise it does nothing.
func sdNotify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] == '@' {
		path = "\x00" + path[1:] // abstract socket
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(state))
	return err
}

// watchdogInterval is how often to send WATCHDOG=1 (sd_watchdog_enabled(3)): half of
// WATCHDOG_USEC, or 0 when the service manager did not ask for keep-alives (no
// WATCHDOG_USEC, no NOTIFY_SOCKET, or WATCHDOG_PID names another process).
func watchdogInterval() (time.Duration, error) {
	us := os.Getenv("WATCHDOG_USEC")
	if us == "" || os.Getenv("NOTIFY_SOCKET") == "" {
		return 0, nil
	}
	if pid := os.Getenv("WATCHDOG_PID"); pid != "" {
		n, err := strconv.Atoi(pid)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("WATCHDOG_PID %q: not a process id", pid)
		}
		if n != os.Getpid() {
			return 0, nil
		}
	}
	n, err := strconv.ParseUint(us, 10, 63)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("WATCHDOG_USEC %q: not a positive number of microseconds", us)
	}
	return time.Duration(n) * time.Microsecond / 2, nil
}

// watchdog sends WATCHDOG=1 every interval while healthy says the daemon works, until
// ctx is done. A failed health check skips the keep-alive, so a wedged daemon is
// restarted by the service manager; the state changes are logged once each.
func watchdog(ctx context.Context, every time.Duration, healthy func(context.Context) error, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	sick := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hctx, cancel := context.WithTimeout(ctx, every)
		err := healthy(hctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if !sick {
				log.Warn("unhealthy: withholding the systemd watchdog keep-alive", "err", err)
			}
			sick = true
			continue
		}
		if sick {
			log.Info("healthy again: watchdog keep-alives resumed")
		}
		sick = false
		if err := sdNotify("WATCHDOG=1"); err != nil {
			log.Warn("sd_notify watchdog", "err", err)
		}
	}
}
