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

// Handle is an open network namespace (Linux only).
type Handle struct{ path string }

func Open(nsPath string) (*Handle, error)  { return nil, errors.ErrUnsupported }
func (h *Handle) Path() string             { return h.path }
func (h *Handle) Name() string             { return h.path }
func (h *Handle) Close() error             { return nil }
func (h *Handle) Do(fn func() error) error { return errors.ErrUnsupported }
func (h *Handle) Listen(network, addr string) (net.Listener, error) {
	return nil, errors.ErrUnsupported
}
func (h *Handle) Dial(ctx context.Context, mark uint32, network, addr string) (net.Conn, error) {
	return nil, errors.ErrUnsupported
}
func (h *Handle) DialAddrPort(ctx context.Context, mark uint32, ap netip.AddrPort) (net.Conn, error) {
	return nil, errors.ErrUnsupported
}

func (h *Handle) ListenFD(ap netip.AddrPort) (int, error) { return -1, errors.ErrUnsupported }
func (h *Handle) EnterLocked() error                      { return errors.ErrUnsupported }

type nftBackend struct{}

func (nftBackend) Apply(string, *Table) error         { return errors.ErrUnsupported }
func (nftBackend) Delete(string, string) error        { return errors.ErrUnsupported }
func (nftBackend) Get(string, string) (*Table, error) { return nil, errors.ErrUnsupported }
