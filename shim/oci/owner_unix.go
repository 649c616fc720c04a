//go:build unix

package oci

import (
	"fmt"
	"os"
	"syscall"
)

// keepOwner gives f the owner and group of old, when they differ from f's.
func keepOwner(f *os.File, old os.FileInfo) error {
	want, ok := old.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if have, ok := fi.Sys().(*syscall.Stat_t); ok && have.Uid == want.Uid && have.Gid == want.Gid {
		return nil
	}
	if err := f.Chown(int(want.Uid), int(want.Gid)); err != nil {
		return fmt.Errorf("keep owner %d:%d: %w", want.Uid, want.Gid, err)
	}
	return nil
}
