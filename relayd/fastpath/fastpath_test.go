package fastpath

import (
	"net/netip"
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
	if err := m.Verify("a"); err != nil {
		t.Errorf("Verify: %v", err)
	}
	if err := netns.InstallWith(f, "/ns/a", capture); err != nil { // kl-cni ADD again
		t.Fatal(err)
	}
	if err := m.Verify("a"); err == nil {
		t.Error("Verify passed on a table without the decisions")
	}
	m.Remove("a")
	if err := m.Verify("a"); err == nil {
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
