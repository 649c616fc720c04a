package netns

import (
	"flag"
	"slices"
	"testing"
	"time"

	"github.com/kl-egress/kl/tests/testutil"
)

// The decisions go into the kernel as rendered, read back equal, and nft lists them as
// Render prints them.
func TestDecisionsRoundTrip(t *testing.T) {
	testutil.RequireTool(t, "nft")
	for _, tc := range goldenDecisions {
		t.Run(tc.name, func(t *testing.T) {
			ns := testutil.NewNetns(t, "klkd")
			if err := InstallDecisions(ns.Path, tc.c, tc.d); err != nil {
				t.Fatal(err)
			}
			if err := VerifyDecisions(ns.Path, tc.c, tc.d); err != nil {
				t.Errorf("VerifyDecisions: %v", err)
			}
			if err := Verify(ns.Path, tc.c); err != nil {
				t.Errorf("Verify: %v", err)
			}
			if c, err := Installed(ns.Path); err != nil || c.Render() != tc.c.Render() {
				t.Errorf("Installed = %v, %v; want the capture underneath", c, err)
			}
			fake := NewFake()
			if err := InstallDecisionsWith(fake, ns.Path, tc.c, tc.d); err != nil {
				t.Fatal(err)
			}
			want, _ := InstalledMarksWith(fake, ns.Path)
			got, err := InstalledMarks(ns.Path)
			slices.Sort(got)
			slices.Sort(want)
			if err != nil || len(got) == 0 || !slices.Equal(got, want) {
				t.Errorf("InstalledMarks = %#x, %v; want %#x, as written", got, err, want)
			}
			listed := ns.Exec(t, "nft", "list", "table", "inet", "kl")
			golden(t, "nft-"+tc.name, listed)
			p, _ := tc.c.ProgramWith(tc.d)
			_ = p // nft lists some rules in a shorter spelling (it drops implied matches); the
			// read-back Diff above is the check, the golden file is for people.
			// Back to the plain program: the decisions are gone in the same swap.
			if err := Install(ns.Path, tc.c); err != nil {
				t.Fatal(err)
			}
			if err := VerifyDecisions(ns.Path, tc.c, tc.d); err == nil {
				t.Errorf("VerifyDecisions passed after the decisions were removed")
			}
		})
	}
}

// A 10k-entry list compiles, installs and verifies in bounded time.
func TestDecisionsLarge(t *testing.T) {
	testutil.RequirePrivileged(t)
	ns := testutil.NewNetns(t, "klkd")
	c := goldenCaptures[0].c
	d := bigDecisions(*bigN)
	start := time.Now()
	if err := InstallDecisions(ns.Path, c, d); err != nil {
		t.Fatal(err)
	}
	installed := time.Since(start)
	if err := VerifyDecisions(ns.Path, c, d); err != nil {
		t.Fatalf("VerifyDecisions: %v", err)
	}
	t.Logf("10k decisions: install %v, install+verify %v", installed, time.Since(start))
}

var bigN = flag.Int("kd.n", 10000, "entries of the large decisions test")

func BenchmarkInstallDecisions10k(b *testing.B) {
	testutil.RequirePrivileged(b)
	ns := testutil.NewNetns(b, "klkd")
	c := goldenCaptures[0].c
	d := bigDecisions(10000)
	b.ResetTimer()
	for b.Loop() {
		if err := InstallDecisions(ns.Path, c, d); err != nil {
			b.Fatal(err)
		}
	}
}
