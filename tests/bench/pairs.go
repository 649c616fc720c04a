package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/upstream"
)

// Head to head: kl-relayd and redsocks through the same upstream, both running, measured
// in alternating one-second bursts. The relay section measures them a quarter of a
// minute or more apart, and on this shared machine a load change in between moves a
// connection rate by more than the difference in question.

func init() {
	register(Section{
		Name: "pairs",
		Doc: "kl-relayd head to head with the alternatives, both running throughout, measured in " +
			"alternating bursts: on the relay section's topology kl-relayd relays the pod (transparent) " +
			"while a second pod netns (" + pairPodAddr + ", its own veth to the server netns) goes " +
			"direct, or is relayed by the bare Go splice relay (the issue's reference, relay section), or " +
			"by redsocks (Debian 0.5; splice on, and its default) through the " +
			"same squid or dante, or speaks CONNECT or SOCKS5 to that upstream itself (the upstream " +
			"alone: the ceiling of any relay in front of it). KL_BENCH_BASE_BIN=path/to/kl-relayd adds " +
			"rows where an older build relays the other pod (its own daemon): a change's effect; " +
			"KL_BENCH_PAIRS_ONLY=words keeps only the rows naming one (and the control). " +
			"The `on a CPU of its own` rows pin kl-relayd to the last CPU and everything else of the " +
			"bench (clients, echo server, upstream) to the others, then pair kl's pod against the " +
			"upstream alone: kl-relayd's own CPU time is then off the clients' and the upstream's, and " +
			"what remains below 1.0x is what a second hop costs them: its latency (each of the 4 workers " +
			"waits for its echo) and its kernel work on their CPU (a loopback connect runs the peer's side inline). " +
			fmt.Sprintf("The `held to %.0f%% of a CPU` rows make the upstream the bottleneck by construction (squid and dante, with their "+
				"children, in a CPU cgroup with that quota) and pair kl's pod against the upstream alone, with %d workers so the "+
				"upstream is busy for all of its share whatever the round trip: a relay that costs the "+
				"upstream nothing and carries every connection the upstream can take reaches 1.0x; what is missing is what the relay "+
				"adds to the upstream's own work per connection; the same against redsocks in front of the held upstream "+
				"compares what each relay costs it. ", pairUpShare*100, pairWideWorkers) +
			fmt.Sprintf("%d pairs of %s bursts of the relay section's short-connection loop (%d workers: connect, 1 byte, echo, close), ",
				pairCount, pairBurst, benchWorkers) +
			fmt.Sprintf("or %d pairs of its Go stream (%s, one connection), ", pairStreams, benchStream) +
			"one from each pod, the order alternating from pair to pair so a load trend falls on both " +
			"alike; TIME_WAIT sockets and conntrack entries are cleared before each burst. The relayed " +
			"direct rows run kl-relayd with `noFastPath: true` (every flow through the relay), the " +
			"upstream rows with `default: proxy` through it. `kl ÷ other by pair` is the median of the " +
			"pairs' own ratios [lowest–highest]; `kl ahead` counts the pairs kl-relayd's pod won. The " +
			"control row runs the pairs with no relay in either pod: the two pods' own difference. " +
			"Targets (issue 5): relayed >= 0.65x direct throughput and >= 0.45x direct conn/s (at least " +
			"what the bare relay does); conn/s via the same upstream at least redsocks'.",
		Run: runPairs,
	})
}

const (
	pairNet     = "198.51.100.0/24"
	pairPodAddr = "198.51.100.2"
	pairSrvAddr = "198.51.100.1"
	pairCount   = 24
	pairBurst   = time.Second
	pairStreams = 8 // pairs of streams (benchStream each)
	pairUpShare = 0.25
	// Workers of the held rows: with 4, squid alone is busy about 60% of its time (each
	// worker waits for its echo), and a relay's added round trip would show as missing
	// upstream capacity.
	pairWideWorkers = 16
)

