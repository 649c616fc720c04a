package main

import (
	"fmt"
	"os"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
)

// An experiment next to the bare relay (bare.go): the same job done by one OS thread
// running its own epoll loop, the shape of redsocks, written in Go. Every Go relay makes
// ~9-10 context switches per connection through an upstream where redsocks makes ~3, and
// they come from Go's scheduler (sysmon, spinning Ms, netpoller handoffs), not from the
// relay's code. This relay leaves the scheduler out of the connection path: its sockets
// never reach the netpoller, and it makes every system call without entersyscall
// (epoll_linux.go). Its rows answer whether that alone reaches redsocks' conn/s.

const (
	epollRow      = "bare epoll relay (one thread)"
	epollDanteRow = "bare epoll relay → dante"
	epollSquidRow = "bare epoll relay → squid"
)

// startEpoll puts the capture table in the pod and runs epollRelay there; args are the
// relay's, as for startBare.
func (b *relayBench) startEpoll(args ...string) error {
	// Everything before stops first: another relay's undo removes the capture table.
	b.clear()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := netns.Install(b.podPath, netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: api.DefaultMark}); err != nil {
		return fmt.Errorf("install capture: %w", err)
	}
	if err := b.startOther(func() { _ = netns.Remove(b.podPath) }, "env", append([]string{"KL_BENCH_CHILD=epoll-relay", self}, args...)...); err != nil {
		_ = netns.Remove(b.podPath)
		return err
	}
	return waitTCP(b.podPath, fmt.Sprintf("127.0.0.1:%d", api.DefaultRedirectPort), 10*time.Second)
}
