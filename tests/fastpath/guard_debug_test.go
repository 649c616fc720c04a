package fastpath_test

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/kl-egress/kl/relayd/fastpath"
)

func TestGuardDebug(t *testing.T) {
	tp := newTopo(t)
	p := mustPolicy(t, "default: proxy\n")
	if err := tp.m.Add(fastpath.Pod{ID: "pod", Netns: tp.pod.Path}, p); err != nil {
		t.Fatal(err)
	}
	dsts := destinations(p, 2000)
	var g []netip.AddrPort
	for _, d := range dsts {
		if d.Addr().Is4() && d.Addr().As4()[0] == 169 {
			g = append(g, d)
		}
	}
	for round := 0; round < 4; round++ {
		work := make(chan netip.AddrPort)
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for d := range work {
					if who, err := tp.flow(d); err != nil || who != "host" {
						t.Errorf("%s: %s %v", d, who, err)
					}
				}
			}()
		}
		for _, d := range g {
			work <- d
		}
		close(work)
		wg.Wait()
		got := tp.waitRecords(t, len(g)*(round+1))
		t.Logf("round %d: %d flows, %d records, status %+v", round, len(g)*(round+1), len(got), tp.m.Status()[0].Lost)
	}
}
