package relay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/sockowner"
	"github.com/kl-egress/kl/rules"
)

// fakeOwners answers lookups from a table by client port and records calls.
type fakeOwners struct {
	mu      sync.Mutex
	byPort  map[uint16]rules.Process
	next    *rules.Process // answers the next lookup whatever its port
	lookups []sockowner.Key
	forgot  []sockowner.Key
}

func (f *fakeOwners) Lookup(k sockowner.Key) (rules.Process, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups = append(f.lookups, k)
	if f.next != nil {
		p := *f.next
		f.next = nil
		if p.Known {
			return p, nil
		}
		return p, errors.New("socket gone")
	}
	if p, ok := f.byPort[k.Src.Port()]; ok {
		return p, nil
	}
	return rules.Process{}, errors.New("socket gone")
}

func (f *fakeOwners) Forget(k sockowner.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forgot = append(f.forgot, k)
}

func (f *fakeOwners) set(port uint16, p rules.Process) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.byPort[port] = p
}

func (f *fakeOwners) calls() (lookups, forgot []sockowner.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sockowner.Key(nil), f.lookups...), append([]sockowner.Key(nil), f.forgot...)
}

// processDecider denies curl and needs processes; it records what it was given.
type processDecider struct{ need bool }

func (p processDecider) NeedsProcess() bool { return p.need }

func (p processDecider) Decide(f *rules.Flow) rules.Decision {
	if f.Process.Known && f.Process.Comm == "curl" {
		return rules.Decision{Exit: rules.ExitDeny, Rule: 1, Priority: rules.PriorityProcess, Dimension: rules.DimProcess}
	}
	return rules.Decision{Exit: rules.ExitDirect, Priority: rules.PriorityDefault}
}

func TestProcessTransparent(t *testing.T) {
	backend := echoServer(t)
	for _, need := range []bool{true, false} {
		t.Run(fmt.Sprintf("needs process %v", need), func(t *testing.T) {
			owners := &fakeOwners{byPort: map[uint16]rules.Process{}}
			h := newHarnessWith(t, nil, time.Minute, nil, func(o *Options) {
				o.Policy = func() Decider { return processDecider{need: need} }
				o.Owners = owners
			})
			h.setDst(backend)
			if _, err := h.r.Open(workload("a")); err != nil {
				t.Fatal(err)
			}
			// curl is denied; a lookup failure is an unknown process (default: direct).
			for _, tc := range []struct {
				proc  rules.Process
				reset bool
			}{{rules.Process{Known: true, Comm: "curl"}, need}, {rules.Process{Known: true, Comm: "wget"}, false}, {rules.Process{}, false}} {
				owners.mu.Lock()
				owners.next = &tc.proc
				owners.mu.Unlock()
				c, err := net.Dial("tcp4", h.addr(t, "/ns/a"))
				if err != nil {
					// On loopback a reset can already surface at connect.
					if !tc.reset || !errors.Is(err, syscall.ECONNRESET) {
						t.Fatal(err)
					}
					continue
				}
				c.SetDeadline(time.Now().Add(5 * time.Second))
				// A reset that arrives before the write is reported once, by the
				// write (then reads see a closed socket: EOF), so every step's error
				// counts.
				_, werr := c.Write([]byte("x"))
				cerr := c.(*net.TCPConn).CloseWrite()
				got, err := io.ReadAll(c)
				c.Close()
				reset := errors.Is(werr, syscall.ECONNRESET) || errors.Is(werr, syscall.EPIPE) ||
					errors.Is(cerr, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNRESET)
				if tc.reset && !reset {
					t.Errorf("%+v: %q %v (write %v, close-write %v), want reset", tc.proc, got, err, werr, cerr)
				}
				if !tc.reset && string(got) != "xbye" {
					t.Errorf("%+v: %q %v, want carried", tc.proc, got, err)
				}
			}
			lookups, forgot := owners.calls()
			if !need {
				if len(lookups) != 0 {
					t.Errorf("%d lookups for a policy without process rules", len(lookups))
				}
				return
			}
			if len(lookups) != 3 || lookups[0].Netns != "/ns/a" || lookups[0].Dst != backend || !lookups[0].Src.Addr().IsLoopback() {
				t.Errorf("lookups %+v: want one per flow with the pod netns and destination", lookups)
			}
			if !waitFor(func() bool { _, f := owners.calls(); return len(f) == 3 }) {
				t.Errorf("forgotten %+v, want each flow's key when it ends", forgot)
			}
		})
	}
}

