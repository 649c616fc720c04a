package fastpath_test

import (
	"io"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/fastpath"
)

// connRate runs 4 workers of connect, 1 byte, echo line, close for d from the pod.
func connRate(t testing.TB, tp *topo, addr string, d time.Duration) float64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = netns.Do(tp.pod.Path, func() error {
				buf := make([]byte, 64)
				for time.Now().Before(end) {
					c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
					if err != nil {
						t.Error(err)
						return err
					}
					if _, err := io.ReadAtLeast(c, buf, 1); err != nil {
						t.Error(err)
					}
					c.Close()
					n.Add(1)
				}
				return nil
			})
		}()
	}
	wg.Wait()
	return float64(n.Load()) / d.Seconds()
}

// BenchmarkConnRate reports the short-connection rate from the pod, side by side: no
// capture at all, kernel-decided without and with the conntrack watcher, in one netns.
func BenchmarkConnRate(b *testing.B) {
	tp := newBenchTopo(b)
	// Thousands of short connections to one destination leave as many TIME_WAIT sockets;
	// without reuse, connect's port search slows down run after run, whatever the path.
	tp.pod.Exec(b, "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1")
	addr := "192.0.2.9:7000"
	p := mustPolicyB(b, "default: proxy\nrules:\n  - cidr: 192.0.2.0/24\n    action: direct\n")
	var none, nowatch, watch []float64
	for b.Loop() {
		_ = netns.Remove(tp.pod.Path)
		none = append(none, connRate(b, tp, addr, time.Second))
		if err := netns.Install(tp.pod.Path, capture); err != nil {
			b.Fatal(err)
		}
		m := fastpath.New(fastpath.Options{NoWatch: true})
		if err := m.Add(fastpath.Pod{ID: "pod", Netns: tp.pod.Path}, p); err != nil {
			b.Fatal(err)
		}
		nowatch = append(nowatch, connRate(b, tp, addr, time.Second))
		m.Close()
		m = fastpath.New(fastpath.Options{Sink: tp.log})
		if err := m.Add(fastpath.Pod{ID: "pod", Netns: tp.pod.Path}, p); err != nil {
			b.Fatal(err)
		}
		watch = append(watch, connRate(b, tp, addr, time.Second))
		m.Close()
	}
	b.ReportMetric(med(none), "direct-conn/s")
	b.ReportMetric(med(nowatch), "kernel-conn/s")
	b.ReportMetric(med(watch), "kernel+audit-conn/s")
}

func med(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
