package fastpath

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/rules"
)

type sink struct {
	mu   sync.Mutex
	recs []audit.Record
}

func (s *sink) Add(r audit.Record) {
	s.mu.Lock()
	s.recs = append(s.recs, r)
	s.mu.Unlock()
}

func policy(t testing.TB, src string) *rules.Policy {
	t.Helper()
	p, err := rules.Parse("test.yaml", []byte(src), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var capture = netns.Capture{RedirectPort: 15001, Mark: 0x4b4c, IPv6: true, RejectQUIC: true}

const cidrPolicy = `
default: proxy
rules:
  - cidr: 192.0.2.0/24, fd00::/64
    action: direct
    note: cluster
  - cidr: 192.0.2.128/25
    action: deny
  - port: 5432
    action: direct
    note: databases
`

func TestMarkRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		gen uint8
		id  int
	}{{0, 1}, {1, 2}, {255, MaxEntries}, {7, 300}} {
		g, id, ok := splitMark(Mark(tc.gen, tc.id))
		if !ok || g != tc.gen || id != tc.id {
			t.Errorf("splitMark(Mark(%d, %d)) = %d, %d, %v", tc.gen, tc.id, g, id, ok)
		}
	}
	for _, m := range []uint32{0, 0x4b4c, 0x6b010000, 0x12345678} {
		if _, _, ok := splitMark(m); ok {
			t.Errorf("splitMark(%#x) accepted a mark that is not a kernel decision", m)
		}
	}
}

func TestCompile(t *testing.T) {
	p := policy(t, cidrPolicy)
	plan := p.Plan(nil, "")
	d := Compile(plan, 3)
	if d.Guard != Mark(3, 1) {
		t.Errorf("guard mark %#x, want %#x", d.Guard, Mark(3, 1))
	}
	if len(d.List) != len(plan.Entries)-1 {
		t.Fatalf("%d decisions for %d entries", len(d.List), len(plan.Entries))
	}
	for i, e := range d.List {
		pe := plan.Entries[i+1]
		if (e.Mark == 0) != pe.Relay {
			t.Errorf("entry %d (%s): mark %#x", i+1, &pe, e.Mark)
		}
	}
	// The compiled table installs and verifies.
	f := netns.NewFake()
	if err := netns.InstallDecisionsWith(f, "/ns", capture, d); err != nil {
		t.Fatal(err)
	}
	if err := netns.VerifyDecisionsWith(f, "/ns", capture, d); err != nil {
		t.Fatal(err)
	}
}

func TestManagerRecordsAndReload(t *testing.T) {
	f := netns.NewFake()
	var s sink
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	m := New(Options{Sink: &s, Backend: f, NoWatch: true, Now: func() time.Time { return at }})
	defer m.Close()
	if err := netns.InstallWith(f, "/ns/a", capture); err != nil {
		t.Fatal(err)
	}
	p := policy(t, cidrPolicy)
	// The capture is read back from the table kl-cni installed.
	if err := m.Add(Pod{ID: "a", Netns: "/ns/a"}, p); err != nil {
		t.Fatal(err)
	}
	po := m.pods["a"]
	if err := netns.VerifyDecisionsWith(f, "/ns/a", capture, Compile(p.Plan(nil, ""), po.gen)); err != nil {
		t.Fatalf("installed table: %v", err)
	}
	if err := netns.VerifyWith(f, "/ns/a", capture); err != nil {
		t.Fatalf("CNI CHECK's Verify under decisions: %v", err)
	}
	// Flow to 192.0.2.1: entry 1 (cidr rule 1), id 2.
	plan := p.Plan(nil, "")
	e := plan.Lookup(netip.MustParseAddrPort("192.0.2.1:80"))
	id := 0
	for i := range plan.Entries {
		if &plan.Entries[i] == e {
			id = i + 1
		}
	}
	old := po.gen
	if !m.record(po, Mark(old, id)) {
		t.Fatal("a kernel mark was not recorded")
	}
	if m.record(po, 0) || m.record(po, capture.Mark) {
		t.Error("a mark without the tag was recorded")
	}
	if m.record(po, Mark(old+5, 1)) {
		t.Error("a mark of an unknown generation was recorded")
	}
	// A reload installs the next generation; a connection marked under the old one is
	// still recorded with its own decision.
	p2 := policy(t, "default: direct\nrules:\n  - port: 22\n    action: deny\n")
	if err := m.Reload(p2); err != nil {
		t.Fatal(err)
	}
	if po.gen == old {
		t.Fatal("reload did not bump the generation")
	}
	m.record(po, Mark(old, id))
	m.record(po, Mark(po.gen, 3)) // the new default
	want := []audit.Record{
		{At: at, Rule: 1, Priority: 500, Dimension: "cidr", Exit: "direct", Note: "cluster", Path: "kernel"},
		{At: at, Rule: 1, Priority: 500, Dimension: "cidr", Exit: "direct", Note: "cluster", Path: "kernel"},
		{At: at, Rule: 0, Priority: 999, Dimension: "default", Exit: "direct", Path: "kernel"},
	}
	if len(s.recs) != len(want) {
		t.Fatalf("records %+v, want %+v", s.recs, want)
	}
	for i := range want {
		if s.recs[i] != want[i] {
			t.Errorf("record %d = %+v, want %+v", i, s.recs[i], want[i])
		}
	}
	st := m.Status()
	if len(st) != 1 || st[0].Flows != 3 || st[0].Unknown != 1 || st[0].Share != 0.5 || st[0].Policy != p2.Hash() {
		t.Errorf("status %+v", st)
	}
	hits := m.Hits()
	if len(hits) != 2 || hits[0] != (audit.Hit{Rule: 0, Dimension: "default", Count: 1}) || hits[1] != (audit.Hit{Rule: 1, Dimension: "cidr", Count: 2}) {
		t.Errorf("hits %+v", hits)
	}
	if err := m.Verify("a", p2); err != nil {
		t.Errorf("Verify: %v", err)
	}
	if err := netns.InstallWith(f, "/ns/a", capture); err != nil { // kl-cni ADD again
		t.Fatal(err)
	}
	if err := m.Verify("a", p2); err == nil {
		t.Error("Verify passed on a table without the decisions")
	}
	m.Remove("a")
	if err := m.Verify("a", p2); err == nil {
		t.Error("Verify of a removed pod passed")
	}
	if len(m.Status()) != 0 {
		t.Error("pod still listed after Remove")
	}
}

