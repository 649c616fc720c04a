package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

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
			"direct, or is relayed by redsocks (Debian 0.5; splice on, and its default) through the " +
			"same squid or dante, or speaks CONNECT or SOCKS5 to that upstream itself (the upstream " +
			"alone: the ceiling of any relay in front of it). " +
			fmt.Sprintf("%d pairs of %s bursts of the relay section's short-connection loop (%d workers: connect, 1 byte, echo, close), ",
				pairCount, pairBurst, benchWorkers) +
			fmt.Sprintf("or %d pairs of its Go stream (%s, one connection), ", pairStreams, benchStream) +
			"one from each pod, the order alternating from pair to pair so a load trend falls on both " +
			"alike; TIME_WAIT sockets and conntrack entries are cleared before each burst. The relayed " +
			"direct rows run kl-relayd with `noFastPath: true` (every flow through the relay), the " +
			"upstream rows with `default: proxy` through it. `kl ÷ other by pair` is the median of the " +
			"pairs' own ratios [lowest–highest]; `kl ahead` counts the pairs kl-relayd's pod won. The " +
			"control row runs the pairs with no relay in either pod: the two pods' own difference. " +
			"Targets (issue 5): relayed >= 0.65x direct throughput and >= 0.45x direct conn/s; conn/s " +
			"via the same upstream at least redsocks'.",
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
)

func runPairs(ctx context.Context) ([]Row, error) {
	b, err := newRelayBench("redsocks", "conntrack")
	if err != nil {
		return nil, err
	}
	defer b.cleanup()
	if err := b.addPair(); err != nil {
		return nil, fmt.Errorf("second pod: %w", err)
	}
	// The control: no relay in either pod, so whatever differs between the two pods
	// themselves (their veths, the route) shows here and nowhere else.
	b.clear()
	control, err := b.headToHead(ctx, "control: no relay in either pod", pairCount, nil, b.connRate)
	if err != nil {
		return nil, err
	}
	rows := []Row{control}
	// The transparent relay with the direct exit, every flow through it, against the
	// other pod's direct connections: the targets relative to direct.
	if err := b.startRelayBin(b.bin, "", "noFastPath: true\n"); err != nil {
		return nil, err
	}
	for _, m := range []struct {
		name    string
		n       int
		measure func(context.Context, string, upstream.Dialer) (float64, error)
	}{
		{"kl relayed (direct exit) vs direct: conn/s", pairCount, b.connRate},
		{"kl relayed (direct exit) vs direct: stream Gbit/s", pairStreams, b.streamIn},
	} {
		row, err := b.headToHead(ctx, m.name, m.n, nil, m.measure)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	for _, up := range []struct {
		name, typ, scheme string
		port              int
	}{
		{"squid", "http-connect", "http", benchSquid},
		{"dante", "socks5", "socks5", benchDante},
	} {
		url := fmt.Sprintf("%s://%s:%d", up.scheme, benchSrvAddr, up.port)
		if err := b.startRelayBin(b.bin, url); err != nil {
			return nil, err
		}
		add := func(name string, via upstream.Dialer) {
			row, err := b.headToHead(ctx, name, pairCount, via, b.connRate)
			if err != nil {
				row = Row{Name: name, Cols: []Col{{"kl's pod", "error: " + firstLine(err)}}}
			}
			rows = append(rows, row)
		}
		for _, splice := range []bool{true, false} {
			name := "kl → " + up.name + " vs redsocks → " + up.name
			if !splice {
				name = "kl → " + up.name + " vs redsocks default (no splice) → " + up.name
			}
			if err := b.redsocksIn(b.pair, up.typ, up.port, splice); err != nil {
				return nil, err
			}
			add(name, nil)
		}
		// The upstream's ceiling: the other pod's client speaks to it itself, no relay.
		b.stopOtherRelay()
		alone, err := upstream.New(url, 3*time.Second, nil)
		if err != nil {
			return nil, err
		}
		add("kl → "+up.name+" vs "+up.name+" alone (no relay)", alone)
	}
	return rows, nil
}

// connRate is one burst of the connection loop from the netns at podPath: conn/s.
func (b *relayBench) connRate(ctx context.Context, podPath string, via upstream.Dialer) (float64, error) {
	c, _, _, _, err := b.connLoopIn(ctx, podPath, via, pairBurst)
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
