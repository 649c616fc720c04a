package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/fastpath"
	"github.com/kl-egress/kl/rules"
)

func init() {
	register(Section{
		Name: "fastpath",
		Doc: "Kernel fast path (issue 9), on the relay section's topology, side by side in one run: " +
			"iperf3 and the short-connection loop (medians of 6 round-robin runs, each starting one variant further along; every loop starts with no TIME_WAIT socket of an earlier one, and reuse on in the pod) for direct (no capture); kernel-decided " +
			"flows (capture installed, the pod's plan accepts the server's /24 in the kernel through the " +
			"cidr mark map, every other destination to the relay; conntrack watcher and audit on); the same " +
			"without the watcher (what the table and conntrack cost alone); the same " +
			"with a 10k-rule policy compiled into the pod's table; kl-relayd deciding the pod's flows in the kernel " +
			"itself (default: direct, its watcher in the daemon's process as deployed, while the rows above run the " +
			"watcher in this process, next to the client and server); and flows relayed by kl-relayd " +
			"(transparent, noFastPath, direct exit). `kernel records` are the audit records the watcher made (late: " +
			"from a DESTROY event, the NEW one not delivered in time). Targets: kernel-decided >= 0.97x direct throughput and >= 0.9x " +
			"direct conn/s. Then the cost of computing and installing the per-pod table of a 10k-rule " +
			"policy (medians of 5), and of a reload across 500 pods (netns created and deleted in a bounded loop).",
		Run: runFastpath,
	})
}

// bigPolicy is a dimension-form policy of n rules: mostly /24 cidr rules (some direct,
// some proxy, a few IPv6), port rules, and the bench server's /24 direct near the end.
func bigPolicy(n int) string {
	var b strings.Builder
	b.WriteString("default: proxy\nrules:\n")
	for i := 0; i < n-1; i++ {
		switch {
		case i%10 == 9:
			fmt.Fprintf(&b, "  - port: \"%d\"\n    action: %s\n", 10000+i, []string{"direct", "deny"}[i%2])
		case i%10 == 8:
			fmt.Fprintf(&b, "  - cidr: \"fd00:%x::/32\"\n    action: direct\n", i)
		default:
			fmt.Fprintf(&b, "  - cidr: \"10.%d.%d.0/24\"\n    action: %s\n    note: r%d\n", i/256%256, i%256, []string{"direct", "proxy"}[i%2], i)
		}
	}
	b.WriteString("  - cidr: \"192.0.2.0/24\"\n    action: direct\n    note: bench server\n")
	return b.String()
}

// fastpathRuns is how many round-robin runs the section makes: the differences it
// measures (a few percent of connection rate) need more than the relay section's 3 on a
// shared machine.
const fastpathRuns = 6 // one per variant: each is measured once in every position

// pollLag is how long after a loop the bench waits before it counts the records: the
// watcher reads events every 50 ms under load, 200 ms idle.
const pollLag = 300 * time.Millisecond

