//go:build !linux

package relay

import "errors"

// Resets are only told apart on Linux, where the relay runs.
var (
	errConnReset = errors.New("connection reset")
	errPipe      = errors.New("broken pipe")
)