func TestProcessProxyMode(t *testing.T) {
	backend := echoServer(t)
	owners := &fakeOwners{byPort: map[uint16]rules.Process{}}
	h := newHarnessWith(t, nil, time.Minute, nil, func(o *Options) {
		o.Policy = func() Decider { return processDecider{need: true} }
		o.Owners = owners
	})
	w := workload("p")
	w.Mode = api.ModeProxy
	if _, err := h.r.Open(w); err != nil {
		t.Fatal(err)
	}
	proxyAddr := h.addr(t, "/ns/p:15080")
	connect := func(comm string) string {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}
		c, err := d.Dial("tcp4", proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		owners.set(c.LocalAddr().(*net.TCPAddr).AddrPort().Port(), rules.Process{Known: true, Comm: comm})
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n", backend)
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line
	}
	if got := connect("curl"); !strings.Contains(got, " 403") {
		t.Errorf("curl through the proxy: %q, want 403", got)
	}
	if got := connect("wget"); !strings.Contains(got, " 200") {
		t.Errorf("wget through the proxy: %q, want 200", got)
	}
	lookups, _ := owners.calls()
	want := netip.MustParseAddrPort(proxyAddr)
	if len(lookups) != 2 || lookups[0].Dst != want || lookups[0].Netns != "/ns/p" {
		t.Errorf("lookups %+v: want the client connection to %v", lookups, want)
	}
	if !waitFor(func() bool { _, f := owners.calls(); return len(f) == 2 }) {
		_, f := owners.calls()
		t.Errorf("forgotten %+v, want both client connections", f)
	}
	// A client connection still open when the workload goes away is forgotten too.
	c, err := net.Dial("tcp4", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: x\r\n\r\n", backend)
	if line, _ := bufio.NewReader(c).ReadString('\n'); !strings.Contains(line, " 200") {
		t.Fatalf("CONNECT: %q", line)
	}
	h.r.Close("p")
	if !waitFor(func() bool { _, f := owners.calls(); return len(f) == 3 }) {
		_, f := owners.calls()
		t.Errorf("forgotten %+v after Close, want the open connection too", f)
	}
}

// TestLogsKeepDestinationsOut: a failed exit is logged with its cause, never the
// destination (debug off).
func TestLogsKeepDestinationsOut(t *testing.T) {
	dst := netip.MustParseAddrPort("203.0.113.7:4")
	var logs lockedLog
	exits := map[string]DialFunc{"proxy": func(context.Context, *api.Workload, Dest) (net.Conn, error) {
		return nil, fmt.Errorf("upstream http://127.0.0.9:3128: %w", &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(dst), Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})
	}}
	h := newHarnessWith(t, fakeDecider{4: "proxy"}, time.Minute, exits, func(o *Options) {
		o.Log = slog.New(slog.NewTextHandler(&logs, nil))
	})
	h.setDst(dst)
	if _, err := h.r.Open(workload("a")); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp4", h.addr(t, "/ns/a"))
	if err == nil {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.ReadAll(c)
		c.Close()
	}
	if !waitFor(func() bool { return strings.Contains(logs.String(), "connection refused") }) {
		t.Fatalf("log lacks the cause:\n%s", logs.String())
	}
	if s := logs.String(); strings.Contains(s, "203.0.113") || !strings.Contains(s, "127.0.0.9:3128") {
		t.Errorf("log names the destination or lost the upstream:\n%s", s)
	}
}

type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
