//go:build !linux

package netns

import (
	"context"
	"errors"
	"net"
	"net/netip"
)

// Everything that touches a namespace or nf_tables is Linux-only.

func Do(nsPath string, fn func() error) error { return errors.ErrUnsupported }

func Listen(nsPath, network, addr string) (net.Listener, error) { return nil, errors.ErrUnsupported }

func Dial(ctx context.Context, nsPath string, mark uint32, network, addr string) (net.Conn, error) {
	return nil, errors.ErrUnsupported
}

func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.ErrUnsupported
}

func SameNetns(a, b string) (bool, error) { return false, errors.ErrUnsupported }

type nftBackend struct{}

func (nftBackend) Apply(string, *Table) error         { return errors.ErrUnsupported }
func (nftBackend) Delete(string, string) error        { return errors.ErrUnsupported }
func (nftBackend) Get(string, string) (*Table, error) { return nil, errors.ErrUnsupported }
