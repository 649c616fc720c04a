package testutil

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
)

// KillShims ends, by PID, the containerd-shim processes serving the containerd at
// address: they outlive containerd by design.
func KillShims(address string) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		args := strings.Split(string(cmdline), "\x00")
		if len(args) == 0 || !strings.Contains(args[0], "containerd-shim") {
			continue
		}
		for i, a := range args {
			if a == "-address" && i+1 < len(args) && args[i+1] == address {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// UnmountUnder lazily unmounts everything mounted below dir, deepest first, and returns
// the unmounts that failed.
func UnmountUnder(dir string) []error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []error{err}
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(unescapeMount(fields[4]), dir+"/") {
			mps = append(mps, unescapeMount(fields[4]))
		}
	}
	var errs []error
	for i := len(mps) - 1; i >= 0; i-- {
		if err := syscall.Unmount(mps[i], syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mps[i], err))
		}
	}
	return errs
}

var octal = regexp.MustCompile(`\\[0-7]{3}`)

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	return octal.ReplaceAllStringFunc(s, func(o string) string {
		n, _ := strconv.ParseUint(o[1:], 8, 8)
		return string(rune(n))
	})
}

// RemoveEmptyCgroups removes the cgroup called name from every hierarchy where it is
// empty: runc under containerd (cgroupfs) makes /<namespace>/<container> and removes only
// the container's group. One still in use (another test's containerd) stays.
func RemoveEmptyCgroups(name string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*", name))       // v1: one per controller
	for _, d := range append(dirs, filepath.Join("/sys/fs/cgroup", name)) { // v2
		_ = os.Remove(d)
	}
}