func runFastpath(ctx context.Context) ([]Row, error) {
	b, err := newRelayBench("conntrack")
	if err != nil {
		return nil, err
	}
	defer b.cleanup()
	small, err := rules.Parse("fastpath.yaml", []byte("default: proxy\nrules:\n  - cidr: 192.0.2.0/24\n    action: direct\n    note: bench server\n"), rules.LoadOptions{})
	if err != nil {
		return nil, err
	}
	big, err := rules.Parse("fastpath-10k.yaml", []byte(bigPolicy(10000)), rules.LoadOptions{})
	if err != nil {
		return nil, err
	}
	log, err := audit.New("", 0, 0, 1024)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	var mgr *fastpath.Manager
	stopKernel := func() {
		if mgr != nil {
			mgr.Close()
			mgr = nil
		}
		_ = netns.Remove(b.podPath)
	}
	kernel := func(p *rules.Policy, watch bool) func() error {
		return func() error {
			b.stopRelay()
			stopKernel()
			if err := netns.Install(b.podPath, netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: api.DefaultMark}); err != nil {
				return err
			}
			mgr = fastpath.New(fastpath.Options{Sink: log, NoWatch: !watch})
			return mgr.Add(fastpath.Pod{ID: "bench", Netns: b.podPath}, p)
		}
	}
	type variant struct {
		name   string
		prep   func() error
		daemon bool // kl-relayd decides: its own status counts the kernel records
	}
	variants := []variant{
		{"direct", func() error { b.stopRelay(); stopKernel(); return nil }, false},
		{"kernel-decided", kernel(small, true), false},
		{"kernel-decided, no audit watcher", kernel(small, false), false},
		{"kernel-decided, 10k-rule table", kernel(big, true), false},
		// As deployed: kl-relayd's own fast path (the pod's plan is all direct, so its table
		// has no redirect at all) with the watcher in the daemon, not in this process.
		{"kernel-decided by kl-relayd (watcher in the daemon)", func() error { stopKernel(); return b.startRelay("") }, true},
		{"relayed (kl-relayd, noFastPath, direct exit)", func() error {
			stopKernel()
			return b.startRelayBin(b.bin, "", "noFastPath: true\n")
		}, false},
	}
	type result struct {
		gbps, cps float64
		p50, p99  time.Duration
		records   uint64
		late      uint64
		err       error
	}
	// Thousands of short connections to one destination leave as many TIME_WAIT sockets
	// in the pod; without reuse, connect's port search slows every later run down,
	// whatever the path, and the variant measured last looks worst.
	if err := sh("ip", "netns", "exec", b.pod, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"); err != nil {
		return nil, err
	}
	results := make([]result, len(variants))
	samples := make([]struct {
		gbps, cps []float64
		p50, p99  []time.Duration
	}, len(variants))
	// Round robin: each run measures every variant once, so a change in the machine's
	// load affects them alike, and starts one variant further along (rotated), so each
	// variant is measured once in every position; medians of the runs.
	for round := range fastpathRuns {
		for i, v := range rotated(variants, round, fastpathRuns) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			r := &results[i]
			if r.err != nil {
				continue
			}
			if r.err = v.prep(); r.err != nil {
				continue
			}
			// Every variant starts from an empty conntrack table in the pod: no TIME_WAIT
			// entry of an earlier variant to reuse, and none whose NAT binding still
			// points at a relay that was stopped.
			if r.err = b.flushConntrack(); r.err != nil {
				continue
			}
			g, err := b.iperf(ctx)
			if err != nil {
				r.err = err
				continue
			}
			if r.err = b.fresh(); r.err != nil {
				continue
			}
			c, p50, p99, err := b.connLoop(ctx)
			if err != nil {
				r.err = err
				continue
			}
			sm := &samples[i]
			sm.gbps, sm.cps, sm.p50, sm.p99 = append(sm.gbps, g), append(sm.cps, c), append(sm.p50, p50), append(sm.p99, p99)
			if mgr != nil || v.daemon {
				time.Sleep(pollLag) // the last records of the loop
			}
			switch {
			case mgr != nil:
				st := mgr.Status()[0]
				r.records += st.Flows
				r.late += st.Late
			case v.daemon:
				// A new daemon every round: its counts are this round's.
				var st api.Status
				if r.err = api.NewClient(b.socket, 2*time.Second).Call(ctx, "GET", "/v1/status", nil, &st); r.err != nil {
					continue
				}
				if len(st.Kernel) != 1 {
					r.err = fmt.Errorf("kl-relayd status: %d kernel workloads, want 1", len(st.Kernel))
					continue
				}
				r.records += st.Kernel[0].Flows
				r.late += st.Kernel[0].Late
			}
		}
	}
	for i := range results {
		if r, sm := &results[i], samples[i]; r.err == nil && len(sm.gbps) > 0 {
			r.gbps, r.cps, r.p50, r.p99 = median(sm.gbps), median(sm.cps), median(sm.p50), median(sm.p99)
		}
	}
	b.stopRelay()
	stopKernel()
	d := results[0]
	var rows []Row
	for i, v := range variants {
		r := results[i]
		if r.err != nil {
			rows = append(rows, Row{Name: v.name, Cols: []Col{{"throughput", "error: " + firstLine(r.err)}}})
			continue
		}
		cols := []Col{
			{"throughput", fmt.Sprintf("%.2f Gbit/s", r.gbps)},
			{"vs direct", ratio(r.gbps, d.gbps)},
			{"conn/s", fmt.Sprintf("%.0f", r.cps)},
			{"conn vs direct", ratio(r.cps, d.cps)},
			{"setup p50/p99", fmt.Sprintf("%s / %s", fmtNs(float64(r.p50)), fmtNs(float64(r.p99)))},
		}
		if r.records > 0 {
			cols = append(cols, Col{"kernel records", fmt.Sprintf("%d (%d late)", r.records, r.late)})
		}
		rows = append(rows, Row{Name: v.name, Cols: cols})
	}

	// Compile and install cost of a 10k-rule pod table.
	crow, err := compileCost(b.podPath, big)
	if err != nil {
		rows = append(rows, Row{Name: "10k-rule table", Cols: []Col{{"throughput", "error: " + firstLine(err)}}})
	} else {
		rows = append(rows, crow...)
	}
	rrow, err := reload500(ctx, small, big)
	if err != nil {
		rows = append(rows, Row{Name: "reload 500 pods", Cols: []Col{{"throughput", "error: " + firstLine(err)}}})
	} else {
		rows = append(rows, rrow...)
	}
	return rows, nil
}

