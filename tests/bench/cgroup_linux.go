package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// limitUpstreams puts squid and dante (with all their children) in a CPU cgroup of
// their own that may use share of one CPU, so the upstream is the bottleneck by
// construction; undo moves them back to this process's cgroup and removes the new one.
// cgroup v2 (cpu.max) where the unified hierarchy has the cpu controller, v1
// (cpu.cfs_quota_us) otherwise.
func (b *relayBench) limitUpstreams(share float64) (undo func() error, err error) {
	const period = 100000 // µs
	quota := int(share * period)
	cg, err := cpuCgroup()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cg.root, cg.self, fmt.Sprintf("kl-bench-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cpu cgroup: %w", err)
	}
	back := filepath.Join(cg.root, cg.self, "cgroup.procs")
	undo = func() error {
		// Every process now in the group (children forked meanwhile included) goes back.
		data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(data)) {
			if err := os.WriteFile(back, []byte(f), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("cpu cgroup: move %s back: %w", f, err)
			}
		}
		return os.Remove(dir)
	}
	set := func(file, value string) {
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, file), []byte(value), 0)
		}
	}
	if cg.v2 {
		set("cpu.max", fmt.Sprintf("%d %d", quota, period))
	} else {
		set("cpu.cfs_period_us", strconv.Itoa(period))
		set("cpu.cfs_quota_us", strconv.Itoa(quota))
	}
	move := func(pid int) error {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("cpu cgroup: move %d: %w", pid, err)
		}
		return nil
	}
	for _, pid := range []int{b.squidPid, b.dantePid} {
		if err == nil {
			err = inTree(pid, move)
		}
	}
	if err != nil {
		return nil, errors.Join(err, undo())
	}
	return undo, nil
}

type cpuCg struct {
	root, self string // the hierarchy's mount point, this process's group in it
	v2         bool
}

// cpuCgroup finds the hierarchy with the cpu controller and this process's group in it.
func cpuCgroup() (cpuCg, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return cpuCg{}, err
	}
	defer f.Close()
	groups := map[string]string{} // controller list ("" for v2) -> path
	s := bufio.NewScanner(f)
	for s.Scan() {
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) == 3 {
			for _, c := range strings.Split(parts[1], ",") {
				groups[c] = parts[2]
			}
		}
	}
	if p, ok := groups["cpu"]; ok && dirExists("/sys/fs/cgroup/cpu") {
		return cpuCg{root: "/sys/fs/cgroup/cpu", self: p}, nil
	}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		ctl, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
		if err == nil && strings.Contains(" "+string(ctl)+" ", " cpu ") {
			if p, ok := groups[""]; ok {
				// The group's children get the cpu controller only if the group enables it.
				_ = os.WriteFile(filepath.Join(root, p, "cgroup.subtree_control"), []byte("+cpu"), 0)
				return cpuCg{root: root, self: p, v2: true}, nil
			}
		}
	}
	return cpuCg{}, errors.New("no cgroup hierarchy with the cpu controller (v1 /sys/fs/cgroup/cpu, or v2 with cpu enabled)")
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
