package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestMain runs a child mode when the bench starts this test binary as one (startRelayChild
// runs os.Executable), as main does.
func TestMain(m *testing.M) {
	runChild()
	os.Exit(m.Run())
}

// TestEpollRelay sends flows through the epoll relay on the bench's topology, direct
// and through each upstream: every byte comes back from the echo server, over more than
// one pipe's worth (partial splices), and a client's half-close reaches the server
// (the echo server ends its side only then, so ReadAll would otherwise not return).
func TestEpollRelay(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "ip", "nft", "iperf3", "danted", "squid", "conntrack", "ss")
	// The topology would build kl-relayd, which this test never starts: a stand-in.
	bin := t.TempDir()
	if err := os.WriteFile(bin+"/kl-relayd", nil, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KL_BIN", bin)
	b, err := newRelayBench()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.cleanup)
	for _, tc := range []struct {
		name, upstream string
		halfClose      bool // squid ends a CONNECT tunnel at the client's first FIN
	}{
		{"direct", "", true},
		{"dante", fmt.Sprintf("socks5://%s:%d", benchSrvAddr, benchDante), true},
		{"squid", fmt.Sprintf("http://%s:%d", benchSrvAddr, benchSquid), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			if tc.upstream != "" {
				args = append(args, tc.upstream)
			}
			if err := b.startEpoll(args...); err != nil {
				t.Fatal(err)
			}
			err := netns.Do(b.podPath, func() error {
				for i := range 20 {
					if err := echoOnce(bytes.Repeat([]byte{byte('a' + i)}, 100<<10), tc.halfClose); err != nil {
						return fmt.Errorf("flow %d: %w", i, err)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Kill(b.otherPid, 0); err != nil {
				t.Fatalf("the epoll relay is gone after the flows: %v", err)
			}
		})
	}
}

// echoOnce sends msg to the echo server and checks it all comes back; with halfClose
// it ends its sending side and reads until the server closes.
func echoOnce(msg []byte, halfClose bool) error {
	c, err := net.DialTimeout("tcp4", net.JoinHostPort(benchSrvAddr, fmt.Sprint(benchEchoPort)), 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(msg)
		if err == nil && halfClose {
			err = c.(*net.TCPConn).CloseWrite()
		}
		wrote <- err
	}()
	var got []byte
	if halfClose {
		got, err = io.ReadAll(c)
	} else {
		got = make([]byte, len(msg))
		_, err = io.ReadFull(c, got)
	}
	if werr := <-wrote; werr != nil {
		return fmt.Errorf("write: %w", werr)
	}
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if !bytes.Equal(got, msg) {
		return fmt.Errorf("echo: %d bytes back, want the %d sent", len(got), len(msg))
	}
	return nil
}
