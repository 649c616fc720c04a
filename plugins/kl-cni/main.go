// Command kl-cni is kl's CNI chained plugin (see package cni).
package main

import (
	"context"
	"os"

	"github.com/kl-egress/kl/plugins/cni"
)

func main() {
	if cni.Run(context.Background(), os.Args) != nil {
		os.Exit(1)
	}
}
