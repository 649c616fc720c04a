package audit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestReason(t *testing.T) {
	// A real refused dial to a closed loopback port.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	_, dialErr := net.DialTimeout("tcp", addr, time.Second)
	if dialErr == nil {
		t.Fatal("dial to a closed port succeeded")
	}
	tests := []struct {
		name     string
		err      error
		want     string
		mustMiss string
	}{
		{"nil", nil, "", ""},
		{"refused dial", fmt.Errorf("direct exit: %w", dialErr), "direct exit: dial tcp: connect: connection refused", addr},
		{"dns", fmt.Errorf("resolve: %w", &net.DNSError{Err: "no such host", Name: "secret.example", IsNotFound: true}),
			"resolve: lookup failed: no such host", "secret.example"},
		{"op without net", &net.OpError{Op: "read", Addr: &net.TCPAddr{IP: net.IPv4(203, 0, 113, 9), Port: 1}, Err: errors.New("reset")},
			"read: reset", "203.0.113.9"},
		{"joined", fmt.Errorf("dial in /run/netns/p: %w", errors.Join(
			&net.AddrError{Err: "not an ip6 address", Addr: "192.0.2.4"},
			&net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.ParseIP("2001:db8::5"), Port: 443}, Err: syscall.ECONNREFUSED})),
			"dial in /run/netns/p: not an ip6 address\ndial tcp: connection refused", "2001:db8::5"},
		{"joined first", errors.Join(dialErr, dialErr), "dial tcp: connect: connection refused\ndial tcp: connect: connection refused", addr},
		{"address in words", fmt.Errorf("dial %s in : %w", addr, syscall.ECONNREFUSED), "dial <address> in : connection refused", addr},
		{"ipv6 in words", errors.New("to [2001:db8::7]:80, 2001:db8::8 or 192.0.2.9."), "to <address>, <address> or <address>.", "2001:db8"},
		{"upstream kept", fmt.Errorf("upstream socks5://192.0.2.1:1080: connect: %w", dialErr),
			"upstream socks5://192.0.2.1:1080: connect: dial tcp: connect: connection refused", addr},
		{"not addresses", errors.New("bad port \"abc\" after 5s, HTTP/1.1 rule 12.3 at 10:30 (mark 0x4b4c, tcp4: 1.2.3)"),
			"bad port \"abc\" after 5s, HTTP/1.1 rule 12.3 at 10:30 (mark 0x4b4c, tcp4: 1.2.3)", ""},
		{"glued to words", errors.New("to:203.0.113.7:443, host_203.0.113.8, [2001:db8::9]:80:x and 203.0.113.10:443:80"),
			"to:<address>, host_<address>, <address>:x and <address>:80", "203.0.113"},
		{"ipv6 zone", errors.New("to fe80::1%eth0, [fe80::2%eth0.100]:443: refused, fe80::3%2. and ::1%lo"),
			"to <address>, <address>: refused, <address>. and <address>", "eth0"},
		{"ipv6 zone glued", errors.New("to:fe80::1%veth-a_1:x (via [fe80::2%br0]) and fe80::3%"),
			"to:<address>:x (via <address>) and <address>%", "fe80"},
		{"zone kept in url", errors.New("upstream socks5://[fe80::1%25eth0]:1080: refused"),
			"upstream socks5://[fe80::1%25eth0]:1080: refused", ""},
		{"percent not a zone", errors.New("192.0.2.1:80%x at 10:30%, 50%ab"), "<address>%x at 10:30%, 50%ab", "192.0.2"},
		{"plain", errors.New("denied by policy"), "denied by policy", ""},
		{"context", context.DeadlineExceeded, "context deadline exceeded", ""},
	}
	for _, tt := range tests {
		got := Reason(tt.err)
		if got != tt.want {
			t.Errorf("%s: Reason(%v) = %q, want %q", tt.name, tt.err, got, tt.want)
		}
		if tt.mustMiss != "" && strings.Contains(got, tt.mustMiss) {
			t.Errorf("%s: Reason(%v) = %q still holds %q", tt.name, tt.err, got, tt.mustMiss)
		}
	}
}

func TestRedacted(t *testing.T) {
	if Redacted(nil) != nil {
		t.Fatal("Redacted(nil) != nil")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	_, dialErr := net.DialTimeout("tcp", addr, time.Second)
	err = Redacted(fmt.Errorf("direct: %w", dialErr))
	if strings.Contains(err.Error(), addr) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Redacted = %q (Is ECONNREFUSED: %v), want no address and the chain kept", err, errors.Is(err, syscall.ECONNREFUSED))
	}
	var op *net.OpError
	if !errors.As(err, &op) {
		t.Fatal("errors.As cannot find the *net.OpError any more")
	}
}
