// Command kl-runtime is kl's runc-compatible OCI runtime wrapper (see shim/runtime).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/kl-egress/kl/shim/runtime"
)

func main() {
	if err := runtime.Run(context.Background(), os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "kl-runtime:", err)
		os.Exit(1)
	}
}
