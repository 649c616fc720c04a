package daemon

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/config"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestReregisterNewPath: containers sharing a netns (--network container:A) are
// registered under one id; when A goes, kl-hook registers the id again through a member
// still running, a new path to the same netns. That is a refresh: a flow the relay
// carries keeps carrying bytes, a new flow is accepted, the path the reaper checks is the
// new one (the old one is gone). The same id in another netns is a sandbox recreated: its
// flows end, as before.
func TestReregisterNewPath(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "nft")
	for _, tt := range []struct {
		name    string
		mode    string
		another bool // re-register in another netns rather than the same one by a new path
	}{
		{"same netns, new path", api.ModeTransparent, false},
		{"proxy mode, same netns, new path", api.ModeProxy, false},
		{"another netns", api.ModeTransparent, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs testutil.Buffer
			pod, cfg, d := echoPodDaemon(t, "klrp", &logs)

			// The first member's path: a bind mount of the pod's netns, gone after the
			// re-registration.
			first := bindNetns(t, pod.Path)
			w := api.Workload{ID: "shared", Netns: first, Mode: tt.mode, Source: "oci"}
			reg, err := d.Register(w)
			if err != nil {
				t.Fatal(err)
			}
			before := dialEcho(t, pod.Path, tt.mode, cfg.HTTPPort)
			echo(t, before, "before")

			w.Netns = pod.Path
			if tt.another {
				w.Netns = testutil.NewNetns(t, "klrpo").Path
			}
			reg2, err := d.Register(w)
			if err != nil {
				t.Fatalf("re-register: %v\n%s", err, logs.String())
			}
			if err := unix.Unmount(first, unix.MNT_DETACH); err != nil {
				t.Fatal(err)
			}
			d.mu.Lock()
			got := d.regs["shared"].Registration.Workload.Netns
			d.mu.Unlock()
			if got != w.Netns {
				t.Errorf("recorded netns path %q, want %q", got, w.Netns)
			}
			if tt.another {
				before.SetDeadline(time.Now().Add(5 * time.Second))
				_, err := io.WriteString(before, "after")
				if err == nil {
					_, err = before.Read(make([]byte, 5))
				}
				var ne net.Error
				if err == nil || errors.As(err, &ne) && ne.Timeout() {
					t.Errorf("a flow of the old netns survived the re-registration in another netns: %v", err)
				}
				return
			}
			if !reg2.Since.Equal(reg.Since) {
				t.Errorf("Since %v after a new path, want %v (the same registration)", reg2.Since, reg.Since)
			}
			echo(t, before, "after the new path")
			after := dialEcho(t, pod.Path, tt.mode, cfg.HTTPPort)
			echo(t, after, "new flow")
		})
	}
}

// echoPodDaemon makes a pod netns (prefix) linked to a server netns with an echo server
// on 192.0.2.2:4711, the pod's capture table, and a daemon logging to logs with every
// flow through the relay (NoFastPath), shut down when the test ends.
func echoPodDaemon(t *testing.T, prefix string, logs io.Writer) (*testutil.Netns, *config.Config, *Daemon) {
	t.Helper()
	pod := testutil.NewNetns(t, prefix)
	srv := testutil.NewNetns(t, prefix+"s")
	testutil.Link(t, pod, []string{"192.0.2.1/24"}, srv, []string{"192.0.2.2/24"})
	ln, err := netns.Listen(srv.Path, "tcp4", "192.0.2.2:4711")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) { io.Copy(c, c) })
	cfg := testConfig(t, t.TempDir())
	cfg.NoFastPath = true
	if err := netns.Install(pod.Path, netns.Capture{RedirectPort: cfg.RedirectPort, Mark: cfg.Mark}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(pod.Path) })
	d, err := New(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		d.relay.Shutdown(ctx)
	})
	return pod, cfg, d
}

// bindNetns bind-mounts the netns file at nsPath on a file of a temporary directory and
// returns that path (unmounted when the test ends, if still mounted).
func bindNetns(t *testing.T, nsPath string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(nsPath, p, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mount %s on %s: %v", nsPath, p, err)
	}
	t.Cleanup(func() { unix.Unmount(p, unix.MNT_DETACH) })
	return p
}

// dialEcho connects from the pod to the echo server: in transparent mode unmarked
// (captured, so through the relay), in proxy mode through the relay's HTTP proxy on the
// pod's loopback (CONNECT).
func dialEcho(t *testing.T, pod string, mode string, httpPort uint16) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addr := "192.0.2.2:4711"
	if mode == api.ModeProxy {
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(int(httpPort)))
	}
	c, err := netns.Dial(ctx, pod, 0, "tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if mode == api.ModeProxy {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if err := testutil.ConnectThrough(c, "192.0.2.2:4711"); err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Time{})
	}
	return c
}

// echo sends msg on c and wants it back.
func echo(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatalf("%s: write: %v", msg, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, []byte(msg)) {
		t.Fatalf("%s: read %q, %v", msg, got, err)
	}
}

// TestSweepGrace: a registration whose netns path is gone is dropped at the second sweep
// that finds it so, not the first: containers sharing a netns lose the registrant's
// /proc/PID/ns/net when its process ends, before kl-hook's poststop moves the
// registration to a member still running. Meanwhile the flows go on; a move in time keeps
// the registration, and one that never comes ends it a sweep later.
func TestSweepGrace(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "nft")
	for _, moved := range []bool{true, false} {
		t.Run("moved="+strconv.FormatBool(moved), func(t *testing.T) {
			pod, cfg, d := echoPodDaemon(t, "klrg", io.Discard)
			first := bindNetns(t, pod.Path)
			w := api.Workload{ID: "shared", Netns: first, Mode: api.ModeTransparent, Source: "oci"}
			if _, err := d.Register(w); err != nil {
				t.Fatal(err)
			}
			c := dialEcho(t, pod.Path, w.Mode, cfg.HTTPPort)
			echo(t, c, "before")
			if err := unix.Unmount(first, unix.MNT_DETACH); err != nil {
				t.Fatal(err)
			}
			registered := func() bool {
				d.mu.Lock()
				defer d.mu.Unlock()
				_, ok := d.regs["shared"]
				return ok
			}
			missing := d.sweep(nil)
			if !registered() {
				t.Fatal("the first sweep that found the path gone dropped the registration")
			}
			echo(t, c, "after the path went")
			if moved {
				w.Netns = pod.Path
				if _, err := d.Register(w); err != nil {
					t.Fatal(err)
				}
			}
			d.sweep(missing)
			if registered() != moved {
				t.Fatalf("after the second sweep registered = %v, want %v", registered(), moved)
			}
			if moved {
				echo(t, c, "after the move")
			}
		})
	}
}
