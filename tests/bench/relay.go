package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/upstream"
	"github.com/kl-egress/kl/tests/testutil"
)

func init() {
	register(Section{
		Name: "relay",
		Doc: "Data path on one netns topology (a pod netns 192.0.2.2 and a server netns 192.0.2.1 " +
			"joined by a veth), side by side in one run: iperf3 (3 s, one stream), a Go stream (3 s, " +
			"one connection writing 256 KiB blocks to a counting sink) and a short-connection loop " +
			"(4 workers for 2 s: connect, 1 byte, echo, close; each loop starts with no TIME_WAIT socket left by an earlier one, and each variant with an empty conntrack table in the pod), medians of 3 rounds; every round " +
			"visits every variant in turn, starting further along than the last (by 1/rounds of the list), so a load change on the shared machine hits them alike. " +
			"Variants: direct; kl-relayd in transparent mode with the direct exit, with the kernel " +
			"fast path (the default: the kernel carries the flows) and without it (the relay carries them); the issue's reference, a bare Go " +
			"splice relay (accept, original destination, dial, io.Copy both ways: nothing of kl's decision, audit or metrics) behind the same capture table, and the same bare relay in front of dante and of squid (a hand-written no-auth SOCKS5 " +
			"CONNECT, one round trip per message, or an HTTP CONNECT, as redsocks does); the same bare relay's job done by one thread with its own " +
			"epoll loop (`bare epoll relay`: GOMAXPROCS 1, sockets the netpoller never sees, raw system calls, splice through a pipe per direction: Go's scheduler " +
			"left out of the connection path, the shape of redsocks), direct and in front of dante and squid; each upstream " +
			"alone, no relay (`dante alone`, `squid alone`: a Go client in the pod speaking SOCKS5 " +
			"or CONNECT to it, the ceiling any relay in front of that upstream can reach; no iperf3, " +
			"which cannot speak to a proxy); kl-relayd to a SOCKS5 (dante, also with `pipeline: true`, greeting and CONNECT in one write) and to a CONNECT (squid, also with `pipeline: true`, the client's first bytes in the CONNECT request's write) " +
			"upstream; and redsocks (Debian 0.5) to the same upstreams, with splice on (its fastest setting: `vs redsocks`) and as configured by default (copies through libevent buffers, the setting the issue measured: `vs redsocks default`). " +
			"`vs bare relay` is kl-relayd (or the epoll relay) over the bare relay doing the same job (direct, or to an upstream). `vs alone` is a relay's stream and conn/s over its upstream's ceiling (1.0x: the upstream " +
			"is the bottleneck). KL_BENCH_BASE_BIN=path/to/kl-relayd adds `kl@base` rows through " +
			"both upstreams and relayed direct: an older build measured in the same rounds " +
			"(KL_BENCH_RELAY_ONLY=words keeps only the rows naming one, KL_BENCH_RELAY_RUNS=n sets the rounds). `setup +p50/p99` is the added " +
			"connect+echo latency over direct. `conn/s vs redsocks … by round` is the median of each round's own ratio, [lowest–highest]: both ran in every round, so a load change on the shared machine falls on both. `relay CPU/conn` is the relaying process's user+system " +
			"CPU time (from /proc) per connection of the loop, `upstream CPU/conn` the same for the upstream (squid, dante: the process with all its children, running or ended), `relay ÷ upstream conn/s per CPU` the connections a second the relay could carry on a CPU of its own over those the upstream could (the upstream's CPU/conn over the relay's, the upstream alone's when its own is blank; above 1.0x the upstream runs out of CPU first: it, not the relay, is the bottleneck), and `ctx switches/conn` the relay's threads' context switches (voluntary and not) per connection: " +
			"on this virtual machine a switch is the dearest thing a relay does, and it is where a Go relay (kl or bare) and redsocks' single epoll loop differ. `idle KiB/conn` is the relaying process's RSS growth " +
			"(kl-relayd, redsocks) with 1000 relayed connections held open. Targets: transparent >= " +
			"0.65x direct throughput and >= 0.45x direct conn/s; via an upstream >= 3x redsocks' " +
			"throughput and conn/s at least redsocks'; <= 16 KiB per idle relayed connection.",
		Run: runRelay,
	})
}

const (
	benchPodAddr  = "192.0.2.2"
	benchSrvAddr  = "192.0.2.1"
	benchEchoPort = 7
	benchSinkPort = 9 // counts what it receives, answers the count at the end
	benchIperf    = 5201
	benchDante    = 1080
	benchSquid    = 3128
	benchRedsocks = 12345
	benchWorkers  = 4
	benchLoopFor  = 2 * time.Second
	benchStream   = 3 * time.Second
	benchBlock    = 256 << 10
	benchIdle     = 1000
	benchRuns     = 3
)

// median of a non-empty slice (sorted in place).
func median[T float64 | time.Duration](v []T) T {
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	return v[len(v)/2]
}

// relayBench is the topology and the processes it runs; cleanup undoes all of it.
type relayBench struct {
	dir        string
	pod, srv   string // netns names
	podPath    string
	pair       string // a second pod netns, for redsocks beside kl-relayd (pairs.go)
	cleanups   []func()
	relay      *exec.Cmd
	relayDone  chan struct{}
	relayLog   *bytes.Buffer
	socket     string
	bin        string
	podCapture bool
	otherPid   int // the relay that is not kl-relayd: redsocks or the bare relay
	dantePid   int // the upstreams (dante's mother process: its children work)
	squidPid   int
	stopOther  func() // stops it and removes what it put in the pod
}

func (b *relayBench) onCleanup(f func()) { b.cleanups = append(b.cleanups, f) }

func (b *relayBench) cleanup() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		b.cleanups[i]()
	}
}

