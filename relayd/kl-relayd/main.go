// Command kl-relayd is kl's per-node relay daemon (see package daemon).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kl-egress/kl/relayd/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := daemon.Run(ctx, os.Args)
	switch {
	case errors.Is(err, daemon.ErrUsage):
		os.Exit(2) // the usage and what is wrong are printed
	case err != nil:
		fmt.Fprintln(os.Stderr, "kl-relayd:", err)
		os.Exit(1)
	}
}
