// Command kl-hook is the OCI hook kl-runtime installs (see shim/hook).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/kl-egress/kl/shim/hook"
)

func main() {
	if err := hook.Run(context.Background(), os.Args, os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "kl-hook:", err)
		os.Exit(1)
	}
}