func TestManagerErrors(t *testing.T) {
	f := netns.NewFake()
	m := New(Options{Backend: f, NoWatch: true})
	p := policy(t, cidrPolicy)
	if err := m.Add(Pod{ID: "x", Netns: "/nothing"}, p); err == nil || !strings.Contains(err.Error(), "pod x") {
		t.Errorf("Add on a netns without a capture = %v", err)
	}
	if err := m.Add(Pod{ID: "", Netns: "/ns"}, p); err == nil {
		t.Error("Add without an id passed")
	}
	c := capture
	f.ApplyErr = errTest
	if err := m.Add(Pod{ID: "y", Netns: "/ns/y", Capture: &c}, p); err == nil {
		t.Error("Add with a failing backend passed")
	}
	if len(m.Status()) != 0 {
		t.Error("a failed Add left the pod registered")
	}
}

var errTest = &testError{}

type testError struct{}

func (*testError) Error() string { return "boom" }

func TestWhere(t *testing.T) {
	p := policy(t, cidrPolicy)
	for _, tc := range []struct {
		dst, want string
	}{
		{"192.0.2.1:80", "kernel"}, {"192.0.2.200:80", "kernel"}, {"203.0.113.1:80", "relay"}, {"198.51.100.1:5432", "kernel"},
		{"198.51.100.1:80", "relay"}, {"169.254.169.254:80", "kernel"}, {"[fd00::1]:443", "kernel"},
	} {
		if got, _ := Where(p, nil, "", netip.MustParseAddrPort(tc.dst)); got != tc.want {
			t.Errorf("Where(%s) = %s, want %s", tc.dst, got, tc.want)
		}
	}
}

// The cost of turning one kernel-decided connection's event into its audit record.
func BenchmarkRecord(b *testing.B) {
	f := netns.NewFake()
	log, err := audit.New("", 0, 0, 1024)
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	m := New(Options{Sink: log, Backend: f, NoWatch: true})
	c := capture
	if err := m.Add(Pod{ID: "a", Netns: "/ns/a", Capture: &c}, policy(b, cidrPolicy)); err != nil {
		b.Fatal(err)
	}
	po := m.pods["a"]
	mark := Mark(po.gen, 2)
	b.ReportAllocs()
	for b.Loop() {
		m.record(po, mark)
	}
}

