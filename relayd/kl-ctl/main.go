// Command kl-ctl is kl's control CLI: explain, lint, and the daemon's status and attach.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kl-egress/kl/relayd/ctl"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := ctl.Run(ctx, os.Args)
	stop()
	os.Exit(ctl.ExitStatus(err))
}
