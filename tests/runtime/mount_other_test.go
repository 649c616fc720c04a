//go:build !linux

package runtime

import "testing"

// unmountUnder has nothing to do where these tests cannot run.
func unmountUnder(t *testing.T, dir string) {}