// A pod whose table swap failed in a Reload keeps the previous policy's table: Verify
// under the live policy fails for it (so the daemon's check adds it again), its status
// says why, and however many installs fail, the generation its installed table marks
// with stays decodable. A failed re-Add keeps the pod as it was; a good one installs the
// live policy and keeps the earlier generations.
func TestFailedReloadIsRepaired(t *testing.T) {
	f := netns.NewFake()
	var s sink
	m := New(Options{Sink: &s, Backend: f, NoWatch: true})
	defer m.Close()
	c := capture
	p1 := policy(t, cidrPolicy)
	pd := Pod{ID: "a", Netns: "/ns/a", Capture: &c}
	if err := m.Add(pd, p1); err != nil {
		t.Fatal(err)
	}
	po := m.pods["a"]
	old := po.gen
	p2 := policy(t, "default: proxy\nrules:\n  - cidr: 192.0.2.0/24\n    action: deny\n")
	f.ApplyErr = errTest
	for i := range keepGens + 1 {
		if err := m.Reload(p2); err == nil {
			t.Fatalf("reload %d with a failing backend passed", i)
		}
	}
	f.ApplyErr = nil
	if err := m.Verify("a", p2); err == nil {
		t.Error("Verify under the live policy passed for a pod still on the previous one")
	}
	if st := m.Status()[0]; st.Error == "" || st.Policy != p1.Hash() || st.Generation != old {
		t.Errorf("status after failed reloads %+v, want the error, policy %.12s, generation %d", st, p1.Hash(), old)
	}
	if got := m.Stale(p2); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Stale = %v, want [a]", got)
	}
	// A flow the installed table decided (192.0.2.1: cidr rule 1, id 2).
	if !m.record(po, Mark(old, 2)) || s.recs[len(s.recs)-1].Note != "cluster" {
		t.Fatalf("flow of the installed table (generation %d) not recorded as rule 1: unknown=%d, generations %v", old, po.unknown, po.order)
	}

	f.ApplyErr = errTest
	if err := m.Add(pd, p2); err == nil {
		t.Fatal("re-Add with a failing backend passed")
	}
	f.ApplyErr = nil
	if m.pods["a"] != po || m.Status()[0].Error == "" || m.Verify("a", p2) == nil {
		t.Fatalf("a failed re-Add did not keep the pod with its error: %+v", m.Status())
	}
	if err := m.Add(pd, p2); err != nil {
		t.Fatal(err)
	}
	if err := m.Verify("a", p2); err != nil {
		t.Errorf("Verify after the repair: %v", err)
	}
	if st := m.Status()[0]; st.Error != "" || st.Policy != p2.Hash() || len(m.Stale(p2)) != 0 {
		t.Errorf("status after the repair %+v", st)
	}
	if m.pods["a"] != po || !m.record(po, Mark(old, 2)) || s.recs[len(s.recs)-1].Note != "cluster" {
		t.Error("the repair forgot the generation of the table it replaced")
	}
}

// A generation is never given to a pod's new table while the pod still knows it: after
// 256 install rounds (other pods' registrations count) a reload would otherwise reuse
// the number the pod's live table marks with, and the queued events of that table would
// be decoded with the new policy's entries.
func TestGenerationNotReused(t *testing.T) {
	// Add and keepGens-1 reloads take generations 1 to keepGens; after 240 to 255 more
	// rounds the reload's number is one of them.
	for _, others := range []int{240, 254, 255} {
		t.Run(fmt.Sprint(others), func(t *testing.T) {
			f := netns.NewFake()
			var s sink
			m := New(Options{Sink: &s, Backend: f, NoWatch: true})
			defer m.Close()
			c := capture
			p1 := policy(t, cidrPolicy)
			if err := m.Add(Pod{ID: "a", Netns: "/ns/a", Capture: &c}, p1); err != nil {
				t.Fatal(err)
			}
			po := m.pods["a"]
			// Reloads the pod takes part in, then registrations of another pod.
			for range keepGens - 1 {
				if err := m.Reload(p1); err != nil {
					t.Fatal(err)
				}
			}
			known := slices.Clone(po.order)
			for range others {
				if err := m.Add(Pod{ID: "b", Netns: "/ns/b", Capture: &c}, p1); err != nil {
					t.Fatal(err)
				}
			}
			p2 := policy(t, "default: direct\nrules:\n  - port: 22\n    action: deny\n  - cidr: 198.51.100.0/24\n    action: direct\n    note: other\n")
			if err := m.Reload(p2); err != nil {
				t.Fatal(err)
			}
			if slices.Contains(known, po.gen) {
				t.Fatalf("reload gave the pod generation %d, which its earlier tables %v mark with", po.gen, known)
			}
			// The queued events of every earlier table still kept (the oldest made room for
			// the new one): p1's entry 2 (rule 1, note cluster).
			for _, g := range known[1:] {
				s.recs = nil
				if !m.record(po, Mark(g, 2)) || s.recs[0].Note != "cluster" {
					t.Errorf("flow marked by the generation %d table recorded as %+v, want rule 1 of the old policy", g, s.recs)
				}
			}
			if err := netns.VerifyDecisionsWith(f, "/ns/a", capture, Compile(p2.Plan(nil, ""), po.gen)); err != nil {
				t.Errorf("installed table: %v", err)
			}
		})
	}
}

