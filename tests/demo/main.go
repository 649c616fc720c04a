// Command demo is `make demo`: kl on a real node, on this machine. It installs what it
// needs (tests/deps.sh), then builds a node inside network namespaces of its own —
// kl-relayd, pods created through the real CNI chain (bridge + host-local + loopback +
// kl-cni), a CI builder container started by containerd through kl-runtime, two squid
// "acceleration" upstreams and destination hosts — and plays the seed 002 scenarios with
// real traffic, printing each flow's decision next to what the destination saw. It
// touches nothing of the host's network: every address is a test address inside the
// demo's own netns, and everything is removed at the end, on failure and on Ctrl-C.
//
// It exits non-zero when any flow does not match its expectation (tests/demo/demo_test.go
// runs it end to end).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	skipDeps := fs.Bool("skip-deps", false, "do not run tests/deps.sh")
	fs.Parse(os.Args[1:])
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := Run(ctx, Options{Out: os.Stdout, SkipDeps: *skipDeps, Color: isTerminal(os.Stdout)})
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

// Options tune one run.
type Options struct {
	Out      io.Writer
	SkipDeps bool // tests/deps.sh already ran
	Color    bool

	observe func(tag, dir string) // tests: the run's name tag and directory, once known
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
