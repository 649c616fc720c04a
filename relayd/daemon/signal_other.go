//go:build !unix

package daemon

import "os"

func notifyHUP() chan os.Signal { return make(chan os.Signal) }

func stopHUP(chan os.Signal) {}