// A restarted daemon takes over tables the previous process installed, whose
// generations came from the previous process's counter: its own tables never mark with
// them, and it decodes none of them (its id tables say nothing of what another process's
// ids meant; the flows count as unknown marks). Its counter goes on after the adopted
// table's, so the previous process's last numbers are not the first it reuses.
func TestRestartAdoptsInstalledGenerations(t *testing.T) {
	f := netns.NewFake()
	c := capture
	pd := Pod{ID: "a", Netns: "/ns/a", Capture: &c}
	old := policy(t, cidrPolicy)
	m1 := New(Options{Backend: f, NoWatch: true})
	if err := m1.Add(pd, old); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if err := m1.Reload(old); err != nil {
			t.Fatal(err)
		}
	}
	earlier := slices.Clone(m1.pods["a"].order)
	m1.Close() // the daemon stops; the table stays

	var s sink
	m2 := New(Options{Sink: &s, Backend: f, NoWatch: true})
	defer m2.Close()
	now := policy(t, "default: direct\nrules:\n  - cidr: 192.0.2.0/24\n    action: deny\n    note: blocked now\n")
	if err := m2.Add(pd, now); err != nil {
		t.Fatal(err)
	}
	po := m2.pods["a"]
	if want := earlier[len(earlier)-1] + 1; po.gen != want {
		t.Errorf("the restarted manager installed generation %d; want %d, after the generations %v of the previous process", po.gen, want, earlier)
	}
	for _, g := range earlier {
		if m2.record(po, Mark(g, 2)) {
			t.Errorf("a flow marked by the previous process's generation %d table was decoded with this process's ids: %+v", g, s.recs)
		}
	}
	if len(s.recs) != 0 || po.unknown != uint64(len(earlier)) {
		t.Errorf("%d records and %d unknown marks for %d flows of the previous process's tables; want none and %d", len(s.recs), po.unknown, len(earlier), len(earlier))
	}
	// Entry 3 of the new plan: the default, direct.
	if !m2.record(po, Mark(po.gen, 3)) || len(s.recs) != 1 || s.recs[0].Dimension != "default" || s.recs[0].Exit != "direct" {
		t.Errorf("a flow of the restarted manager's own table recorded as %+v, want its policy's default (direct)", s.recs)
	}
}

// A daemon upgraded over a table the previous version wrote (here: before the filter
// chain's blocks were for new flows only) takes the pod over: its kernel decisions are
// replaced by the new rules', not left deciding flows nobody audits.
func TestAddAfterUpgrade(t *testing.T) {
	f := netns.NewFake()
	if err := netns.InstallWith(f, "/ns", capture); err != nil { // kl-cni
		t.Fatal(err)
	}
	old := New(Options{Backend: f, NoWatch: true})
	if err := old.Add(Pod{ID: "p", Netns: "/ns"}, policy(t, cidrPolicy)); err != nil {
		t.Fatal(err)
	}
	tb := f.Tables["/ns"] // as the previous version wrote it
	for i := range tb.Chains {
		tb.Chains[i].Rules = slices.DeleteFunc(tb.Chains[i].Rules, func(r netns.Rule) bool { return r.String() == "ct state != new return" })
	}
	before, _ := netns.InstalledMarksWith(f, "/ns")
	if len(before) == 0 {
		t.Fatal("the old table has no kernel decisions to replace")
	}
	m := New(Options{Backend: f, NoWatch: true, RedirectPort: capture.RedirectPort})
	if err := m.Add(Pod{ID: "p", Netns: "/ns"}, policy(t, "default: deny\n")); err != nil {
		t.Fatalf("Add over the previous version's table: %v", err)
	}
	if after, _ := netns.InstalledMarksWith(f, "/ns"); slices.Equal(after, before) {
		t.Errorf("the previous version's kernel decisions %#x are still installed", after)
	}
	if err := netns.VerifyWith(f, "/ns", capture); err != nil {
		t.Errorf("the table is not today's capture program after the takeover: %v", err)
	}
}
