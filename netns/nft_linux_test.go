package netns

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/kl-egress/kl/tests/testutil"
)

// Tables with sets go into several pods at once, as the daemon's fast path does, and each
// reads back whole. Under -race this also covers google/nftables numbering new sets from
// an unsynchronised global counter (setIDMu).
func TestApplyConcurrent(t *testing.T) {
	testutil.RequireTool(t, "nft")
	p := goldenCaptures[1].c.build(extension{
		sets: []Set{
			{Name: "direct_v4", Type: SetIPv4, Addrs: mergeRanges(prefixes("203.0.113.0/24", "192.0.2.64/26"))},
			{Name: "deny_v4", Type: SetIPv4, Addrs: mergeRanges(prefixes("198.51.100.0/24"))},
		},
		decisions: []Rule{
			{Match: []Match{MatchDaddrSet{4, "direct_v4"}}, Action: Accept},
			{Match: []Match{MatchDaddrSet{4, "deny_v4"}}, Action: Drop},
			{Match: []Match{MatchDaddr{netip.MustParsePrefix("fd00:ab::/33")}}, Action: Drop},
		},
	})
	const pods, rounds = 4, 5
	paths := make([]string, pods)
	for i := range paths {
		paths[i] = testutil.NewNetns(t, "klconc").Path
	}
	var wg sync.WaitGroup
	errs := make(chan error, pods*rounds)
	for _, path := range paths {
		wg.Go(func() {
			for range rounds {
				if err := defaultBackend.Apply(path, p); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Apply: %v", err)
	}
	for _, path := range paths {
		got, err := defaultBackend.Get(path, TableName)
		if err != nil {
			t.Fatal(err)
		}
		if d := Diff(p, got); len(d) != 0 {
			t.Errorf("%s: read back differs: %q", path, d)
		}
	}
}
