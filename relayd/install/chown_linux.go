package install

import (
	"io/fs"
	"os"
	"syscall"
)

// chownLike gives f the owner and group of like (a no-op when like carries no Unix
// ownership, or it already matches).
func chownLike(f *os.File, like fs.FileInfo) error {
	st, ok := like.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if int(st.Uid) == os.Geteuid() && int(st.Gid) == os.Getegid() {
		return nil
	}
	return f.Chown(int(st.Uid), int(st.Gid))
}
