package relay

import "syscall"

var (
	errConnReset error = syscall.ECONNRESET
	errPipe      error = syscall.EPIPE
)
