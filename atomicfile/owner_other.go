//go:build !unix

package atomicfile

import (
	"io/fs"
	"os"
)

// chownLike is a no-op where files have no unix owner.
func chownLike(*os.File, fs.FileInfo) error { return nil }
