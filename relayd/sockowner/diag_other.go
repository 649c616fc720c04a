//go:build !linux

package sockowner

import (
	"errors"
	"net/netip"
	"os"
)

// New returns a Finder on /proc; socket lookups need Linux.
func New() *Finder {
	return &Finder{Proc: os.DirFS("/proc"), SocketInode: SocketInode, NetnsInode: NetnsInode}
}

// NetnsInode needs Linux.
func NetnsInode(string) (uint64, error) { return 0, errors.ErrUnsupported }

// SocketInode needs Linux (inet sock_diag).
func SocketInode(string, netip.AddrPort, netip.AddrPort) (uint64, error) {
	return 0, errors.ErrUnsupported
}
