package netns

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
)

var errNoAddress = errors.New("no address to dial")

// DialFirst dials the addresses in order with dial until one connects, as a dial of a
// name does: an IPv4-only pod on a dual-stack node may be handed an IPv6 address first.
// The error is the last address's alone (one reason per flow, not a line per address).
// It stops early when ctx ends.
func DialFirst(ctx context.Context, addrs []netip.AddrPort, dial func(context.Context, netip.AddrPort) (net.Conn, error)) (net.Conn, error) {
	err := errNoAddress
	for _, ap := range addrs {
		var c net.Conn
		if c, err = dial(ctx, ap); err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, err
}

// HostLocal reports whether a is an address of the machine that dials it rather than of
// a network: loopback, link-local, unspecified, IPv4 0.0.0.0/8 (which Linux also treats
// as local), or a cloud metadata address (Metadata: the machine's own instance metadata
// and credentials, in IPv6 too). An invalid address counts as local. The daemon's
// gateway exit and the attach side refuse these: they lend a network, not the services
// of their machine.
func HostLocal(a netip.Addr) bool {
	a = a.Unmap()
	return !a.IsValid() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() ||
		(a.Is4() && a.As4()[0] == 0) || slices.ContainsFunc(Metadata, func(p netip.Prefix) bool { return p.Contains(a) })
}
