//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/tests/testutil"
)

// visit is what a destination server saw of one request.
type visit struct {
	Peer  netip.Addr // the source address of the TCP connection
	Local netip.Addr // the address it was reached at
	Host  string
}

// dest is a tiny HTTP server inside a destination netns. It answers every request with
// the peer address it saw and remembers it under the request's flow id (/flow/ID).
type dest struct {
	name   string
	mu     sync.Mutex
	visits map[string]visit
}

func (d *demo) serveDest(n *ns, name string) (*dest, error) {
	ln, err := netns.Listen(n.Path, "tcp4", ":80")
	if err != nil {
		return nil, fmt.Errorf("listen in %s: %w", n.Name, err)
	}
	ds := &dest{name: name, visits: map[string]visit{}}
	srv := &http.Server{Handler: ds, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	d.undo.push("stop server "+name, func() error { return srv.Close() })
	return ds, nil
}

func (ds *dest) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ap, _ := netip.ParseAddrPort(r.RemoteAddr)
	v := visit{Peer: ap.Addr().Unmap(), Host: r.Host}
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if lap, err := netip.ParseAddrPort(la.String()); err == nil {
			v.Local = lap.Addr().Unmap()
		}
	}
	if id, ok := strings.CutPrefix(r.URL.Path, "/flow/"); ok {
		ds.mu.Lock()
		ds.visits[id] = v
		ds.mu.Unlock()
	}
	fmt.Fprintf(w, "%s (%s) saw %s\n", ds.name, v.Local, v.Peer)
}

func (ds *dest) seen(id string) (visit, bool) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	v, ok := ds.visits[id]
	return v, ok
}

// squid is one "acceleration" upstream: squid on :3128 in its own netns, resolving the
// demo's names from a hosts file (no DNS anywhere in the demo).
type squid struct {
	name string
	addr netip.Addr
	dir  string
	proc *proc
	n    *ns
}

func (d *demo) startSquid(n *ns, name string, addr netip.Addr, hosts string) (*squid, error) {
	dir := filepath.Join(d.dir, "squid-"+name)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, err
	}
	os.Chmod(dir, 0o777) // squid drops to its own user
	if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts), 0o644); err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`http_port 3128
visible_hostname %[2]s
pid_filename %[1]s/squid.pid
cache_log %[1]s/cache.log
access_log stdio:%[1]s/access.log
logfile_rotate 0
coredump_dir %[1]s
cache deny all
shutdown_lifetime 0 seconds
dns_nameservers 127.0.0.1
hosts_file %[1]s/hosts
http_access allow all
`, dir, name)
	cf := filepath.Join(dir, "squid.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	args, rm := testutil.SquidArgs(cf)
	d.undo.push("remove squid "+name+"'s shared memory", func() error { rm(); return nil }) // after its stop
	p, err := d.start(n, filepath.Join(dir, "squid.out"), nil, 5*time.Second, "squid", args...)
	if err != nil {
		return nil, err
	}
	return &squid{name: name, addr: addr, dir: dir, proc: p, n: n}, nil
}

func (s *squid) ready(ctx context.Context) error {
	if err := s.n.waitPort(ctx, "3128", 20*time.Second, s.proc); err != nil {
		cl, _ := os.ReadFile(filepath.Join(s.dir, "cache.log"))
		return fmt.Errorf("squid %s: %w\n%s", s.name, err, cl)
	}
	return nil
}

// accessLines is the number of lines in squid's access log.
func (s *squid) accessLog() []string {
	data, _ := os.ReadFile(filepath.Join(s.dir, "access.log"))
	var lines []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// logged waits (briefly) for a new access-log line after the first `after` lines and
// returns it as "METHOD URL from CLIENT". squid logs a tunnel when it closes.
func (s *squid) logged(ctx context.Context, after int) (string, error) {
	var line string
	err := waitFor(ctx, 3*time.Second, func() bool {
		l := s.accessLog()
		if len(l) > after {
			line = l[after]
			return true
		}
		return false
	})
	if err != nil {
		return "", errors.New("no access-log line")
	}
	// squid native format: time elapsed client code/status bytes method URL ...
	f := strings.Fields(line)
	if len(f) < 7 {
		return line, nil
	}
	return fmt.Sprintf("%s %s from %s (%s)", f[5], f[6], f[2], f[3]), nil
}
