package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/metrics"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

// sniffNameCases are first bytes a workload sends to a destination whose hostname the
// policy denies (blocked.example), and whether the flow must be carried. Every way a
// server would read blocked.example from them must be refused: a Host whose port is empty
// or not a number (servers take the host before the last colon), a request line a
// lenient server accepts, and a name the relay cannot read as one name at all, which
// must be refused rather than decided as a flow without a name.
var sniffNameCases = []struct {
	name    string
	send    string
	carried bool
}{
	{"allowed name", "GET / HTTP/1.1\r\nHost: ok.example\r\n\r\n", true},
	{"allowed name with an empty port", "GET / HTTP/1.1\r\nHost: ok.example:\r\n\r\n", true},
	{"no name", "GET / HTTP/1.0\r\nAccept: */*\r\n\r\n", true},
	{"empty Host", "GET / HTTP/1.1\r\nHost: \r\n\r\n", true},
	{"not http", "SSH-2.0-OpenSSH_9.6\r\n", true},
	{"denied name", "GET / HTTP/1.1\r\nHost: blocked.example\r\n\r\n", false},
	{"empty port", "GET / HTTP/1.1\r\nHost: blocked.example:\r\n\r\n", false},
	{"port not a number", "GET / HTTP/1.1\r\nHost: blocked.example:x\r\n\r\n", false},
	{"port out of range", "GET / HTTP/1.1\r\nHost: blocked.example:123456\r\n\r\n", false},
	{"absolute-form with an empty port", "GET http://blocked.example:/ HTTP/1.1\r\nHost: ok.example\r\n\r\n", false},
	{"space after the version", "GET / HTTP/1.1 \r\nHost: blocked.example\r\n\r\n", false},
	{"two-digit minor version", "GET / HTTP/1.10\r\nHost: blocked.example\r\n\r\n", false},
	{"empty line before the request", "\r\nGET / HTTP/1.1\r\nHost: blocked.example\r\n\r\n", false},
	{"malformed: two colons", "GET / HTTP/1.1\r\nHost: blocked.example:80:80\r\n\r\n", false},
	{"malformed: name in brackets", "GET / HTTP/1.1\r\nHost: [blocked.example]:80\r\n\r\n", false},
	{"malformed: two Host headers", "GET / HTTP/1.1\r\nHost: ok.example\r\nHost: blocked.example\r\n\r\n", false},
	{"malformed: space before the colon", "GET / HTTP/1.1\r\nHost : blocked.example\r\n\r\n", false},
	{"malformed: an allowed name is refused too", "GET / HTTP/1.1\r\nbogus\r\nHost: ok.example\r\n\r\n", false},
}

// checkSniffName sends each case's bytes on a connection from dial, half-closes and reads
// to the end: a carried flow comes back echoed from the destination, a refused one reset.
func checkSniffName(t *testing.T, dial func() (net.Conn, error)) {
	t.Helper()
	for _, tc := range sniffNameCases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := dial()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = io.WriteString(c, tc.send)
			if err == nil {
				err = c.(*net.TCPConn).CloseWrite()
			}
			var got []byte
			if err == nil {
				got, err = io.ReadAll(c)
			}
			// A reset surfaces at the write, the half-close or the read.
			reset := errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ENOTCONN)
			switch {
			case tc.carried && (err != nil || string(got) != tc.send+"bye"):
				t.Errorf("send %q: got %q, %v; want it carried to the destination", tc.send, got, err)
			case !tc.carried && !reset:
				t.Errorf("send %q: got %q, %v; want a reset (the policy denies blocked.example)", tc.send, got, err)
			}
		})
	}
}

const sniffNameRules = "default: direct\nrules:\n  - domain: blocked.example\n    action: deny\n"