func sh(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// start runs a long-lived program in a netns and stops it by PID at cleanup.
func (b *relayBench) start(ns string, name string, args ...string) (*exec.Cmd, *bytes.Buffer, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s: %w", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	b.onCleanup(func() { stopProc(cmd, done) })
	return cmd, &out, nil
}

func stopProc(cmd *exec.Cmd, done chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// waitTCP waits until addr accepts connections from inside ns.
func waitTCP(nsPath, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		c, err := netns.Dial(ctx, nsPath, 0x4b4c, "tcp", addr)
		cancel()
		if err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on %s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// relayVariant is one way the pod's traffic reaches the server.
type relayVariant struct {
	name  string
	prep  func() error
	iperf bool            // iperf3 runs (it cannot speak to a bare upstream)
	via   upstream.Dialer // the pod's client speaks to this upstream itself (nil: plain TCP)
	idle  func() int      // the relaying process to weigh with idle connections (nil: none)
	proc  func() int      // the relaying process whose CPU time the connection loop costs (nil: none)
	up    int             // the upstream's process (0: none), whose CPU time is measured too
	alone string          // the row of this variant's upstream alone: its ceiling
	red   string          // the redsocks row to compare with (splice on, its fastest)
	redCp string          // the redsocks row in its default setting (buffer copies)
	bare  string          // the bare relay's row, the reference for relaying
}

type relayResult struct {
	gbps, sgbps, cps []float64
	cpuPerConn       []time.Duration // the relaying process's CPU time per short connection
	swPerConn        []float64       // and its threads' context switches per short connection
	upPerConn        []time.Duration // the upstream's CPU time (with its children's) per short connection
	p50s, p99s       []time.Duration
	idleKiB          float64
	err              error
}

func runRelay(ctx context.Context) ([]Row, error) {
	b, err := newRelayBench("redsocks", "conntrack")
	if err != nil {
		return nil, err
	}
	defer b.cleanup()
	danteURL := fmt.Sprintf("socks5://%s:%d", benchSrvAddr, benchDante)
	squidURL := fmt.Sprintf("http://%s:%d", benchSrvAddr, benchSquid)
	// The bare-upstream client dials from the goroutine's own thread, already in the pod
	// netns (connLoop and stream run it inside netns.Do): nothing of kl's dial path.
	danteAlone, err := upstream.New(danteURL, 3*time.Second, nil)
	if err != nil {
		return nil, err
	}
	squidAlone, err := upstream.New(squidURL, 3*time.Second, nil)
	if err != nil {
		return nil, err
	}
	relayPid := func() int { return b.relay.Process.Pid }
	otherPid := func() int { return b.otherPid }
	variants := []relayVariant{
		{name: "direct", prep: b.clear, iperf: true},
		// With the kernel fast path (the default) kl-relayd programs the pod's table so the
		// kernel carries these flows itself; without it the relay carries them.
		{name: "kl transparent, direct", prep: func() error { return b.startRelayBin(b.bin, "") }, iperf: true, proc: relayPid},
		{name: "kl transparent, direct, relayed (noFastPath)", prep: func() error { return b.startRelayBin(b.bin, "", "noFastPath: true\n") },
			iperf: true, idle: relayPid, proc: relayPid, bare: bareRow},
		// The reference relay, in the same rounds (tests/bench/bare.go).
		{name: bareRow, prep: func() error { return b.startBare() }, iperf: true, idle: otherPid, proc: otherPid},
		// The same job on one thread with its own epoll loop, Go's scheduler left out
		// (tests/bench/epoll.go): the experiment of the context-switch question.
		{name: epollRow, prep: func() error { return b.startEpoll() }, iperf: true, idle: otherPid, proc: otherPid, bare: bareRow},
		{name: "dante alone (no relay)", prep: b.clear, via: danteAlone},
		{name: "redsocks → dante", prep: func() error { return b.redsocks("socks5", benchDante, true) }, iperf: true,
			idle: otherPid, proc: otherPid, alone: "dante alone (no relay)"},
		{name: "redsocks default (no splice) → dante", prep: func() error { return b.redsocks("socks5", benchDante, false) }, iperf: true,
			proc: otherPid, alone: "dante alone (no relay)"},
		{name: bareDanteRow, prep: func() error { return b.startBare(danteURL) }, iperf: true,
			proc: otherPid, alone: "dante alone (no relay)", red: "redsocks → dante", redCp: "redsocks default (no splice) → dante"},
		{name: epollDanteRow, prep: func() error { return b.startEpoll(danteURL) }, iperf: true, proc: otherPid,
			alone: "dante alone (no relay)", red: "redsocks → dante", redCp: "redsocks default (no splice) → dante", bare: bareDanteRow},
		{name: "kl → dante (socks5)", prep: func() error { return b.startRelayBin(b.bin, danteURL) }, iperf: true, proc: relayPid,
			alone: "dante alone (no relay)", red: "redsocks → dante", redCp: "redsocks default (no splice) → dante", bare: bareDanteRow},
		// The same with `pipeline: true` (the line continues the settings' proxy block):
		// greeting and CONNECT in one write, a round trip less per connection.
		{name: "kl → dante (socks5, pipelined)", prep: func() error { return b.startRelayBin(b.bin, danteURL, "  pipeline: true\n") }, iperf: true, proc: relayPid,
			alone: "dante alone (no relay)", red: "redsocks → dante", redCp: "redsocks default (no splice) → dante", bare: bareDanteRow},
		{name: "squid alone (no relay)", prep: b.clear, via: squidAlone},
		{name: "redsocks → squid", prep: func() error { return b.redsocks("http-connect", benchSquid, true) }, iperf: true, proc: otherPid,
			alone: "squid alone (no relay)"},
		{name: "redsocks default (no splice) → squid", prep: func() error { return b.redsocks("http-connect", benchSquid, false) }, iperf: true,
			proc: otherPid, alone: "squid alone (no relay)"},
		{name: bareSquidRow, prep: func() error { return b.startBare(squidURL) }, iperf: true,
			proc: otherPid, alone: "squid alone (no relay)", red: "redsocks → squid", redCp: "redsocks default (no splice) → squid"},
		{name: epollSquidRow, prep: func() error { return b.startEpoll(squidURL) }, iperf: true, proc: otherPid,
			alone: "squid alone (no relay)", red: "redsocks → squid", redCp: "redsocks default (no splice) → squid", bare: bareSquidRow},
		{name: "kl → squid (CONNECT)", prep: func() error { return b.startRelayBin(b.bin, squidURL) }, iperf: true, proc: relayPid,
			alone: "squid alone (no relay)", red: "redsocks → squid", redCp: "redsocks default (no splice) → squid", bare: bareSquidRow},
		// `pipeline: true`: the client's first bytes go with the CONNECT request.
		{name: "kl → squid (CONNECT, pipelined)", prep: func() error { return b.startRelayBin(b.bin, squidURL, "  pipeline: true\n") }, iperf: true, proc: relayPid,
			alone: "squid alone (no relay)", red: "redsocks → squid", redCp: "redsocks default (no splice) → squid", bare: bareSquidRow},
	}
	if base := os.Getenv("KL_BENCH_BASE_BIN"); base != "" {
		if !fileExists(base) {
			return nil, fmt.Errorf("KL_BENCH_BASE_BIN=%s: no such file", base)
		}
		// An older kl-relayd through the same upstreams, in the same rounds: a change's
		// effect side by side.
		at := slices.IndexFunc(variants, func(v relayVariant) bool { return v.name == "kl → dante (socks5)" }) + 1
		variants = slices.Insert(variants, at, relayVariant{name: "kl@base → dante (socks5)",
			prep: func() error { return b.startRelayBin(base, danteURL) }, iperf: true, proc: relayPid, alone: "dante alone (no relay)", red: "redsocks → dante", redCp: "redsocks default (no splice) → dante"})
		at = slices.IndexFunc(variants, func(v relayVariant) bool { return v.name == "kl transparent, direct, relayed (noFastPath)" }) + 1
		variants = slices.Insert(variants, at, relayVariant{name: "kl@base transparent, direct, relayed (noFastPath)",
			prep: func() error { return b.startRelayBin(base, "", "noFastPath: true\n") }, iperf: true, idle: relayPid, proc: relayPid, bare: bareRow})
		variants = append(variants, relayVariant{name: "kl@base → squid (CONNECT)",
			prep: func() error { return b.startRelayBin(base, squidURL) }, iperf: true, proc: relayPid, alone: "squid alone (no relay)", red: "redsocks → squid", redCp: "redsocks default (no splice) → squid"})
	}
	// Every row through an upstream (alone or behind a relay) names it.
	for i := range variants {
		switch name := variants[i].name; {
		case strings.Contains(name, "dante"):
			variants[i].up = b.dantePid
		case strings.Contains(name, "squid"):
			variants[i].up = b.squidPid
		}
	}
	if only := os.Getenv("KL_BENCH_RELAY_ONLY"); only != "" {
		// A focused run: the variants whose names contain one of these words, and direct.
		variants = slices.DeleteFunc(variants, func(v relayVariant) bool {
			if v.name == "direct" {
				return false
			}
			for _, w := range strings.Split(only, ",") {
				if strings.Contains(v.name, w) {
					return false
				}
			}
			return true
		})
	}
	results := make([]relayResult, len(variants))
	// Rounds: each visits every variant, so a change of load on the shared machine falls
	// on all of them instead of on whichever ran at that moment.
	runs := benchRuns
	if v := os.Getenv("KL_BENCH_RELAY_RUNS"); v != "" {
		// More rounds for a focused A/B run on a noisy machine.
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 50 {
			return nil, fmt.Errorf("KL_BENCH_RELAY_RUNS=%q: want a number of rounds from 1 to 50", v)
		}
		runs = n
	}
	for round := range runs {
		for i, v := range rotated(variants, round, runs) {
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
			if r.err = b.flushConntrack(); r.err != nil {
				continue
			}
			if v.iperf {
				g, err := b.iperf(ctx)
				if err != nil {
					r.err = err
					continue
				}
				r.gbps = append(r.gbps, g)
			}
			sg, err := b.stream(ctx, v.via)
			if err != nil {
				r.err = err
				continue
			}
			if r.err = b.fresh(); r.err != nil {
				continue
			}
			var cpu0, up0 time.Duration
			var sw0 int64
			if v.up != 0 {
				up0, _ = treeCPU(v.up)
			}
			if v.proc != nil {
				cpu0, _ = cpuTime(v.proc())
				sw0, _ = ctxSwitches(v.proc())
			}
			c, p50, p99, n, err := b.connLoopN(ctx, v.via)
			if err != nil {
				r.err = err
				continue
			}
			if v.up != 0 && n > 0 {
				if up1, err := treeCPU(v.up); err == nil {
					r.upPerConn = append(r.upPerConn, (up1-up0)/time.Duration(n))
				}
			}
			if v.proc != nil {
				if cpu1, err := cpuTime(v.proc()); err == nil && n > 0 {
					r.cpuPerConn = append(r.cpuPerConn, (cpu1-cpu0)/time.Duration(n))
				}
				if sw1, err := ctxSwitches(v.proc()); err == nil && n > 0 {
					r.swPerConn = append(r.swPerConn, float64(sw1-sw0)/float64(n))
				}
			}
			r.sgbps, r.cps, r.p50s, r.p99s = append(r.sgbps, sg), append(r.cps, c), append(r.p50s, p50), append(r.p99s, p99)
		}
	}
	for i, v := range variants {
		r := &results[i]
		if v.idle == nil || r.err != nil {
			continue
		}
		// An empty conntrack table here too: entries of the variant before still in a
		// closing state keep its NAT binding to a relay that is gone, and a client port
		// reused onto one is refused (seen once: redsocks → dante after an idle variant).
		if r.err = v.prep(); r.err == nil {
			if r.err = b.flushConntrack(); r.err == nil {
				r.idleKiB, r.err = b.idleCost(ctx, v.idle())
			}
		}
	}
	b.clear()

	type fig struct {
		gbps, sgbps, cps float64
		p50, p99, cpu    time.Duration
		upcpu            time.Duration
		sw               float64
		rounds           []float64 // conn/s of each round, in round order
		ok               bool
	}
	figs := map[string]fig{}
	for i, v := range variants {
		r := results[i]
		if r.err != nil || len(r.cps) == 0 {
			continue
		}
		rounds := slices.Clone(r.cps) // median sorts
		f := fig{sgbps: median(r.sgbps), cps: median(r.cps), p50: median(r.p50s), p99: median(r.p99s), ok: true, rounds: rounds}
		if len(r.gbps) > 0 {
			f.gbps = median(r.gbps)
		}
		if len(r.cpuPerConn) > 0 {
			f.cpu = median(r.cpuPerConn)
		}
		if len(r.swPerConn) > 0 {
			f.sw = median(r.swPerConn)
		}
		if len(r.upPerConn) > 0 {
			f.upcpu = median(r.upPerConn)
		}
		figs[v.name] = f
	}
	d := figs["direct"]
	var rows []Row
	for i, v := range variants {
		r := results[i]
		f, ok := figs[v.name]
		if !ok {
			err := r.err
			if err == nil {
				err = errors.New("no result")
			}
			rows = append(rows, Row{Name: v.name, Cols: []Col{{"throughput", "error: " + firstLine(err)}}})
			continue
		}
		cols := []Col{{"throughput", "-"}, {"vs direct", "-"}}
		if f.gbps > 0 {
			cols = []Col{{"throughput", fmt.Sprintf("%.2f Gbit/s", f.gbps)}, {"vs direct", ratio(f.gbps, d.gbps)}}
		}
		cols = append(cols,
			Col{"stream", fmt.Sprintf("%.2f Gbit/s", f.sgbps)},
			Col{"conn/s", fmt.Sprintf("%.0f", f.cps)},
			Col{"conn vs direct", ratio(f.cps, d.cps)},
			Col{"setup p50/p99", fmt.Sprintf("%s / %s", fmtNs(float64(f.p50)), fmtNs(float64(f.p99)))},
		)
		if i > 0 {
			cols = append(cols, Col{"setup +p50/p99", fmt.Sprintf("%s / %s", signedNs(f.p50-d.p50), signedNs(f.p99-d.p99))})
		}
		if f.cpu > 0 {
			cols = append(cols, Col{"relay CPU/conn", fmtNs(float64(f.cpu))})
		}
		if f.sw > 0 {
			cols = append(cols, Col{"ctx switches/conn", fmt.Sprintf("%.1f", f.sw)})
		}
		if f.upcpu > 0 {
			cols = append(cols, Col{"upstream CPU/conn", fmtNs(float64(f.upcpu))})
		}
		if v.alone != "" {
			if c := capacity(f.cpu, f.upcpu, figs[v.alone].upcpu); c != "" {
				cols = append(cols, Col{"relay ÷ upstream conn/s per CPU", c})
			}
		}
		if a, ok := figs[v.alone]; ok {
			cols = append(cols, Col{"vs alone", fmt.Sprintf("%s stream, %s conn/s", ratio(f.sgbps, a.sgbps), ratio(f.cps, a.cps))})
		}
		if rs, ok := figs[v.red]; ok {
			cols = append(cols, Col{"vs redsocks", fmt.Sprintf("%s thr, %s stream, %s conn/s", ratio(f.gbps, rs.gbps), ratio(f.sgbps, rs.sgbps), ratio(f.cps, rs.cps))})
			cols = append(cols, Col{"conn/s vs redsocks by round", paired(f.rounds, rs.rounds)})
		}
		if br, ok := figs[v.bare]; ok {
			cols = append(cols, Col{"vs bare relay", fmt.Sprintf("%s thr, %s conn/s", ratio(f.gbps, br.gbps), ratio(f.cps, br.cps))})
		}
		if rs, ok := figs[v.redCp]; ok {
			cols = append(cols, Col{"vs redsocks default", fmt.Sprintf("%s thr, %s stream, %s conn/s", ratio(f.gbps, rs.gbps), ratio(f.sgbps, rs.sgbps), ratio(f.cps, rs.cps))})
			cols = append(cols, Col{"conn/s vs redsocks default by round", paired(f.rounds, rs.rounds)})
		}
		if r.idleKiB != 0 {
			cols = append(cols, Col{"idle KiB/conn", fmt.Sprintf("%.1f", r.idleKiB)})
		}
		rows = append(rows, Row{Name: v.name, Cols: cols})
	}
	return rows, nil
}

// rotated yields the variants of one round with their indexes, starting at a different
// one each round (round r of n starts 1/n of the way further along), so no variant is
// always measured first, or always right after the same other one: on this machine the
// order alone moves a connection rate by 10% or more.
func rotated[V any](variants []V, round, rounds int) iter.Seq2[int, V] {
	return func(yield func(int, V) bool) {
		start := round * len(variants) / max(rounds, 1)
		for k := range variants {
			i := (start + k) % len(variants)
			if !yield(i, variants[i]) {
				return
			}
		}
	}
}

func firstLine(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, '\n'); i > 0 {
		s = s[:i]
	}
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}

// newRelayBench checks for root and the tools the relay topology needs (plus extra),
// and builds the topology; the caller cleans it up.
func newRelayBench(extra ...string) (*relayBench, error) {
	if err := needRoot(); err != nil {
		return nil, err
	}
	for _, tool := range append([]string{"ip", "nft", "iperf3", "danted", "squid"}, extra...) {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s is not installed (make deps installs it)", tool)
		}
	}
	b := &relayBench{}
	if err := b.setup(); err != nil {
		b.cleanup()
		return nil, err
	}
	return b, nil
}

func (b *relayBench) setup() error {
	var err error
	if b.dir, err = os.MkdirTemp("", "kl-bench-relay-"); err != nil {
		return err
	}
	b.onCleanup(func() { _ = os.RemoveAll(b.dir) })
	// Whatever kl-relayd relays the pod when the section ends (a section that fails
	// part way leaves one running): stopped before its directory goes.
	b.onCleanup(b.stopRelay)
	if err := os.Chmod(b.dir, 0o755); err != nil { // squid and dante drop privileges
		return err
	}
	id := strconv.Itoa(os.Getpid() % 100000)
	b.pod, b.srv = "klbp"+id, "klbs"+id
	b.podPath = "/var/run/netns/" + b.pod
	for _, ns := range []string{b.pod, b.srv} {
		if err := sh("ip", "netns", "add", ns); err != nil {
			return err
		}
		b.onCleanup(func() { _ = sh("ip", "netns", "del", ns) })
		if err := sh("ip", "-n", ns, "link", "set", "lo", "up"); err != nil {
			return err
		}
	}
	// Thousands of short connections leave as many TIME_WAIT sockets in the pod (the
	// client's, and a relay's towards its upstream); without reuse connect's port search
	// slows every later run down, whatever the path, and the variant measured last looks
	// worst. The sysctl is per netns and goes with it.
	if err := sh("ip", "netns", "exec", b.pod, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1"); err != nil {
		return err
	}
	vp, vs := "klbv"+id+"p", "klbv"+id+"s"
	if err := sh("ip", "link", "add", vp, "netns", b.pod, "type", "veth", "peer", "name", vs, "netns", b.srv); err != nil {
		return err
	}
	for _, c := range [][]string{
		{"-n", b.pod, "addr", "add", benchPodAddr + "/24", "dev", vp},
		{"-n", b.srv, "addr", "add", benchSrvAddr + "/24", "dev", vs},
		{"-n", b.pod, "link", "set", vp, "up"},
		{"-n", b.srv, "link", "set", vs, "up"},
	} {
		if err := sh("ip", c...); err != nil {
			return err
		}
	}
	// The echo server runs in this process, its socket in the server netns.
	ln, err := netns.Listen("/var/run/netns/"+b.srv, "tcp4", fmt.Sprintf("%s:%d", benchSrvAddr, benchEchoPort))
	if err != nil {
		return fmt.Errorf("echo server: %w", err)
	}
	b.onCleanup(func() { _ = ln.Close() })
	testutil.Accept(ln, func(c net.Conn) { _, _ = io.Copy(c, c) })
	// The sink counts what arrives for benchStream from the first byte on, then answers
	// the count and the time it took (8 bytes each, big endian) and closes: the figure
	// is what arrived, and no half-close is needed (squid ends a CONNECT tunnel at the
	// client's first FIN).
	sink, err := netns.Listen("/var/run/netns/"+b.srv, "tcp4", fmt.Sprintf("%s:%d", benchSrvAddr, benchSinkPort))
	if err != nil {
		return fmt.Errorf("sink server: %w", err)
	}
	b.onCleanup(func() { _ = sink.Close() })
	testutil.Accept(sink, func(c net.Conn) {
		buf := make([]byte, benchBlock)
		var n uint64
		var start time.Time
		_ = c.SetReadDeadline(time.Now().Add(benchStream + 10*time.Second))
		for start.IsZero() || time.Since(start) < benchStream {
			k, err := c.Read(buf)
			if n == 0 && k > 0 {
				start = time.Now()
			}
			n += uint64(k)
			if err != nil {
				return
			}
		}
		took := time.Since(start)
		_, _ = c.Write(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, n), uint64(took)))
		// Drain until the sender closes: closing with unread bytes would reset the
		// connection, and a reset can overtake the answer.
		_, _ = io.CopyBuffer(io.Discard, struct{ io.Reader }{c}, buf)
	})
	if _, _, err := b.start(b.srv, "iperf3", "-s", "-B", benchSrvAddr, "-p", strconv.Itoa(benchIperf)); err != nil {
		return err
	}
	dconf := filepath.Join(b.dir, "danted.conf")
	if err := os.WriteFile(dconf, []byte(fmt.Sprintf(`logoutput: stderr
internal: %[1]s port = %[2]d
external: %[1]s
clientmethod: none
socksmethod: none
user.privileged: root
user.unprivileged: nobody
client pass { from: 192.0.2.0/24 to: 0.0.0.0/0 }
client pass { from: %[3]s to: 0.0.0.0/0 }
socks pass { from: 192.0.2.0/24 to: 192.0.2.0/24 command: connect }
socks pass { from: %[3]s to: 192.0.2.0/24 command: connect }
`, benchSrvAddr, benchDante, pairNet)), 0o644); err != nil {
		return err
	}
	dante, _, err := b.start(b.srv, "danted", "-f", dconf, "-p", filepath.Join(b.dir, "danted.pid"))
	if err != nil {
		return err
	}
	b.dantePid = dante.Process.Pid // ip netns exec execs the program in place
	sconf := filepath.Join(b.dir, "squid.conf")
	// Squid looks each client's name up (a PTR query per connection, to nobody at
	// 127.0.0.1 in the server netns): the hosts file answers from memory instead.
	if err := os.WriteFile(filepath.Join(b.dir, "hosts"), []byte(benchPodAddr+" pod\n"+pairPodAddr+" pair\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(sconf, []byte(fmt.Sprintf(`http_port %s:%d
pid_filename %[3]s/squid.pid
cache_log %[3]s/cache.log
access_log none
coredump_dir %[3]s
cache deny all
shutdown_lifetime 0 seconds
dns_nameservers 127.0.0.1
hosts_file %[3]s/hosts
acl bench src 192.0.2.0/24 %[4]s
http_access allow bench
http_access deny all
`, benchSrvAddr, benchSquid, b.dir, pairNet)), 0o644); err != nil {
		return err
	}
	args, rm := testutil.SquidArgs(sconf)
	b.onCleanup(rm) // after the stop start registers
	squid, _, err := b.start(b.srv, "squid", args...)
	if err != nil {
		return err
	}
	b.squidPid = squid.Process.Pid
	srvPath := "/var/run/netns/" + b.srv
	for _, p := range []int{benchIperf, benchDante, benchSquid} {
		if err := waitTCP(srvPath, fmt.Sprintf("%s:%d", benchSrvAddr, p), 20*time.Second); err != nil {
			return err
		}
	}
	b.bin = filepath.Join(os.Getenv("KL_BIN"), "kl-relayd")
	if os.Getenv("KL_BIN") == "" || !fileExists(b.bin) {
		b.bin = filepath.Join(b.dir, "kl-relayd")
		if err := sh(goTool(), "build", "-o", b.bin, "./relayd/kl-relayd"); err != nil {
			return err
		}
	}
	b.socket = filepath.Join(b.dir, "relayd.sock")
	return nil
}

// redsocks puts redsocks in front of the pod's traffic to the server (nftables redirect
// of the iperf3 and echo ports), towards the given upstream. splice turns on its splice
// path; off, it is redsocks as configured by default, copying through libevent buffers (what
// the relay issue measured at 0.07x direct).
func (b *relayBench) redsocks(typ string, port int, splice bool) error {
	b.stopRelay()
	_ = netns.Remove(b.podPath)
	return b.redsocksIn(b.pod, typ, port, splice)
}

// redsocksIn runs redsocks in netns ns (a name) with its own capture table there, as the
// relay that is not kl-relayd (startOther).
func (b *relayBench) redsocksIn(ns, typ string, port int, splice bool) error {
	_ = sh("ip", "netns", "exec", ns, "nft", "delete", "table", "ip", "klbench")
	conf := filepath.Join(b.dir, fmt.Sprintf("redsocks-%s-%s-%t.conf", ns, typ, splice))
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(`base { log_debug = off; log_info = off; log = stderr; daemon = off; redirector = iptables; }
redsocks { local_ip = 127.0.0.1; local_port = %d; ip = %s; port = %d; type = %s; splice = %t; }
`, benchRedsocks, benchSrvAddr, port, typ, splice)), 0o644); err != nil {
		return err
	}
	if err := b.startOtherIn(ns, func() { _ = sh("ip", "netns", "exec", ns, "nft", "delete", "table", "ip", "klbench") },
		"redsocks", "-c", conf); err != nil {
		return err
	}
	rules := fmt.Sprintf("table ip klbench {\n chain out {\n  type nat hook output priority -100;\n  ip daddr %s tcp dport { %d, %d, %d } redirect to :%d\n }\n}",
		benchSrvAddr, benchIperf, benchEchoPort, benchSinkPort, benchRedsocks)
	rf := filepath.Join(b.dir, "redsocks-"+ns+".nft")
	if err := os.WriteFile(rf, []byte(rules+"\n"), 0o644); err != nil {
		return err
	}
	if err := sh("ip", "netns", "exec", ns, "nft", "-f", rf); err != nil {
		return err
	}
	return waitTCP("/var/run/netns/"+ns, fmt.Sprintf("127.0.0.1:%d", benchRedsocks), 10*time.Second)
}

// startOther starts a relay other than kl-relayd in the pod (stopping the one before);
// undo removes what was installed for it when it is stopped, at the next variant or at
// cleanup.
func (b *relayBench) startOther(undo func(), name string, args ...string) error {
	return b.startOtherIn(b.pod, undo, name, args...)
}

// startOtherIn is startOther in netns ns (a name).
func (b *relayBench) startOtherIn(ns string, undo func(), name string, args ...string) error {
	b.stopOtherRelay()
	cmd, _, err := b.start(ns, name, args...)
	if err != nil {
		return err
	}
	b.otherPid = cmd.Process.Pid // ip netns exec execs the program in place
	stop := b.cleanups[len(b.cleanups)-1]
	var once sync.Once
	b.cleanups[len(b.cleanups)-1] = func() { once.Do(stop) }
	b.stopOther = func() {
		once.Do(stop)
		undo()
	}
	return nil
}

func (b *relayBench) stopOtherRelay() {
	if b.stopOther != nil {
		b.stopOther()
		b.stopOther = nil
	}
}

// flushConntrack empties the pod's conntrack table, so every variant starts without the
// entries an earlier one left: thousands of TIME_WAIT ones from its connection loop
// (kept 120 s, so a kernel-decided variant measured after a relayed one paid for a table
// it did not fill) and NAT bindings to a relay that was stopped.
func (b *relayBench) flushConntrack() error {
	for _, ns := range b.pods() {
		if err := sh("ip", "netns", "exec", ns, "conntrack", "-F"); err != nil {
			return err
		}
	}
	return nil
}

// pods names the pod netns, and the pair's when there is one (pairs.go).
func (b *relayBench) pods() []string {
	if b.pair == "" {
		return []string{b.pod}
	}
	return []string{b.pod, b.pair}
}

// fresh ends the TIME_WAIT sockets the connection loops before left in the pod and the
// server netns (ss -K), so every loop starts from the same state. tcp_tw_reuse alone is
// not enough: connect's port search still walks the earlier loops' entries (60 s each),
// and whichever variant runs later in a round looks slower for it.
func (b *relayBench) fresh() error {
	for _, ns := range append(b.pods(), b.srv) {
		if err := sh("ip", "netns", "exec", ns, "ss", "-K", "-t", "state", "time-wait"); err != nil {
			return fmt.Errorf("end TIME_WAIT sockets in %s: %w", ns, err)
		}
	}
	return nil
}

// clear stops whatever relays the pod's traffic: its flows go straight to the server.
func (b *relayBench) clear() error {
	b.stopRelay()
	b.stopOtherRelay()
	return nil
}

// startRelay (re)starts kl-relayd with the transparent capture in the pod: the direct
// exit when proxyURL is empty, else `default: proxy` through that upstream.
func (b *relayBench) startRelay(proxyURL string) error { return b.startRelayBin(b.bin, proxyURL) }

// startRelayBin is startRelay with the kl-relayd binary bin.
// extra settings lines are appended to the daemon's settings file.
func (b *relayBench) startRelayBin(bin, proxyURL string, extra ...string) error {
	b.stopRelay()
	b.stopOtherRelay()
	cmd, done, log, err := b.runKl(bin, "", b.podPath, proxyURL, extra...)
	if cmd != nil {
		// Stopped by stopRelay, which removes the capture (whether or not it got that far).
		b.relay, b.relayDone, b.relayLog, b.podCapture = cmd, done, log, true
	}
	return err
}

// runKl starts kl-relayd (bin) with its own settings, socket and state under b.dir
// (named by tag: "" for the pod's daemon), in the host netns as deployed, and registers
// the pod netns at podPath with it (transparent, its capture installed): the direct
// exit when proxyURL is empty, else `default: proxy` through that upstream. cmd is set
// once the process runs, even when err reports a later step.
func (b *relayBench) runKl(bin, tag, podPath, proxyURL string, extra ...string) (cmd *exec.Cmd, done chan struct{}, log *bytes.Buffer, err error) {
	rulesPath := filepath.Join(b.dir, "rules"+tag+".yaml")
	rulesText := "default: direct\n"
	socket := b.socket
	if tag != "" {
		socket = filepath.Join(b.dir, "relayd-"+tag+".sock")
	}
	settings := fmt.Sprintf("socket: %s\nstateDir: %s\nrules: %s\nidleTimeout: 5m\nconnectTimeout: 3s\n",
		socket, filepath.Join(b.dir, "state"+tag), rulesPath)
	if proxyURL != "" {
		rulesText = "default: proxy\n"
		settings += fmt.Sprintf("proxy:\n  url: %s\n", proxyURL)
	}
	settings += strings.Join(extra, "")
	if err := os.WriteFile(rulesPath, []byte(rulesText), 0o644); err != nil {
		return nil, nil, nil, err
	}
	sp := filepath.Join(b.dir, "relayd"+tag+".yaml")
	if err := os.WriteFile(sp, []byte(settings), 0o600); err != nil {
		return nil, nil, nil, err
	}
	cmd = exec.Command(bin, "--settings", sp)
	log = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, fmt.Errorf("start kl-relayd: %w", err)
	}
	done = make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	cl := api.NewClient(socket, 2*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for cl.Ping(context.Background()) != nil {
		select {
		case <-done:
			return cmd, done, log, fmt.Errorf("kl-relayd exited: %s", log.String())
		default:
		}
		if time.Now().After(deadline) {
			return cmd, done, log, fmt.Errorf("kl-relayd not ready: %s", log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := netns.Install(podPath, netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: api.DefaultMark}); err != nil {
		return cmd, done, log, fmt.Errorf("install capture: %w", err)
	}
	if _, err := cl.Register(context.Background(), api.Workload{ID: "bench-" + filepath.Base(podPath), Netns: podPath, Mode: api.ModeTransparent, Source: "cni"}); err != nil {
		return cmd, done, log, fmt.Errorf("register: %w", err)
	}
	return cmd, done, log, waitTCP(podPath, fmt.Sprintf("127.0.0.1:%d", api.DefaultRedirectPort), 10*time.Second)
}

func (b *relayBench) stopRelay() {
	if b.relay != nil {
		stopProc(b.relay, b.relayDone)
		b.relay = nil
	}
	if b.podCapture {
		_ = netns.Remove(b.podPath)
		b.podCapture = false
	}
}

// iperf runs one iperf3 client in the pod and returns the received Gbit/s.
func (b *relayBench) iperf(ctx context.Context) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", b.pod, "iperf3", "-c", benchSrvAddr, "-p", strconv.Itoa(benchIperf), "-t", "3", "-J").Output()
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if jerr := json.Unmarshal(out, &r); jerr != nil || r.Error != "" || err != nil {
		return 0, fmt.Errorf("iperf3: %v %v %s", err, jerr, r.Error)
	}
	return r.End.SumReceived.BitsPerSecond / 1e9, nil
}

// dialFrom connects to the server's port from the pod, called inside netns.Do: plain TCP
// (which the pod's capture, if any, redirects), or through the upstream via itself.
func dialFrom(ctx context.Context, via upstream.Dialer, port uint16) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	ap := netip.AddrPortFrom(netip.MustParseAddr(benchSrvAddr), port)
	if via != nil {
		return via.Dial(ctx, upstream.Target{Addr: ap})
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp4", ap.String())
}

// stream sends benchBlock writes on one connection from the pod to the sink until the
// sink answers what arrived in benchStream; it returns that in Gbit/s.
func (b *relayBench) stream(ctx context.Context, via upstream.Dialer) (float64, error) {
	return b.streamIn(ctx, b.podPath, via)
}

// streamIn is stream from the netns at podPath.
func (b *relayBench) streamIn(ctx context.Context, podPath string, via upstream.Dialer) (float64, error) {
	var gbps float64
	err := netns.Do(podPath, func() error {
		c, err := dialFrom(ctx, via, benchSinkPort)
		if err != nil {
			return err
		}
		defer func() { _ = c.Close() }()
		buf := make([]byte, benchBlock)
		_ = c.SetDeadline(time.Now().Add(benchStream + 10*time.Second))
		answer := make(chan error, 1)
		var res [16]byte
		go func() {
			_, err := io.ReadFull(c, res[:])
			answer <- err
		}()
		for {
			select {
			case err := <-answer:
				if err != nil {
					return fmt.Errorf("no count from the sink: %w", err)
				}
				n, took := binary.BigEndian.Uint64(res[:8]), time.Duration(binary.BigEndian.Uint64(res[8:]))
				gbps = float64(n) * 8 / took.Seconds() / 1e9
				return nil
			default:
			}
			if _, err := c.Write(buf); err != nil {
				// The sink has answered and the relay already ended the flow: the
				// answer is on its way.
				if aerr := <-answer; aerr != nil {
					return fmt.Errorf("write: %w; no count from the sink: %w", err, aerr)
				}
				n, took := binary.BigEndian.Uint64(res[:8]), time.Duration(binary.BigEndian.Uint64(res[8:]))
				gbps = float64(n) * 8 / took.Seconds() / 1e9
				return nil
			}
		}
	})
	if err != nil {
		return 0, fmt.Errorf("stream: %w", err)
	}
	return gbps, nil
}

// connLoop runs benchWorkers loops of connect, 1 byte, echo, close from the pod for
// benchLoopFor; it returns connections per second and the p50/p99 of one round.
func (b *relayBench) connLoop(ctx context.Context) (float64, time.Duration, time.Duration, error) {
	cps, p50, p99, _, err := b.connLoopN(ctx, nil)
	return cps, p50, p99, err
}

// connLoopN is connLoop with the pod's client speaking to the upstream via itself (nil:
// plain TCP); it also returns the number of connections made.
func (b *relayBench) connLoopN(ctx context.Context, via upstream.Dialer) (float64, time.Duration, time.Duration, int, error) {
	return b.connLoopIn(ctx, b.podPath, via, benchLoopFor, benchWorkers)
}

// connLoopIn is connLoopN from the netns at podPath for d, with this many workers.
func (b *relayBench) connLoopIn(ctx context.Context, podPath string, via upstream.Dialer, d time.Duration, workers int) (float64, time.Duration, time.Duration, int, error) {
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			err := netns.Do(podPath, func() error {
				one := []byte{'x'}
				buf := make([]byte, 1)
				for time.Now().Before(end) && ctx.Err() == nil {
					t0 := time.Now()
					c, err := dialFrom(ctx, via, benchEchoPort)
					if err != nil {
						return err
					}
					_ = c.SetDeadline(time.Now().Add(3 * time.Second))
					if _, err := c.Write(one); err != nil {
						_ = c.Close()
						return err
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						_ = c.Close()
						return err
					}
					mine = append(mine, time.Since(t0))
					_ = c.Close()
				}
				return nil
			})
			mu.Lock()
			lat = append(lat, mine...)
			if err != nil && firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, 0, 0, 0, fmt.Errorf("connection loop: %w", firstErr)
	}
	if len(lat) == 0 {
		return 0, 0, 0, 0, errors.New("connection loop: no connection completed")
	}
	took := time.Since(start)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return float64(len(lat)) / took.Seconds(), lat[len(lat)/2], lat[len(lat)*99/100], len(lat), nil
}

// idleCost holds benchIdle relayed connections open and returns the RSS growth of the
// relaying process (kl-relayd or redsocks) per connection in KiB.
func (b *relayBench) idleCost(ctx context.Context, pid int) (float64, error) {
	if pid == 0 {
		return 0, errors.New("no relay process to measure")
	}
	time.Sleep(300 * time.Millisecond)
	before, err := rssKiB(pid)
	if err != nil {
		return 0, err
	}
	addr := net.JoinHostPort(benchSrvAddr, strconv.Itoa(benchEchoPort))
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	err = netns.Do(b.podPath, func() error {
		buf := make([]byte, 1)
		for range benchIdle {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
			if err != nil {
				return err
			}
			conns = append(conns, c)
			// One round trip makes sure the relay has set the flow up completely.
			_ = c.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := c.Write([]byte{'x'}); err != nil {
				return err
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("open %d connections: %w", benchIdle, err)
	}
	time.Sleep(500 * time.Millisecond)
	after, err := rssKiB(pid)
	if err != nil {
		return 0, err
	}
	return float64(after-before) / benchIdle, nil
}

// cpuTime is the user plus system CPU time a process has used so far (all its threads).
func cpuTime(pid int) (time.Duration, error) {
	own, _, err := cpuTimes(pid)
	return own, err
}

// cpuTimes is cpuTime, and the same of the children the process has waited for (those
// that ended: cutime and cstime).
func cpuTimes(pid int) (own, reaped time.Duration, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The fields after the command (which may hold spaces) start after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// utime, stime, cutime and cstime are fields 14 to 17 of stat(5), in clock ticks
	// (USER_HZ, 100).
	var t [4]int64
	for k := range t {
		if t[k], err = strconv.ParseInt(f[11+k], 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/stat: field %d: %w", pid, 14+k, err)
		}
	}
	tick := 10 * time.Millisecond
	return time.Duration(t[0]+t[1]) * tick, time.Duration(t[2]+t[3]) * tick, nil
}

// paired compares two variants round by round (both ran in every round, minutes apart
// at most, so a change of load on the shared machine falls on both): the median of the
// rounds' ratios, and the lowest and highest.
func paired(a, b []float64) string {
	var rs []float64
	for k := range min(len(a), len(b)) {
		if b[k] > 0 {
			rs = append(rs, a[k]/b[k])
		}
	}
	if len(rs) == 0 {
		return "-"
	}
	return fmt.Sprintf("%s [%s–%s]", ratio(median(rs), 1), ratio(slices.Min(rs), 1), ratio(slices.Max(rs), 1))
}

// treeCPU is the CPU time of a process and of all its descendants, running or ended and
// waited for (dante's mother process hands connections to children, which end after a
// number of them); only those that ended without being waited for are missing.
func treeCPU(pid int) (time.Duration, error) {
	own, reaped, err := cpuTimes(pid)
	if err != nil {
		return 0, err
	}
	t := own + reaped
	for _, c := range childPids(pid) {
		if ct, err := treeCPU(c); err == nil {
			t += ct
		}
	}
	return t, nil
}

// inTree calls fn for pid and then for each of its descendants now running; the first
// error stops it.
func inTree(pid int, fn func(pid int) error) error {
	if err := fn(pid); err != nil {
		return err
	}
	for _, c := range childPids(pid) {
		if err := inTree(c, fn); err != nil {
			return err
		}
	}
	return nil
}

// childPids lists the processes pid's threads started that are still running.
func childPids(pid int) []int {
	var cs []int
	kids, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, k := range kids {
		data, err := os.ReadFile(k)
		if err != nil {
			continue // the thread ended
		}
		for _, f := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(f); err == nil {
				cs = append(cs, c)
			}
		}
	}
	return cs
}

// ctxSwitches is the voluntary plus involuntary context switches of a process's threads
// so far (those of threads that ended are lost: Go keeps its threads, redsocks has one).
func ctxSwitches(pid int) (int64, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		return 0, fmt.Errorf("/proc/%d: no threads", pid)
	}
	var n int64
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended
		}
		for line := range strings.Lines(string(data)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				c, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					return 0, fmt.Errorf("%s: %s: %w", t, k, err)
				}
				n += c
			}
		}
	}
	return n, nil
}

func rssKiB(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// signedNs formats a latency difference, which may be negative on a noisy machine.
func signedNs(d time.Duration) string {
	if d < 0 {
		return "-" + fmtNs(float64(-d))
	}
	return "+" + fmtNs(float64(d))
}

// capacity compares what the relay and its upstream could each carry on a CPU of their
// own: connections a second per CPU is the inverse of CPU time per connection, so the
// relay's over the upstream's is the upstream's CPU per connection over the relay's (up,
// or alone, the upstream's own figure without a relay, when up is blank: dante's children
// end during the loop). Above 1.0x the upstream runs out of CPU first: it is the
// bottleneck. Empty when a figure is missing.
func capacity(relay, up, alone time.Duration) string {
	src := ""
	if up == 0 {
		up, src = alone, " (upstream alone's CPU/conn)"
	}
	if relay <= 0 || up <= 0 {
		return ""
	}
	who := "the upstream"
	if up < relay {
		who = "the relay"
	}
	return fmt.Sprintf("%s: %s%s", ratio(float64(up), float64(relay)), who, src)
}
