//go:build !linux

package sniff

import (
	"net"
	"time"
)

// Host needs MSG_PEEK through the socket, which kl implements only on Linux; elsewhere it
// reports ErrUnsupported.
func Host(c *net.TCPConn, wait time.Duration) (string, error) { return "", ErrUnsupported }
