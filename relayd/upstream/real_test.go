package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/tests/testutil"
)

// These tests run the real upstreams a node would use (Debian's squid, dante-server and
// microsocks) on free loopback ports, and dial an echo server the test runs itself.

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().(*net.TCPAddr).Port
}

// echoServer answers every connection with a greeting and then echoes.
func echoServer(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(c, "hello\n")
		_, _ = io.Copy(c, c)
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// startDaemon runs a foreground daemon and stops it by PID (SIGTERM, then SIGKILL) when
// the test ends; it waits until addr accepts connections.
func startDaemon(t *testing.T, addr string, name string, args ...string) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("output of %s:\n%s", name, out.String())
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			_ = c.Close()
			return
		}
		select {
		case <-done:
			t.Fatalf("%s exited before listening on %s:\n%s", name, addr, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s does not listen on %s:\n%s", name, addr, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// worldDir makes a directory the daemons' unprivileged users can write (squid drops to
// `proxy`, dante to `nobody`), removed when the test ends.
func worldDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "kl-upstream-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	if err := os.Chmod(d, 0o777); err != nil {
		t.Fatal(err)
	}
	return d
}

// startSquid runs squid with a minimal config: CONNECT allowed only to allowPort, and
// Basic auth required when user is set.
func startSquid(t *testing.T, allowPort int, user, pass string) string {
	t.Helper()
	testutil.RequireTool(t, "squid")
	if os.Geteuid() != 0 {
		testutil.RequirePrivileged(t) // squid needs root to switch to its own user
	}
	dir := worldDir(t)
	port := freePort(t)
	auth := ""
	access := "http_access allow localhost\n"
	if user != "" {
		testutil.RequireTool(t, "openssl")
		hash := strings.TrimSpace(testutil.Run(t, "openssl", "passwd", "-1", pass))
		pw := filepath.Join(dir, "passwd")
		if err := os.WriteFile(pw, []byte(user+":"+hash+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		auth = fmt.Sprintf("auth_param basic program /usr/lib/squid/basic_ncsa_auth %s\nauth_param basic children 1 startup=1\nacl authed proxy_auth REQUIRED\n", pw)
		access = "http_access allow localhost authed\n"
	}
	conf := fmt.Sprintf(`http_port 127.0.0.1:%d
pid_filename %[2]s/squid.pid
cache_log %[2]s/cache.log
access_log %[2]s/access.log
coredump_dir %[2]s
cache deny all
shutdown_lifetime 0 seconds
dns_nameservers 127.0.0.1
%[3]sacl CONNECT method CONNECT
acl allowed_port port %[4]d
http_access deny CONNECT !allowed_port
%[5]shttp_access deny all
`, port, dir, auth, allowPort, access)
	cf := filepath.Join(dir, "squid.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	args, rm := testutil.SquidArgs(cf)
	t.Cleanup(rm) // after the stop startDaemon registers
	startDaemon(t, addr, "squid", args...)
	return addr
}

// startDante runs danted allowing CONNECT to loopback except blockPort.
func startDante(t *testing.T, blockPort int) string {
	t.Helper()
	testutil.RequireTool(t, "danted")
	if os.Geteuid() != 0 {
		testutil.RequirePrivileged(t)
	}
	dir := worldDir(t)
	port := freePort(t)
	conf := fmt.Sprintf(`logoutput: stderr
internal: 127.0.0.1 port = %d
external: 127.0.0.1
clientmethod: none
socksmethod: none
user.privileged: root
user.unprivileged: nobody
client pass { from: 127.0.0.0/8 to: 0.0.0.0/0 }
socks block { from: 0.0.0.0/0 to: 127.0.0.0/8 port = %d }
socks pass { from: 127.0.0.0/8 to: 127.0.0.0/8 command: connect }
socks block { from: 0.0.0.0/0 to: 0.0.0.0/0 }
`, port, blockPort)
	cf := filepath.Join(dir, "danted.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	startDaemon(t, addr, "danted", "-f", cf, "-p", filepath.Join(dir, "danted.pid"), "-N", "1")
	return addr
}

func startMicrosocks(t *testing.T, user, pass string) string {
	t.Helper()
	testutil.RequireTool(t, "microsocks")
	port := freePort(t)
	args := []string{"-i", "127.0.0.1", "-p", strconv.Itoa(port)}
	if user != "" {
		args = append(args, "-u", user, "-P", pass)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	startDaemon(t, addr, "microsocks", args...)
	return addr
}

// roundTrip dials through d and checks the echo server's greeting and an echo.
func roundTrip(t *testing.T, d Dialer, target Target) error {
	t.Helper()
	c, err := d.Dial(context.Background(), target)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 6)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello\n" {
		t.Fatalf("greeting through %s = %q, %v", d, buf, err)
	}
	msg := bytes.Repeat([]byte("0123456789"), 10000)
	go func() { _, _ = c.Write(msg) }()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo through %s: %v (equal=%v)", d, err, bytes.Equal(got, msg))
	}
	return nil
}

type realCase struct {
	name    string
	url     string
	target  Target
	wantErr error
	errText string
	opts    []Option
	timeout time.Duration // 0: 3s
}

func runReal(t *testing.T, cases []realCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 3 * time.Second
			}
			d, err := New(tc.url, timeout, nil, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			err = roundTrip(t, d, tc.target)
			if tc.wantErr == nil && tc.errText == "" {
				if err != nil {
					t.Fatalf("dial through %s: %v", d, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("dial through %s succeeded, want %v %q", d, tc.wantErr, tc.errText)
			}
			if (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) || !strings.Contains(err.Error(), tc.errText) {
				t.Fatalf("dial through %s: %q, want %v containing %q", d, err, tc.wantErr, tc.errText)
			}
			if !strings.Contains(err.Error(), d.String()) {
				t.Fatalf("error %q does not name the upstream %s", err, d)
			}
			t.Logf("%s: %v", tc.name, err)
		})
	}
}

func TestRealSquid(t *testing.T) {
	echo := echoServer(t)
	other := echoServer(t)
	squid := startSquid(t, echo, "", "")
	runReal(t, []realCase{
		{name: "ip", url: "http://" + squid, target: Target{Addr: addrPort(t, "127.0.0.1", echo), Port: uint16(echo)}},
		{name: "hostname", url: "http://" + squid, target: Target{Host: "localhost", Port: uint16(echo)}},
		{name: "acl refuses port", url: "http://" + squid, target: Target{Host: "127.0.0.1", Port: uint16(other)},
			wantErr: ErrRefused, errText: "403 Forbidden"},
		{name: "down", url: "http://" + closedPort(t), target: Target{Host: "localhost", Port: uint16(echo)},
			errText: "connection refused"},
	})
}

func TestRealSquidAuth(t *testing.T) {
	echo := echoServer(t)
	squid := startSquid(t, echo, "alice", "s3cret")
	target := Target{Host: "127.0.0.1", Port: uint16(echo)}
	runReal(t, []realCase{
		{name: "good credentials", url: "http://alice:s3cret@" + squid, target: target},
		{name: "wrong password", url: "http://alice:wrong@" + squid, target: target, wantErr: ErrAuth, errText: "credentials rejected (407"},
		{name: "no credentials", url: "http://" + squid, target: target, wantErr: ErrAuth, errText: "none are configured"},
	})
}

func TestRealDante(t *testing.T) {
	echo := echoServer(t)
	blocked := echoServer(t)
	dante := startDante(t, blocked)
	runReal(t, []realCase{
		{name: "ipv4", url: "socks5://" + dante, target: Target{Addr: addrPort(t, "127.0.0.1", echo), Port: uint16(echo)}},
		{name: "domain", url: "socks5://" + dante, target: Target{Host: "localhost", Port: uint16(echo)}},
		{name: "ruleset blocks", url: "socks5://" + dante, target: Target{Host: "127.0.0.1", Port: uint16(blocked)},
			wantErr: ErrRefused, errText: "not allowed by ruleset"},
		{name: "target down", url: "socks5://" + dante, target: Target{Host: "127.0.0.1", Port: uint16(freePort(t))},
			wantErr: ErrRefused, errText: "connection refused"},
		{name: "down", url: "socks5://" + closedPort(t), target: Target{Host: "localhost", Port: uint16(echo)},
			errText: "connection refused"},
		// Dante reads a request sent ahead of its method choice.
		{name: "pipelined ipv4", url: "socks5://" + dante, opts: []Option{Pipeline()},
			target: Target{Addr: addrPort(t, "127.0.0.1", echo), Port: uint16(echo)}},
		{name: "pipelined domain", url: "socks5://" + dante, opts: []Option{Pipeline()}, target: Target{Host: "localhost", Port: uint16(echo)}},
		{name: "pipelined ruleset blocks", url: "socks5://" + dante, opts: []Option{Pipeline()},
			target: Target{Host: "127.0.0.1", Port: uint16(blocked)}, wantErr: ErrRefused, errText: "not allowed by ruleset"},
	})
}

func TestRealMicrosocksAuth(t *testing.T) {
	echo := echoServer(t)
	ms := startMicrosocks(t, "bob", "pa55")
	target := Target{Host: "localhost", Port: uint16(echo)}
	runReal(t, []realCase{
		{name: "good credentials", url: "socks5://bob:pa55@" + ms, target: target},
		{name: "ip target", url: "socks5://bob:pa55@" + ms, target: Target{Addr: addrPort(t, "127.0.0.1", echo), Port: uint16(echo)}},
		{name: "wrong password", url: "socks5://bob:nope@" + ms, target: target, wantErr: ErrAuth, errText: "rejected"},
		{name: "no credentials", url: "socks5://" + ms, target: target, wantErr: ErrAuth, errText: "requires authentication"},
		// microsocks drops what arrives with the greeting: why Pipeline is opt-in.
		{name: "pipelined is not for microsocks", url: "socks5://bob:pa55@" + ms, target: target, opts: []Option{Pipeline()},
			timeout: 300 * time.Millisecond, errText: "timed out"},
	})
}

func TestRealMicrosocksIPv6(t *testing.T) {
	testutil.RequireTool(t, "microsocks")
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatalf("no IPv6 loopback: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer func() { _ = c.Close() }(); _, _ = io.WriteString(c, "hello\n"); _, _ = io.Copy(c, c) }()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	ms := startMicrosocks(t, "", "")
	runReal(t, []realCase{
		{name: "ipv6", url: "socks5://" + ms, target: Target{Addr: addrPort(t, "::1", port), Port: uint16(port)}},
	})
}
