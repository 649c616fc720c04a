package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/tests/testutil"
)

// churnResult is what one add-all/remove-all cycle measured.
type churnResult struct {
	add, del                      []time.Duration // wall time of each kl-cni process
	addWork, delWork              []time.Duration // the plugin's own work (after process start), from its debug log
	floorTrue, floorVersion       []time.Duration // with floors: /bin/true and kl-cni VERSION after each ADD
	fdsBefore, fdsPeak, fdsAfter  int
	gorBefore, gorPeak, gorAfter  int
	workloadsPeak, workloadsAfter int
	tablesLeft                    []string
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	i := int(p * float64(len(s)-1))
	return s[i]
}

var workRE = regexp.MustCompile(`msg=(?:captured|released) .*total=(\S+)`)

// churn creates n sandbox netns, runs kl-cni ADD on each (so n listeners are open at
// once), then DEL on each and deletes them, timing every call. kl-cni is run directly
// (not through cnitool) so the figures are kl-cni's own: process start, the registration
// round trip, in which the relay installs the nftables table and opens its listener.
// With floors, each ADD is followed by an exec of /bin/true and of kl-cni VERSION: the
// cost of starting any process and of starting the plugin, on the machine as it is at
// that moment.
func churn(tb testing.TB, n int, floors bool) churnResult {
	nd := newNode(tb, false)
	nd.startRelay()
	plugin := testutil.Bin(tb, "kl-cni")
	var r churnResult

	prefix := testutil.Name("klc")
	names := make([]string, n+1) // the last one is the warm-up sandbox
	tb.Cleanup(func() {
		for _, name := range names {
			if name != "" {
				testutil.Output("ip", "netns", "del", name)
			}
		}
	})
	conf := func(i int) []byte {
		return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"churn","type":"kl-cni","socket":%q,"timeout":"5s",
"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/%s"}],
"ips":[{"interface":0,"address":"192.0.2.%d/24"}]}}`, nd.socket, names[i], 2+i%250))
	}
	call := func(cmd string, i int) (wall, work time.Duration, err error) {
		c := exec.Command(plugin)
		c.Env = append(os.Environ(), "KL_CNI_DEBUG=1", "CNI_COMMAND="+cmd, fmt.Sprintf("CNI_CONTAINERID=churn-%d", i),
			"CNI_NETNS=/var/run/netns/"+names[i], "CNI_IFNAME=eth0", "CNI_PATH=/nonexistent",
			fmt.Sprintf("CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=churn;K8S_POD_NAME=p-%d", i))
		c.Stdin = bytes.NewReader(conf(i))
		var out, errb bytes.Buffer
		c.Stdout, c.Stderr = &out, &errb
		start := time.Now()
		err = c.Run()
		wall = time.Since(start)
		if err != nil {
			return wall, 0, fmt.Errorf("kl-cni %s #%d: %v\n%s%s", cmd, i, err, out.String(), errb.String())
		}
		m := workRE.FindSubmatch(errb.Bytes())
		if m == nil {
			return wall, 0, fmt.Errorf("kl-cni %s #%d: no timing in its debug log:\n%s", cmd, i, errb.String())
		}
		work, err = time.ParseDuration(string(m[1]))
		return wall, work, err
	}
	// One sandbox added and removed before the baseline: what the relay opens once, on
	// first use, and keeps (its own netns handle, the conntrack event poller) is not a
	// leak.
	names[n] = prefix + "-warm"
	if out, err := testutil.Output("ip", "netns", "add", names[n]); err != nil {
		tb.Fatalf("ip netns add: %v %s", err, out)
	}
	for _, cmd := range []string{"ADD", "DEL"} {
		if _, _, err := call(cmd, n); err != nil {
			tb.Fatalf("warm-up: %v\nrelay:\n%s", err, nd.logs.String())
		}
	}
	testutil.Output("ip", "netns", "del", names[n])
	names[n] = ""
	st := nd.status()
	r.fdsBefore, r.gorBefore = st.FDs, st.Goroutines

	for i := 0; i < n; i++ {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
		if out, err := testutil.Output("ip", "netns", "add", names[i]); err != nil {
			tb.Fatalf("ip netns add: %v %s", err, out)
		}
		d, w, err := call("ADD", i)
		if err != nil {
			tb.Fatalf("%v\nrelay:\n%s", err, nd.logs.String())
		}
		r.add, r.addWork = append(r.add, d), append(r.addWork, w)
		if floors {
			r.floorTrue = append(r.floorTrue, timeExec(tb, nil, "/bin/true"))
			r.floorVersion = append(r.floorVersion, timeExec(tb, []byte(`{"cniVersion":"1.1.0"}`), plugin, "CNI_COMMAND=VERSION"))
		}
	}
	st = nd.status()
	r.fdsPeak, r.gorPeak, r.workloadsPeak = st.FDs, st.Goroutines, st.Workloads
	for i := 0; i < n; i++ {
		d, w, err := call("DEL", i)
		if err != nil {
			tb.Fatal(err)
		}
		r.del, r.delWork = append(r.del, d), append(r.delWork, w)
		// Sample the kernel: no kl table left behind by DEL.
		if i%25 == 0 {
			out, _ := testutil.Output("ip", "netns", "exec", names[i], "nft", "list", "tables")
			if strings.TrimSpace(out) != "" {
				r.tablesLeft = append(r.tablesLeft, names[i]+": "+out)
			}
		}
		testutil.Output("ip", "netns", "del", names[i])
		names[i] = ""
	}
	// Goroutines of closed listeners and HTTP connections wind down asynchronously.
	deadline := time.Now().Add(3 * time.Second)
	for {
		st = nd.status()
		if st.Goroutines <= r.gorBefore+2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.fdsAfter, r.gorAfter, r.workloadsAfter = st.FDs, st.Goroutines, st.Workloads
	return r
}

// timeExec is the wall time of one run of bin with stdin and extra environment.
func timeExec(tb testing.TB, stdin []byte, bin string, env ...string) time.Duration {
	c := exec.Command(bin)
	c.Env = append(os.Environ(), env...)
	c.Stdin = bytes.NewReader(stdin)
	start := time.Now()
	out, err := c.CombinedOutput()
	d := time.Since(start)
	if err != nil {
		tb.Fatalf("%s: %v\n%s", bin, err, out)
	}
	return d
}

// TestCNIChurn adds 500 sandboxes (all live at once), removes them, and checks that the
// relay leaks no descriptors, goroutines, listeners or registrations and DEL no tables.
func TestCNIChurn(t *testing.T) {
	// The benchmark runs 500; the test keeps the package's run time short.
	n := 100
	if testing.Short() {
		n = 30
	}
	r := churn(t, n, false)
	t.Logf("%d sandboxes: ADD p50 %v p99 %v (plugin work p50 %v p99 %v); DEL p50 %v p99 %v (work p50 %v p99 %v)", n,
		pct(r.add, .5), pct(r.add, .99), pct(r.addWork, .5), pct(r.addWork, .99),
		pct(r.del, .5), pct(r.del, .99), pct(r.delWork, .5), pct(r.delWork, .99))
	t.Logf("relay fds %d -> %d (all live) -> %d; goroutines %d -> %d -> %d", r.fdsBefore, r.fdsPeak, r.fdsAfter, r.gorBefore, r.gorPeak, r.gorAfter)
	if r.workloadsPeak != n {
		t.Errorf("%d workloads registered with all sandboxes live, want %d", r.workloadsPeak, n)
	}
	if r.fdsPeak < r.fdsBefore+n-2 {
		t.Errorf("fds with %d sandboxes live: %d (from %d): a listener per sandbox expected", n, r.fdsPeak, r.fdsBefore)
	}
	if r.workloadsAfter != 0 {
		t.Errorf("%d workloads left after DEL", r.workloadsAfter)
	}
	// One descriptor of slack: the status call's own connection.
	if r.fdsAfter > r.fdsBefore+1 {
		t.Errorf("relay leaked descriptors: %d before, %d after", r.fdsBefore, r.fdsAfter)
	}
	if r.gorAfter > r.gorBefore+2 {
		t.Errorf("relay leaked goroutines: %d before, %d after", r.gorBefore, r.gorAfter)
	}
	if len(r.tablesLeft) > 0 {
		t.Errorf("DEL left tables: %v", r.tablesLeft)
	}
}

// BenchmarkCNIChurn reports the same cycle's figures for tests/bench (run with
// -benchtime=1x: one cycle of 500 sandboxes per run).
func BenchmarkCNIChurn(b *testing.B) {
	for i := 0; i < b.N; i++ {
		r := churn(b, 500, true)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		b.ReportMetric(ms(pct(r.add, .5)), "add-p50-ms")
		b.ReportMetric(ms(pct(r.add, .99)), "add-p99-ms")
		b.ReportMetric(ms(pct(r.addWork, .5)), "add-work-p50-ms")
		b.ReportMetric(ms(pct(r.addWork, .99)), "add-work-p99-ms")
		b.ReportMetric(ms(pct(r.del, .5)), "del-p50-ms")
		b.ReportMetric(ms(pct(r.del, .99)), "del-p99-ms")
		b.ReportMetric(ms(pct(r.delWork, .5)), "del-work-p50-ms")
		b.ReportMetric(ms(pct(r.delWork, .99)), "del-work-p99-ms")
		b.ReportMetric(ms(pct(r.floorTrue, .5)), "exec-true-p50-ms")
		b.ReportMetric(ms(pct(r.floorVersion, .5)), "exec-version-p50-ms")
		b.ReportMetric(float64(r.fdsAfter-r.fdsBefore), "leaked-fds")
		b.ReportMetric(float64(r.gorAfter-r.gorBefore), "leaked-goroutines")
		b.ReportMetric(float64(r.fdsPeak-r.fdsBefore), "fds-500-live")
	}
}
