// Command kl-relayd is kl's per-node relay daemon (see package daemon).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kl-egress/kl/relayd/daemon"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := daemon.Run(ctx, os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "kl-relayd:", err)
		os.Exit(1)
	}
}
