//go:build !unix

package hook

import "errors"

func nsID(string) (dev, ino uint64, err error) { return 0, 0, errors.ErrUnsupported }

func lockShares(string) (func(), error) { return nil, errors.ErrUnsupported }
