//go:build !linux

package main

import (
	"context"
	"errors"
)

// Run needs Linux: network namespaces, nftables, containerd.
func Run(ctx context.Context, o Options) error {
	return errors.New("the demo needs Linux (network namespaces, nftables, containerd)")
}
