//go:build !linux

package testutil

// KillShims has nothing to do where containerd cannot run.
func KillShims(address string) {}

// UnmountUnder has nothing to do where the tests mount nothing.
func UnmountUnder(dir string) []error { return nil }

// RemoveEmptyCgroups has nothing to do where runc makes no cgroups.
func RemoveEmptyCgroups(name string) {}