// pairSpec is one row of the section: kl-relayd's set-up in its pod, the other pod's,
// and what each burst measures.
type pairSpec struct {
	name    string
	klURL   string       // kl-relayd's upstream ("": the direct exit)
	klExtra []string     // its settings lines besides
	first   func() error // instead of kl-relayd, in the first pod (the reference row)
	// ownCPU: kl-relayd runs alone on the last CPU, everything else (this process:
	// clients and echo server; the upstreams) on the others.
	ownCPU bool
	// upShare > 0: the upstreams (squid, dante) may use only this share of one CPU, so
	// they are the bottleneck by construction.
	upShare float64
	other   func() error
	via     upstream.Dialer // the other pod's client speaks to this upstream itself
	n       int             // pairs
	measure func(context.Context, string, upstream.Dialer) (float64, error)
}

func runPairs(ctx context.Context) ([]Row, error) {
	b, err := newRelayBench("redsocks", "conntrack")
	if err != nil {
		return nil, err
	}
	defer b.cleanup()
	if err := b.addPair(); err != nil {
		return nil, fmt.Errorf("second pod: %w", err)
	}
	base := os.Getenv("KL_BENCH_BASE_BIN")
	if base != "" && !fileExists(base) {
		return nil, fmt.Errorf("KL_BENCH_BASE_BIN=%s: no such file", base)
	}
	// The control: no relay in either pod, so whatever differs between the two pods
	// themselves (their veths, the route) shows here and nowhere else.
	b.clear()
	control, err := b.headToHead(ctx, "control: no relay in either pod", pairCount, nil, b.connRate)
	if err != nil {
		return nil, err
	}
	rows := []Row{control}
	none := func() error { b.stopOtherRelay(); return nil }
	relayed := []string{"noFastPath: true\n"} // every flow through the relay
	specs := []pairSpec{
		// The targets relative to direct, and its reference: the bare relay.
		{name: "kl relayed (direct exit) vs direct: conn/s", klExtra: relayed, other: none, n: pairCount, measure: b.connRate},
		{name: "kl relayed (direct exit) vs direct: stream Gbit/s", klExtra: relayed, other: none, n: pairStreams, measure: b.streamIn},
		{name: "kl relayed (direct exit) vs bare Go splice relay: conn/s", klExtra: relayed,
			other: func() error { return b.startRelayChildIn(b.pair, "bare-relay") }, n: pairCount, measure: b.connRate},
		{name: "kl relayed (direct exit) vs bare Go splice relay: stream Gbit/s", klExtra: relayed,
			other: func() error { return b.startRelayChildIn(b.pair, "bare-relay") }, n: pairStreams, measure: b.streamIn},
		// The reference itself against direct, measured as kl is above: the first pod runs
		// the bare relay instead of kl-relayd.
		{name: "reference: bare Go splice relay (no kl) vs direct: stream Gbit/s", n: pairStreams, measure: b.streamIn,
			first: func() error { return b.startRelayChild("bare-relay") },
			other: func() error { return nil }}, // direct: first stopped every relay
	}
	if base != "" {
		// An older kl-relayd (its own daemon) relaying the other pod: a change's effect.
		specs = append(specs,
			pairSpec{name: "kl vs kl@base, relayed (direct exit): conn/s", klExtra: relayed,
				other: func() error { return b.startKlOther(base, "", relayed...) }, n: pairCount, measure: b.connRate},
			pairSpec{name: "kl vs kl@base, relayed (direct exit): stream Gbit/s", klExtra: relayed,
				other: func() error { return b.startKlOther(base, "", relayed...) }, n: pairStreams, measure: b.streamIn})
	}
	for _, up := range []struct {
		name, typ, scheme string
		port              int
	}{
		{"squid", "http-connect", "http", benchSquid},
		{"dante", "socks5", "socks5", benchDante},
	} {
		url := fmt.Sprintf("%s://%s:%d", up.scheme, benchSrvAddr, up.port)
		alone, err := upstream.New(url, 3*time.Second, nil)
		if err != nil {
			return nil, err
		}
		kl := "kl → " + up.name + " vs "
		redsocks := func() error { return b.redsocksIn(b.pair, up.typ, up.port, true) } // splice on
		specs = append(specs,
			pairSpec{name: kl + "redsocks → " + up.name, klURL: url, n: pairCount, measure: b.connRate, other: redsocks},
			// `pipeline: true` (the line continues the settings' proxy block): squid gets
			// the client's first bytes with the CONNECT, dante greeting and CONNECT at once.
			pairSpec{name: "kl (pipeline: true) → " + up.name + " vs redsocks → " + up.name, klURL: url, klExtra: []string{"  pipeline: true\n"},
				n: pairCount, measure: b.connRate, other: redsocks},
			pairSpec{name: kl + "redsocks default (no splice) → " + up.name, klURL: url, n: pairCount, measure: b.connRate,
				other: func() error { return b.redsocksIn(b.pair, up.typ, up.port, false) }},
			// The upstream's ceiling: the other pod's client speaks to it itself, no relay.
			pairSpec{name: kl + up.name + " alone (no relay)", klURL: url, n: pairCount, measure: b.connRate,
				other: none, via: alone})
		if runtime.NumCPU() >= 2 {
			// Whether kl-relayd's CPU time is what holds the upstream rows back: with a
			// CPU of its own, its pod against the upstream alone on the CPU both pods'
			// clients, the server and the upstream share.
			specs = append(specs, pairSpec{name: kl + up.name + " alone, kl-relayd on a CPU of its own", klURL: url, n: pairCount,
				measure: b.connRate, other: none, via: alone, ownCPU: true})
		}
		// The upstream made the bottleneck: a relay that costs it nothing reaches 1.0x
		// against it alone; redsocks in front of it tells what relaying itself costs it.
		held := fmt.Sprintf(", %s held to %.0f%% of a CPU", up.name, pairUpShare*100)
		specs = append(specs,
			pairSpec{name: kl + up.name + " alone" + held, klURL: url, n: pairCount, measure: b.connRateWide,
				other: none, via: alone, upShare: pairUpShare},
			pairSpec{name: kl + "redsocks → " + up.name + held, klURL: url, n: pairCount, measure: b.connRateWide,
				other: redsocks, upShare: pairUpShare})
		if base != "" {
			specs = append(specs, pairSpec{name: kl + "kl@base → " + up.name, klURL: url, n: pairCount, measure: b.connRate,
				other: func() error { return b.startKlOther(base, url) }})
		}
	}
	if only := os.Getenv("KL_BENCH_PAIRS_ONLY"); only != "" {
		// A focused run: the rows whose names contain one of these words (and the control).
		specs = slices.DeleteFunc(specs, func(s pairSpec) bool {
			return !slices.ContainsFunc(strings.Split(only, ","), func(w string) bool { return strings.Contains(s.name, w) })
		})
	}
	var running *pairSpec // kl-relayd's set-up now
	for i := range specs {
		s := &specs[i]
		if s.first != nil {
			if err := s.first(); err != nil { // stops kl-relayd and the other pod's relay
				return nil, err
			}
			running = nil
		} else if running == nil || running.klURL != s.klURL || !slices.Equal(running.klExtra, s.klExtra) {
			if err := b.startRelayBin(b.bin, s.klURL, s.klExtra...); err != nil {
				return nil, err
			}
			running = s
		}
		row, err := Row{}, s.other()
		var undo func() error // of the pinning or the limit
		if err == nil && s.ownCPU {
			err, undo = b.pinCPUs(true), func() error { return b.pinCPUs(false) }
		}
		if err == nil && s.upShare > 0 {
			undo, err = b.limitUpstreams(s.upShare)
		}
		if err == nil {
			row, err = b.headToHead(ctx, s.name, s.n, s.via, s.measure)
		}
		if undo != nil {
			if uerr := undo(); err == nil {
				err = uerr
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			row = Row{Name: s.name, Cols: []Col{{"kl's pod", "error: " + firstLine(err)}}}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// startKlOther runs kl-relayd (bin) as the other pod's relay: its own daemon, socket
// and state, next to the one that relays kl's pod.
func (b *relayBench) startKlOther(bin, proxyURL string, extra ...string) error {
	b.stopOtherRelay()
	path := "/var/run/netns/" + b.pair
	cmd, done, _, err := b.runKl(bin, "other", path, proxyURL, extra...)
	if cmd == nil {
		return err
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			stopProc(cmd, done)
			_ = netns.Remove(path)
		})
	}
	b.onCleanup(stop)
	b.stopOther, b.otherPid = stop, cmd.Process.Pid
	return err
}

// connRate is one burst of the connection loop from the netns at podPath: conn/s.
func (b *relayBench) connRate(ctx context.Context, podPath string, via upstream.Dialer) (float64, error) {
	c, _, _, _, err := b.connLoopIn(ctx, podPath, via, pairBurst, benchWorkers)
	return c, err
}

// connRateWide is connRate with pairWideWorkers workers: enough connections at once that
// a held upstream is busy for all of its share of the CPU, whatever each one's round trip.
func (b *relayBench) connRateWide(ctx context.Context, podPath string, via upstream.Dialer) (float64, error) {
	c, _, _, _, err := b.connLoopIn(ctx, podPath, via, pairBurst, pairWideWorkers)
	return c, err
}

// headToHead runs the pairs of measure, kl-relayd's pod against the other pod (redsocks
// relays it, its client speaks to the upstream via itself, or it goes direct).
func (b *relayBench) headToHead(ctx context.Context, name string, n int, via upstream.Dialer, measure func(context.Context, string, upstream.Dialer) (float64, error)) (Row, error) {
	paths := [2]string{b.podPath, "/var/run/netns/" + b.pair} // kl, redsocks
	var cps [2][]float64                                      // (the figure measure gives)
	for k := range n {
		for j := range 2 {
			who := (j + k) % 2 // kl first in even pairs, redsocks first in odd ones
			if err := b.fresh(); err != nil {
				return Row{}, err
			}
			if err := b.flushConntrack(); err != nil {
				return Row{}, err
			}
			d := [2]upstream.Dialer{nil, via}[who]
			c, err := measure(ctx, paths[who], d)
			if err != nil {
				return Row{}, fmt.Errorf("%s pod, pair %d: %w", [2]string{"kl's", "the other"}[who], k+1, err)
			}
			cps[who] = append(cps[who], c)
		}
	}
	ahead := 0
	for k := range n {
		if cps[0][k] > cps[1][k] {
			ahead++
		}
	}
	byPair := paired(cps[0], cps[1]) // before median sorts them
	return Row{Name: name, Cols: []Col{
		{"kl's pod", fmt.Sprintf("%.4g", median(slices.Clone(cps[0])))},
		{"other pod", fmt.Sprintf("%.4g", median(slices.Clone(cps[1])))},
		{"kl ÷ other by pair", byPair},
		{"kl ahead", fmt.Sprintf("%d of %d", ahead, n)},
	}}, nil
}

// addPair makes the second pod netns: its own veth to the server netns, a route to the
// server's address through it.
func (b *relayBench) addPair() error {
	id := strings.TrimPrefix(b.pod, "klbp")
	pair := "klbq" + id
	if err := sh("ip", "netns", "add", pair); err != nil {
		return err
	}
	b.onCleanup(func() { _ = sh("ip", "netns", "del", pair) })
	b.pair = pair
	vp, vs := "klbw"+id+"p", "klbw"+id+"s"
	for _, c := range [][]string{
		{"-n", pair, "link", "set", "lo", "up"},
		{"link", "add", vp, "netns", pair, "type", "veth", "peer", "name", vs, "netns", b.srv},
		{"-n", pair, "addr", "add", pairPodAddr + "/24", "dev", vp},
		{"-n", b.srv, "addr", "add", pairSrvAddr + "/24", "dev", vs},
		{"-n", pair, "link", "set", vp, "up"},
		{"-n", b.srv, "link", "set", vs, "up"},
		{"-n", pair, "route", "add", "default", "via", pairSrvAddr},
	} {
		if err := sh("ip", c...); err != nil {
			return err
		}
	}
	return sh("ip", "netns", "exec", pair, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1")
}
