//go:build !linux

package main

import "errors"

// pinCPUs needs Linux's sched_setaffinity.
func (b *relayBench) pinCPUs(pinned bool) error { return errors.ErrUnsupported }
