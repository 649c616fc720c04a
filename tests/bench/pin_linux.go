package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// pinCPUs puts kl-relayd's threads on the last CPU and this process's and the
// upstreams' (with their children) on the others; pinned false gives every one of them
// all CPUs back.
func (b *relayBench) pinCPUs(pinned bool) error {
	var all, first, last unix.CPUSet
	n := runtime.NumCPU()
	for c := range n {
		all.Set(c)
		if c < n-1 {
			first.Set(c)
		}
	}
	last.Set(n - 1)
	if !pinned {
		first, last = all, all
	}
	pin := func(pid int, set *unix.CPUSet) error {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
		for _, t := range tasks {
			tid, err := strconv.Atoi(filepath.Base(t))
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, set); err != nil && err != unix.ESRCH {
				return fmt.Errorf("pin thread %d of %d: %w", tid, pid, err)
			}
		}
		return nil
	}
	if b.relay == nil {
		return fmt.Errorf("pin: kl-relayd is not running")
	}
	for _, p := range []struct {
		pid int
		set *unix.CPUSet
	}{{os.Getpid(), &first}, {b.squidPid, &first}, {b.dantePid, &first}, {b.relay.Process.Pid, &last}} {
		if err := inTree(p.pid, func(pid int) error { return pin(pid, p.set) }); err != nil {
			return err
		}
	}
	return nil
}
