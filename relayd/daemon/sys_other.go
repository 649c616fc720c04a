//go:build !linux

package daemon

import (
	"errors"
	"log/slog"
)

func raiseNofile() (soft, hard uint64, err error)      { return 0, 0, errors.ErrUnsupported }
func fdLimit() (uint64, error)                         { return 0, errors.ErrUnsupported }
func fdCount() (int, error)                            { return 0, errors.ErrUnsupported }
func disableCoreDumps(*slog.Logger)                    {}
func netnsID(path string) (dev, ino uint64, err error) { return 0, 0, errors.ErrUnsupported }
func lockState(dir string) (release func(), err error) { return func() {}, nil }