// TestSniffNameGoroutines runs the cases on the goroutine path, with the test harness.
func TestSniffNameGoroutines(t *testing.T) {
	pol, err := rules.Parse("t", []byte(sniffNameRules), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, nil, time.Minute, nil, func(o *Options) {
		o.Policy = func() Decider { return pol }
		o.SniffWait = time.Second
	})
	h.setDst(echoServer(t))
	if _, err := h.r.Open(workload("a")); err != nil {
		t.Fatal(err)
	}
	checkSniffName(t, func() (net.Conn, error) { return net.Dial("tcp4", h.addr(t, "/ns/a")) })
}

// TestSniffNameNetns runs the cases through kl's capture in a pod netns, on the event
// loop and on the goroutine path.
func TestSniffNameNetns(t *testing.T) {
	const mark, port = 0x4b4c, 15913
	pod, ln := capturedPod(t, "klsn", mark, port)
	testutil.Serve(t, ln, func(c net.Conn) {
		io.Copy(c, c)
		c.Write([]byte("bye"))
	})
	pol, err := rules.Parse("t", []byte(sniffNameRules), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []struct {
		name  string
		loops int
	}{{"event loop", 1}, {"goroutines", -1}} {
		t.Run(path.name, func(t *testing.T) {
			log, err := audit.New("", 0, 0, 100)
			if err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			met, err := metrics.New(reg)
			if err != nil {
				t.Fatal(err)
			}
			r := New(Options{RedirectPort: port, Mark: mark, Loops: path.loops, SniffWait: time.Second,
				Policy: func() Decider { return pol }, Audit: log, Metrics: met})
			defer testutil.Shutdown(t, r)
			if _, err := r.Open(api.Workload{ID: "w", Netns: pod.Path, Mode: api.ModeTransparent}); err != nil {
				t.Fatal(err)
			}
			if (len(r.loops) > 0) != (path.loops > 0) {
				t.Fatalf("%d event loops running, want the %s path", len(r.loops), path.name)
			}
			checkSniffName(t, func() (net.Conn, error) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				return netns.Dial(ctx, pod.Path, 0, "tcp", "192.0.2.2:80")
			})
			// A flow refused for a name that cannot be read is a decision, and audited
			// and counted as one: a deny of the domain dimension and tier with the
			// reason, never the name.
			want, denied := 0, uint64(0)
			for _, tc := range sniffNameCases {
				if strings.HasPrefix(tc.name, "malformed") {
					want++
				}
				if !tc.carried {
					denied++
				}
			}
			eventually := time.Now().Add(5 * time.Second)
			var refused []audit.Record
			for len(refused) < want && time.Now().Before(eventually) {
				time.Sleep(10 * time.Millisecond)
				refused = slices.DeleteFunc(log.Recent(100), func(r audit.Record) bool { return !strings.HasPrefix(r.Reason, "refused") })
			}
			if len(refused) != want {
				t.Fatalf("%d refusal records, want one for each of the %d malformed names: %+v", len(refused), want, log.Recent(100))
			}
			for _, rec := range refused {
				if rec.Exit != rules.ExitDeny || rec.Dimension != "domain" || rec.Priority != rules.PriorityDomain || rec.Rule != 0 || strings.Contains(rec.Reason, "example") {
					t.Errorf("refusal record %+v, want a deny of the domain dimension and tier, rule 0, naming no host", rec)
				}
			}
			for time.Now().Before(eventually) && r.Stats().ByExit[rules.ExitDeny] < denied {
				time.Sleep(10 * time.Millisecond)
			}
			if st := r.Stats(); st.ByExit[rules.ExitDeny] != denied || st.ByExit["refused"] != 0 {
				t.Errorf("Stats().ByExit = %v, want %d denied (%d by the rule, %d malformed names) and none refused", st.ByExit, denied, int(denied)-want, want)
			}
			if n := metricSum(t, reg, "kl_flows_total", map[string]string{"exit": "deny", "dimension": "domain", "rule": "0"}); n != float64(want) {
				t.Errorf("kl_flows_total{exit=deny,dimension=domain,rule=0} = %v, want %d (the malformed names)", n, want)
			}
		})
	}
}
