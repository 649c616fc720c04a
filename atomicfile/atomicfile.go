// Package atomicfile replaces a file so that a reader (containerd, dockerd, runc, a CNI
// runtime, kl's own hooks) never sees it half-written: the new contents go to a
// temporary file beside it, which is synced and renamed over it.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Write writes data to a temporary file beside path and renames it over path. The new
// file gets mode, and the owner and group of like when like is not nil. The file is
// synced before the rename and the directory after it, so that after a crash path holds
// either the old contents or the new, and once Write returns, the new ones. A failure
// leaves path as it was.
func Write(path string, data []byte, mode fs.FileMode, like fs.FileInfo) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".kl-tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after the rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if like != nil {
		if err := chownLike(f, like); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// syncDir makes a rename in dir durable. A file system that cannot sync a directory
// (EINVAL) has nothing more to offer and is not an error.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
