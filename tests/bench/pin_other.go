//go:build !linux

package main

import "errors"

// pinCPUs needs Linux's sched_setaffinity.
func (b *relayBench) pinCPUs(pinned bool) error { return errors.ErrUnsupported }

// limitUpstreams needs Linux's cgroups.
func (b *relayBench) limitUpstreams(share float64) (func() error, error) {
	return nil, errors.ErrUnsupported
}
