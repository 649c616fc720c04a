//go:build !unix

package oci

import "os"

// keepOwner is a no-op where files have no unix owner.
func keepOwner(*os.File, os.FileInfo) error { return nil }
