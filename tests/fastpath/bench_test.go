package fastpath_test

import (
	"net/netip"
	"testing"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/fastpath"
)

// Connection setup cost from the pod: no capture, kernel-decided with and without the
// conntrack watcher, and relayed to the stand-in relay.
func BenchmarkConnect(b *testing.B) {
	for _, v := range []struct {
		name  string
		watch bool
		plain bool
		dst   string
	}{
		{"no-capture", false, true, "192.0.2.9:7000"},
		{"kernel-nowatch", false, false, "192.0.2.9:7000"},
		{"kernel-watch", true, false, "192.0.2.9:7000"},
		{"relayed", true, false, "198.51.100.9:7000"},
	} {
		b.Run(v.name, func(b *testing.B) {
			tp := newBenchTopo(b)
			if v.plain {
				_ = netns.Remove(tp.pod.Path)
			} else {
				m := fastpath.New(fastpath.Options{Sink: tp.log, NoWatch: !v.watch})
				defer m.Close()
				p := mustPolicyB(b, "default: proxy\nrules:\n  - cidr: 192.0.2.0/24\n    action: direct\n")
				if err := m.Add(fastpath.Pod{ID: "pod", Netns: tp.pod.Path}, p); err != nil {
					b.Fatal(err)
				}
			}
			dst := netip.MustParseAddrPort(v.dst)
			b.ResetTimer()
			for b.Loop() {
				if _, err := tp.flow(dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