// compileCost times Plan, Compile and the table build of a 10k-rule policy, and the
// atomic install of the resulting table, medians of 5.
func compileCost(podPath string, p *rules.Policy) ([]Row, error) {
	c := netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: api.DefaultMark, IPv6: true}
	var plan, build, install []time.Duration
	var elems int
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		kp := p.Plan(nil, "")
		t1 := time.Now()
		d := fastpath.Compile(kp, uint8(i+1))
		t, err := c.ProgramWith(d)
		if err != nil {
			return nil, err
		}
		t2 := time.Now()
		if err := netns.InstallDecisions(podPath, c, d); err != nil {
			return nil, err
		}
		t3 := time.Now()
		plan, build, install = append(plan, t1.Sub(t0)), append(build, t2.Sub(t1)), append(install, t3.Sub(t2))
		elems = 0
		for _, s := range t.Sets {
			elems += len(s.Addrs) + len(s.PortRanges) + len(s.Ports)
		}
	}
	_ = netns.Remove(podPath)
	return []Row{{Name: "10k-rule table", Cols: []Col{
		{"throughput", fmt.Sprintf("plan %s, compile %s, install %s", fmtNs(float64(median(plan))), fmtNs(float64(median(build))), fmtNs(float64(median(install))))},
		{"vs direct", fmt.Sprintf("%d set elements", elems)},
	}}}, nil
}

// reload500 creates 500 pod netns with a capture each, registers them with one manager
// (watchers on), times one Reload across all of them, and deletes them.
func reload500(ctx context.Context, a, big *rules.Policy) ([]Row, error) {
	const pods = 500
	id := strconv.Itoa(os.Getpid() % 100000)
	var names []string
	defer func() {
		for _, n := range names {
			_ = sh("ip", "netns", "del", n)
		}
	}()
	m := fastpath.New(fastpath.Options{})
	defer m.Close()
	c := netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: api.DefaultMark, IPv6: true, RejectQUIC: true}
	var add time.Duration
	for i := 0; i < pods; i++ {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		n := fmt.Sprintf("klbr%s-%d", id, i)
		if err := sh("ip", "netns", "add", n); err != nil {
			return nil, err
		}
		names = append(names, n)
		path := "/var/run/netns/" + n
		if err := netns.Install(path, c); err != nil {
			return nil, err
		}
		t0 := time.Now()
		if err := m.Add(fastpath.Pod{ID: n, Netns: path}, a); err != nil {
			return nil, err
		}
		add += time.Since(t0)
	}
	t0 := time.Now()
	if err := m.Reload(big); err != nil {
		return nil, err
	}
	tBig := time.Since(t0)
	t0 = time.Now()
	if err := m.Reload(a); err != nil {
		return nil, err
	}
	tSmall := time.Since(t0)
	return []Row{{Name: "reload 500 pods", Cols: []Col{
		{"throughput", fmt.Sprintf("small policy %s (%s/pod), to 10k rules %s (%s/pod)", tSmall.Round(time.Millisecond), fmtNs(float64(tSmall)/pods), tBig.Round(time.Millisecond), fmtNs(float64(tBig)/pods))},
		{"vs direct", fmt.Sprintf("register %s/pod", fmtNs(float64(add)/pods))},
	}}}, nil
}
