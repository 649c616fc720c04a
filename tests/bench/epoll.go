package main

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
	return b.startRelayChild("epoll-relay", args...)
}
