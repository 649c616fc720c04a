package attach

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sort"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/tests/testutil"
)

const (
	sinkAddr    = "203.0.113.10:9000"
	benchConns  = 200
	benchBytes  = 256 << 20
	benchRounds = 3
)

// BenchmarkAttach measures, on one topology, what the client route adds to a pod's flow
// compared with the same flow sent direct: both leave the pod through the relay, then
// either the relay dials from the pod's netns (routed node -> laptop -> corp) or the flow
// crosses the attach session to the laptop, which dials the corp host. Setup is connect
// to first byte (the server's greeting), p50 of 200 sequential connections; throughput
// is one flow carrying 256 MiB to a sink, best of 3. It runs once (-benchtime=1x) and
// reports its figures as metrics (tests/bench prints the ratios).
func BenchmarkAttach(b *testing.B) {
	tp := newTopo(b, "default: direct\n")
	// Routes and forwarding so that the direct exit reaches the corp host along the same
	// links as the session: pod -> node -> laptop -> corp.
	tp.node.Exec(b, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	tp.laptop.Exec(b, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	tp.node.Exec(b, "ip", "route", "add", "203.0.113.0/24", "via", "198.51.100.2")
	tp.laptop.Exec(b, "ip", "route", "add", "192.0.2.0/24", "via", "198.51.100.1")
	tp.corp.Exec(b, "ip", "route", "add", "default", "via", laptopCorp)
	a := tp.addPod("pod-a", 1, nil)
	sink(b, tp.corp, sinkAddr)
	fg := tp.klctl(nil, "attach", "--server", attachAddr, "--ca", tp.pki.CAFile, "--token-file", tp.tokenFile, "--quiet")
	tp.waitLive(&a.w, true)

	measure := func(route string) (time.Duration, float64) {
		tp.policy.Store(mustPolicy(b, "default: "+route+"\n", false))
		tp.srv.Reload()
		lat := make([]time.Duration, 0, benchConns)
		for range benchConns {
			d, err := setup(a)
			if err != nil {
				b.Fatalf("%s: %v\n%s", route, err, fg.out.String())
			}
			lat = append(lat, d)
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		best := 0.0
		for range benchRounds {
			bps, err := throughput(a)
			if err != nil {
				b.Fatalf("%s: %v", route, err)
			}
			best = max(best, bps)
		}
		return lat[len(lat)/2], best
	}
	b.ResetTimer()
	for range b.N {
		dLat, dBps := measure("direct")
		cLat, cBps := measure("client")
		b.ReportMetric(float64(dLat.Microseconds()), "direct-setup-us")
		b.ReportMetric(float64(cLat.Microseconds()), "client-setup-us")
		b.ReportMetric(dBps/(1<<20), "direct-MiB/s")
		b.ReportMetric(cBps/(1<<20), "client-MiB/s")
	}
}

// setup times one connection from the pod to the corp host's greeting.
func setup(p *pod) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	c, err := netns.Dial(ctx, p.ns.Path, 0, "tcp", corpAddr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
		return 0, fmt.Errorf("greeting: %w", err)
	}
	return time.Since(start), nil
}

// throughput sends benchBytes from the pod to the sink and waits for its receipt.
func throughput(p *pod) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := netns.Dial(ctx, p.ns.Path, 0, "tcp", sinkAddr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	start := time.Now()
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], benchBytes)
	if _, err := c.Write(hdr[:]); err != nil {
		return 0, err
	}
	buf := make([]byte, 256<<10)
	for sent := 0; sent < benchBytes; sent += len(buf) {
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
	}
	if _, err := io.ReadFull(c, hdr[:1]); err != nil {
		return 0, fmt.Errorf("receipt: %w", err)
	}
	return benchBytes / time.Since(start).Seconds(), nil
}

// sink reads a length, then that many bytes, then answers one byte.
func sink(t testing.TB, ns *testutil.Netns, addr string) {
	ln, err := netns.Listen(ns.Path, "tcp4", addr)
	must(t, err)
	testutil.Serve(t, ln, func(c net.Conn) {
		var hdr [8]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint64(hdr[:]))); err != nil {
			return
		}
		c.Write([]byte{1})
	})
}
