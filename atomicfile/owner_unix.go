//go:build unix

package atomicfile

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// chownLike gives f the owner and group of like, when they differ from f's (a file made
// in a setgid directory has the directory's group, not ours).
func chownLike(f *os.File, like fs.FileInfo) error {
	want, ok := like.Sys().(*syscall.Stat_t)
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
