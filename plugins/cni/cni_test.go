package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api/wire"
)

// fakeRelay records calls; down makes every call fail as unreachable. With a backend it
// installs the capture tables registrations ask for, as kl-relayd does; without one it
// is an older relay that ignores Workload.Capture. Like kl-relayd it refuses a second id
// in a netns (409) and keeps each registration's CNI attachments (atts), releasing one
// at a time (Detach).
type fakeRelay struct {
	down    bool
	backend netns.Backend
	regs    map[string]wire.Workload
	atts    map[string][]wire.Attachment
	calls   []string
}

func (f *fakeRelay) err() error {
	if f.down {
		return fmt.Errorf("%w at /run/x.sock: connection refused", wire.ErrUnreachable)
	}
	return nil
}

func (f *fakeRelay) Register(_ context.Context, w wire.Workload) (wire.Registration, error) {
	f.calls = append(f.calls, "register "+w.ID)
	if err := f.err(); err != nil {
		return wire.Registration{}, err
	}
	for id, o := range f.regs {
		if id != w.ID && o.Netns == w.Netns {
			return wire.Registration{}, &wire.HTTPError{Status: 409, Msg: "conflict: netns " + w.Netns + " is already served for workload " + id}
		}
	}
	captured := false
	if f.backend != nil && w.Capture != nil && w.Mode == wire.ModeTransparent {
		wc := w.Capture
		c := netns.Capture{RedirectPort: wc.RedirectPort, Mark: wc.Mark, IPv6: wc.IPv6, RejectQUIC: wc.RejectQUIC,
			ExcludeCIDRs: wc.ExcludeCIDRs, ExcludePorts: wc.ExcludePorts}
		if err := netns.InstallWith(f.backend, w.Netns, c); err != nil {
			return wire.Registration{}, &wire.HTTPError{Status: 500, Msg: "workload " + w.ID + ": " + err.Error()}
		}
		captured = true
	}
	if f.atts == nil {
		f.atts = map[string][]wire.Attachment{}
	}
	if o, ok := f.regs[w.ID]; !ok || o.Netns != w.Netns {
		f.atts[w.ID] = nil
	}
	if a := (wire.Attachment{Network: w.Network, IfName: w.IfName}); !slices.Contains(f.atts[w.ID], a) {
		f.atts[w.ID] = append(f.atts[w.ID], a)
	}
	f.regs[w.ID] = w
	return wire.Registration{Workload: w, Listeners: wire.Listeners{Redirect: 15001}, Captured: captured, Attachments: f.atts[w.ID]}, nil
}

func (f *fakeRelay) Detach(ctx context.Context, id string, d wire.Detachment) (wire.Deregistration, error) {
	f.calls = append(f.calls, "detach "+id+" "+d.Network+"/"+d.IfName)
	if err := f.err(); err != nil {
		return wire.Deregistration{}, err
	}
	if atts := f.atts[id]; len(atts) > 0 {
		left := slices.DeleteFunc(slices.Clone(atts), func(a wire.Attachment) bool { return a == d.Attachment })
		if len(left) > 0 {
			f.atts[id] = left
			return wire.Deregistration{NetnsServed: true, ServedBy: id}, nil
		}
	}
	out, err := f.deregister(id)
	for other, w := range f.regs {
		if d.Netns != "" && w.Netns == d.Netns {
			out.NetnsServed, out.ServedBy = true, other
		}
	}
	return out, err
}

func (f *fakeRelay) Deregister(_ context.Context, id string) (wire.Deregistration, error) {
	f.calls = append(f.calls, "deregister "+id)
	if err := f.err(); err != nil {
		return wire.Deregistration{}, err
	}
	return f.deregister(id)
}

func (f *fakeRelay) deregister(id string) (wire.Deregistration, error) {
	w, known := f.regs[id]
	delete(f.regs, id)
	delete(f.atts, id)
	var d wire.Deregistration
	if known && f.backend != nil && w.Capture != nil && w.Mode == wire.ModeTransparent {
		if netns.RemoveWith(f.backend, w.Netns) == nil {
			d.TableRemoved = true
		}
	}
	return d, nil
}

func (f *fakeRelay) Get(_ context.Context, id string) (wire.Registration, bool, error) {
	if err := f.err(); err != nil {
		return wire.Registration{}, false, err
	}
	w, ok := f.regs[id]
	return wire.Registration{Workload: w, Attachments: f.atts[id]}, ok, nil
}

func (f *fakeRelay) Ping(context.Context) error { return f.err() }

func (f *fakeRelay) List(context.Context) ([]wire.Registration, error) {
	if err := f.err(); err != nil {
		return nil, err
	}
	var out []wire.Registration
	for _, w := range f.regs {
		out = append(out, wire.Registration{Workload: w, Attachments: f.atts[w.ID]})
	}
	return out, nil
}

func newPlugin() (*Plugin, *fakeRelay, *netns.Fake, *bytes.Buffer) {
	fb := netns.NewFake()
	fr := &fakeRelay{regs: map[string]wire.Workload{}, backend: fb}
	out := &bytes.Buffer{}
	p := &Plugin{
		Backend:  fb,
		NewRelay: func(string, time.Duration) Relay { return fr },
		Stdout:   out,
		Log:      slog.New(slog.DiscardHandler),
	}
	return p, fr, fb, out
}

const prevResult = `{"cniVersion":"1.1.0",
 "interfaces":[{"name":"klbr0","mac":"aa:bb:cc:dd:ee:01"},{"name":"veth1","mac":"aa:bb:cc:dd:ee:02"},{"name":"eth0","mac":"aa:bb:cc:dd:ee:03","sandbox":"/var/run/netns/pod1"}],
 "ips":[{"interface":2,"address":"192.0.2.10/24","gateway":"192.0.2.1"},{"interface":2,"address":"fd00:1::10/64"},{"interface":0,"address":"192.0.2.1/24"}],
 "routes":[{"dst":"0.0.0.0/0"}],"dns":{}}`

func conf(extra string, withPrev bool) []byte {
	s := `{"cniVersion":"1.1.0","name":"kl-test","type":"kl-cni","socket":"/run/x.sock"` + extra
	if withPrev {
		s += `,"prevResult":` + prevResult
	}
	return []byte(s + "}")
}

func args(stdin []byte) *skel.CmdArgs {
	return &skel.CmdArgs{
		ContainerID: "abc123", Netns: "/var/run/netns/pod1", IfName: "eth0",
		Args:      "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc123",
		StdinData: stdin,
	}
}

func cniCode(t *testing.T, err error) uint {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not a CNI error", err)
	}
	return e.Code
}

func TestAddTransparent(t *testing.T) {
	p, fr, fb, out := newPlugin()
	stdin := conf(`,"capabilities":{"io.kubernetes.cri.pod-annotations":true},"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"team":"a"},"podLabels":{"app":"web"}},"excludeCIDRs":["10.96.0.0/12","192.0.2.53"]`, true)
	if err := p.Add(args(stdin)); err != nil {
		t.Fatalf("Add = %v", err)
	}
	tbl, ok := fb.Tables["/var/run/netns/pod1"]
	if !ok {
		t.Fatal("no table installed")
	}
	c, _ := parseConfig(stdin)
	if d := netns.Diff(c.capture().Program(), tbl); len(d) > 0 {
		t.Errorf("installed table differs: %v", d)
	}
	if !strings.Contains(tbl.Render(), "192.0.2.53") {
		t.Errorf("exclusion missing from table:\n%s", tbl.Render())
	}
	want := wire.Workload{
		ID: "abc123", Netns: "/var/run/netns/pod1", Mode: "transparent", Source: "cni", Network: "kl-test", IfName: "eth0", Namespace: "shop", Name: "web-0",
		Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"team": "a"},
		Addrs:   []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("fd00:1::10")},
		Capture: &wire.Capture{RedirectPort: 15001, Mark: 0x4b4c, IPv6: true, RejectQUIC: true, ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("192.0.2.53/32")}},
	}
	if got := fr.regs["abc123"]; !reflect.DeepEqual(got, want) {
		t.Errorf("registered %+v\nwant %+v", got, want)
	}
	// stdout is exactly prevResult (semantically), nothing else.
	var got, exp map[string]any
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("stdout is not one JSON document: %v\n%s", err, out.String())
	}
	json.Unmarshal([]byte(prevResult), &exp)
	delete(exp, "dns")
	delete(got, "dns")
	if !reflect.DeepEqual(got, exp) {
		t.Errorf("stdout = %v\nwant prevResult %v", got, exp)
	}
}

func TestAddModes(t *testing.T) {
	tests := []struct {
		name      string
		extra     string
		wantTable bool
		wantReg   string // registered mode, "" = none
		wantCode  uint   // 0 = success
	}{
		{name: "node default proxy", extra: `,"mode":"proxy"`, wantReg: "proxy"},
		{name: "annotation env", extra: `,"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"kl.egress.mode":"env"}}`},
		{name: "label proxy over node transparent", extra: `,"runtimeConfig":{"podLabels":{"kl.egress.mode":"proxy"}}`, wantReg: "proxy"},
		{name: "annotation wins over label", extra: `,"runtimeConfig":{"podAnnotations":{"kl.egress.mode":"transparent"},"podLabels":{"kl.egress.mode":"env"}}`, wantTable: true, wantReg: "transparent"},
		{name: "bad pod mode", extra: `,"runtimeConfig":{"podLabels":{"kl.egress.mode":"sideways"}}`, wantCode: types.ErrInvalidNetworkConfig},
		{name: "bad node mode", extra: `,"mode":"sideways"`, wantCode: types.ErrInvalidNetworkConfig},
		{name: "bad cidr", extra: `,"excludeCIDRs":["10.0.0.0/33"]`, wantCode: types.ErrInvalidNetworkConfig},
		{name: "bad timeout", extra: `,"timeout":"soon"`, wantCode: types.ErrInvalidNetworkConfig},
		{name: "port 0", extra: `,"excludePorts":[0]`, wantCode: types.ErrInvalidNetworkConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, fr, fb, out := newPlugin()
			err := p.Add(args(conf(tt.extra, true)))
			if tt.wantCode != 0 {
				if err == nil || cniCode(t, err) != tt.wantCode {
					t.Fatalf("Add = %v, want CNI code %d", err, tt.wantCode)
				}
				if out.Len() != 0 {
					t.Errorf("stdout on error: %q", out.String())
				}
				return
			}
			if err != nil {
				t.Fatalf("Add = %v", err)
			}
			if _, ok := fb.Tables["/var/run/netns/pod1"]; ok != tt.wantTable {
				t.Errorf("table installed = %v, want %v", ok, tt.wantTable)
			}
			if got := fr.regs["abc123"].Mode; got != tt.wantReg {
				t.Errorf("registered mode %q, want %q", got, tt.wantReg)
			}
			if got := fr.regs["abc123"].Capture; (got != nil) != tt.wantTable {
				t.Errorf("registration asks for a capture table: %v, want %v", got != nil, tt.wantTable)
			}
			if out.Len() == 0 {
				t.Error("no result printed")
			}
		})
	}
}

func TestAddNeedsPrevResult(t *testing.T) {
	p, fr, fb, _ := newPlugin()
	err := p.Add(args(conf("", false)))
	if err == nil || cniCode(t, err) != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), "chained") {
		t.Fatalf("Add without prevResult = %v", err)
	}
	if len(fb.Tables) != 0 || len(fr.calls) != 0 {
		t.Error("Add without prevResult acted")
	}
}

func TestAddRelayDownFailsClosed(t *testing.T) {
	p, fr, fb, out := newPlugin()
	fr.down = true
	err := p.Add(args(conf("", true)))
	if err == nil || !strings.Contains(err.Error(), "not reachable") || cniCode(t, err) != types.ErrTryAgainLater {
		t.Fatalf("Add with the relay down = %v, want a try-again error saying it is not reachable", err)
	}
	if _, ok := fb.Tables["/var/run/netns/pod1"]; !ok {
		t.Error("the table was removed: capture must fail closed")
	}
	if out.Len() != 0 {
		t.Errorf("stdout on error: %q", out.String())
	}
	// The runtime then calls DEL, which must clean up even with the relay still down.
	if err := p.Del(args(conf("", false))); err != nil {
		t.Fatalf("Del = %v", err)
	}
	if len(fb.Tables) != 0 {
		t.Error("Del left the table")
	}
}

func TestAddInstallFails(t *testing.T) {
	p, fr, fb, out := newPlugin()
	fb.ApplyErr = errors.New("netlink: operation not permitted")
	err := p.Add(args(conf("", true)))
	if err == nil || cniCode(t, err) != types.ErrInternal || !strings.Contains(err.Error(), "operation not permitted") ||
		!strings.Contains(err.Error(), "could not be installed either") {
		t.Fatalf("Add = %v, want the relay's install error and the plugin's own", err)
	}
	if len(fr.regs) != 0 {
		t.Error("registered although the capture was not installed")
	}
	if out.Len() != 0 {
		t.Errorf("stdout on error: %q", out.String())
	}
}

// TestAddRefusedFailsClosed: the relay answers but refuses the registration (descriptor
// budget, a netns another workload holds): the plugin installs the table itself.
func TestAddRefusedFailsClosed(t *testing.T) {
	p, fr, fb, _ := newPlugin()
	fr.backend = nil
	p.NewRelay = func(string, time.Duration) Relay { return refusingRelay{fr} }
	err := p.Add(args(conf("", true)))
	if err == nil || cniCode(t, err) != types.ErrInternal || !strings.Contains(err.Error(), "descriptor budget") {
		t.Fatalf("Add = %v, want the relay's refusal", err)
	}
	if _, ok := fb.Tables["/var/run/netns/pod1"]; !ok {
		t.Error("no table after a refused registration: capture must fail closed")
	}
}

type refusingRelay struct{ *fakeRelay }

func (refusingRelay) Register(context.Context, wire.Workload) (wire.Registration, error) {
	return wire.Registration{}, &wire.HTTPError{Status: 503, Msg: "descriptor budget exhausted"}
}

// TestAddOlderRelay: a relay that does not install tables (it ignores Workload.Capture
// and does not answer Captured) gets the table from the plugin.
func TestAddOlderRelay(t *testing.T) {
	p, fr, fb, _ := newPlugin()
	fr.backend = nil
	stdin := conf(`,"excludePorts":[53]`, true)
	if err := p.Add(args(stdin)); err != nil {
		t.Fatalf("Add = %v", err)
	}
	tbl, ok := fb.Tables["/var/run/netns/pod1"]
	if !ok {
		t.Fatal("no table installed")
	}
	c, _ := parseConfig(stdin)
	if d := netns.Diff(c.capture().Program(), tbl); len(d) > 0 {
		t.Errorf("installed table differs: %v", d)
	}
	if _, ok := fr.regs["abc123"]; !ok {
		t.Error("not registered")
	}
}

func TestDelIdempotent(t *testing.T) {
	p, fr, fb, out := newPlugin()
	if err := p.Add(args(conf("", true))); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	for i := 0; i < 2; i++ {
		if err := p.Del(args(conf("", false))); err != nil {
			t.Fatalf("Del #%d = %v", i+1, err)
		}
	}
	if len(fb.Tables) != 0 || len(fr.regs) != 0 {
		t.Errorf("after Del: tables %v, registrations %v", fb.Tables, fr.regs)
	}
	// Netns already gone: the runtime passes an empty CNI_NETNS.
	a := args(conf("", false))
	a.Netns = ""
	if err := p.Del(a); err != nil {
		t.Errorf("Del without a netns = %v", err)
	}
	if fr.calls[1] != "detach abc123 kl-test/eth0" {
		t.Errorf("calls = %v", fr.calls)
	}
	if out.Len() != 0 {
		t.Errorf("Del printed %q", out.String())
	}
}

func TestCheck(t *testing.T) {
	p, fr, fb, _ := newPlugin()
	stdin := conf("", true)
	if err := p.Add(args(stdin)); err != nil {
		t.Fatal(err)
	}
	if err := p.Check(args(stdin)); err != nil {
		t.Fatalf("Check after Add = %v", err)
	}
	// A rule deleted by hand.
	tbl := fb.Tables["/var/run/netns/pod1"]
	ch := &tbl.Chains[0]
	ch.Rules = ch.Rules[:len(ch.Rules)-1]
	if err := p.Check(args(stdin)); err == nil || !strings.Contains(err.Error(), "differs") {
		t.Errorf("Check with a rule missing = %v", err)
	}
	// Table back, registration gone.
	p.Add(args(stdin))
	delete(fr.regs, "abc123")
	if err := p.Check(args(stdin)); err == nil || !strings.Contains(err.Error(), "not registered") {
		t.Errorf("Check without registration = %v", err)
	}
	// Table gone.
	p.Add(args(stdin))
	delete(fb.Tables, "/var/run/netns/pod1")
	if err := p.Check(args(stdin)); err == nil {
		t.Error("Check without the table succeeded")
	}
	// Relay down.
	p.Add(args(stdin))
	fr.down = true
	if err := p.Check(args(stdin)); err == nil {
		t.Error("Check with the relay down succeeded")
	}
}

func TestStatus(t *testing.T) {
	p, fr, _, _ := newPlugin()
	if err := p.Status(args(conf("", false))); err != nil {
		t.Fatalf("Status = %v", err)
	}
	fr.down = true
	err := p.Status(args(conf("", false)))
	if err == nil || cniCode(t, err) != ErrPluginNotAvailable {
		t.Errorf("Status with the relay down = %v, want code %d", err, ErrPluginNotAvailable)
	}
}

func TestPanicBecomesError(t *testing.T) {
	p, _, _, _ := newPlugin()
	f := p.guard("ADD", func(*skel.CmdArgs) error { panic("boom") })
	err := f(args(nil))
	if err == nil || cniCode(t, err) != types.ErrInternal || !strings.Contains(err.Error(), "boom") {
		t.Errorf("panic = %v", err)
	}
}

func TestParseArgs(t *testing.T) {
	got := parseArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=n;junk;K8S_POD_INFRA_CONTAINER_ID=id")
	if want := (podArgs{Namespace: "ns", Name: "n", InfraID: "id"}); got != want {
		t.Errorf("parseArgs = %+v, want %+v", got, want)
	}
}

func TestGC(t *testing.T) {
	p, fr, _, _ := newPlugin()
	fr.regs["stale"] = wire.Workload{ID: "stale", Source: "cni", Network: "kl-test"}
	fr.regs["live"] = wire.Workload{ID: "live", Source: "cni", Network: "kl-test"}
	fr.regs["other-net"] = wire.Workload{ID: "other-net", Source: "cni", Network: "other"}
	fr.regs["docker"] = wire.Workload{ID: "docker", Source: "hook"}
	stdin := conf(`,"cni.dev/valid-attachments":[{"containerID":"live","ifname":"eth0"}]`, false)
	if err := p.GC(args(stdin)); err != nil {
		t.Fatalf("GC = %v", err)
	}
	var left []string
	for id := range fr.regs {
		left = append(left, id)
	}
	slices.Sort(left)
	if want := []string{"docker", "live", "other-net"}; !slices.Equal(left, want) {
		t.Errorf("after GC: %v, want %v", left, want)
	}
	fr.down = true
	if err := p.GC(args(stdin)); err == nil {
		t.Error("GC with the relay down succeeded")
	}
}

// legacyPrev is a prevResult as Calico and Flannel chains hand it over before CNI 1.0
// (ips carry "version"; 0.3.x/0.4.0 share the format).
const legacyPrev = `{"cniVersion":"%s",
 "interfaces":[{"name":"cni0","mac":"aa:bb:cc:dd:ee:01"},{"name":"eth0","mac":"aa:bb:cc:dd:ee:03","sandbox":"/var/run/netns/pod1"}],
 "ips":[{"version":"4","interface":1,"address":"192.0.2.10/24","gateway":"192.0.2.1"},{"version":"6","interface":1,"address":"fd00:1::10/64"}],
 "routes":[{"dst":"0.0.0.0/0"}],"dns":{}}`

func TestAddVersions(t *testing.T) {
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			p, fr, _, out := newPlugin()
			prev := fmt.Sprintf(legacyPrev, v)
			if strings.HasPrefix(v, "1.") {
				prev = strings.ReplaceAll(strings.ReplaceAll(prev, `"version":"4",`, ""), `"version":"6",`, "")
			}
			stdin := []byte(`{"cniVersion":"` + v + `","name":"kl-test","type":"kl-cni","socket":"/run/x.sock","prevResult":` + prev + `}`)
			if err := p.Add(args(stdin)); err != nil {
				t.Fatalf("Add = %v", err)
			}
			want := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("fd00:1::10")}
			if got := fr.regs["abc123"].Addrs; !slices.Equal(got, want) {
				t.Errorf("registered addrs %v, want %v", got, want)
			}
			// The result comes back unchanged, in the config's version.
			var got, exp map[string]any
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatalf("stdout: %v\n%s", err, out)
			}
			json.Unmarshal([]byte(prev), &exp)
			for _, m := range []map[string]any{got, exp} {
				delete(m, "dns")
			}
			if !reflect.DeepEqual(got, exp) {
				t.Errorf("stdout = %v\nwant %v", got, exp)
			}
		})
	}
}

func TestVersionsAdvertised(t *testing.T) {
	want := []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}
	if got := Versions.SupportedVersions(); !slices.Equal(got, want) {
		t.Errorf("supported versions %v, want %v", got, want)
	}
}

// countingBackend counts the plugin's own table deletions (the fake relay uses the
// backend underneath directly).
type countingBackend struct {
	netns.Backend
	deletes int
}

func (c *countingBackend) Delete(nsPath, table string) error {
	c.deletes++
	return c.Backend.Delete(nsPath, table)
}

// TestDelWhoRemoves: the relay removes the table it installed and the plugin leaves it
// alone; an older relay (no table removal) leaves it to the plugin.
func TestDelWhoRemoves(t *testing.T) {
	for _, older := range []bool{false, true} {
		t.Run(fmt.Sprintf("older relay %v", older), func(t *testing.T) {
			p, fr, fb, _ := newPlugin()
			if older {
				fr.backend = nil
			}
			cb := &countingBackend{Backend: fb}
			p.Backend = cb
			if err := p.Add(args(conf("", true))); err != nil {
				t.Fatal(err)
			}
			if err := p.Del(args(conf("", false))); err != nil {
				t.Fatal(err)
			}
			if len(fb.Tables) != 0 || len(fr.regs) != 0 {
				t.Errorf("after Del: tables %v, registrations %v", fb.Tables, fr.regs)
			}
			if want := map[bool]int{false: 0, true: 1}[older]; cb.deletes != want {
				t.Errorf("the plugin deleted the table %d times, want %d", cb.deletes, want)
			}
			// A second DEL: the relay no longer knows the sandbox, the plugin makes sure.
			if err := p.Del(args(conf("", false))); err != nil {
				t.Fatalf("second Del = %v", err)
			}
		})
	}
}

// slowRelay takes delay for each deregistration, failing when ctx ends first.
type slowRelay struct {
	*fakeRelay
	delay time.Duration
}

func (s slowRelay) Deregister(ctx context.Context, id string) (wire.Deregistration, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return wire.Deregistration{}, fmt.Errorf("%w: %w", wire.ErrUnreachable, ctx.Err())
	}
	return s.fakeRelay.Deregister(ctx, id)
}

// TestGCTimeoutPerCall: the configured timeout bounds each call to the relay, so GC of
// several stale sandboxes, each deregistration well within the bound, succeeds.
func TestGCTimeoutPerCall(t *testing.T) {
	p, fr, _, _ := newPlugin()
	p.NewRelay = func(string, time.Duration) Relay { return slowRelay{fr, 600 * time.Millisecond} }
	for _, id := range []string{"stale1", "stale2"} {
		fr.regs[id] = wire.Workload{ID: id, Source: "cni", Network: "kl-test"}
	}
	if err := p.GC(args(conf(`,"timeout":"1s"`, false))); err != nil {
		t.Fatalf("GC = %v", err)
	}
	if len(fr.regs) != 0 {
		t.Errorf("left registered: %v", fr.regs)
	}
}

// TestDelInvalidConfig: DEL tears down with a config ADD would refuse (an older kl-cni
// accepted it, or the prevResult is broken), even one with fields of the wrong JSON
// type: a pod must not be stuck in teardown over a field DEL does not use, and libcni
// stops a DEL at the first plugin that fails, so the main plugin would leak the pod's
// address. DEL still reaches the relay at the socket, with the default timeout, and
// warns, naming the field.
func TestDelInvalidConfig(t *testing.T) {
	tests := []struct{ name, extra, warn string }{
		{"host bits in an exclusion", `,"excludeCIDRs":["10.0.0.1/8"]`, "ExcludeCIDRs[0]"},
		{"bad mode", `,"mode":"sideways"`, "mode"},
		{"bad timeout", `,"timeout":"soon"`, "timeout"},
		{"bad prevResult", `,"prevResult":{"cniVersion":"1.1.0","ips":"none"}`, ""}, // DEL does not read it
		// Fields of the wrong JSON type do not decode at all: DEL takes their defaults.
		{"timeout a number", `,"timeout":5`, "timeout"},
		{"exclusions a string", `,"excludeCIDRs":"10.96.0.0/12"`, "excludeCIDRs"},
		{"ipv6 a string", `,"ipv6":"false"`, "ipv6"},
		{"port out of range", `,"excludePorts":[53,70000]`, "excludePorts"},
		{"several at once", `,"timeout":5,"debug":"yes","mark":-1,"runtimeConfig":[]`, "runtimeConfig"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, fr, fb, out := newPlugin()
			if err := p.Add(args(conf("", true))); err != nil {
				t.Fatal(err)
			}
			out.Reset()
			var socket string
			var timeout time.Duration
			p.NewRelay = func(s string, d time.Duration) Relay {
				socket, timeout = s, d
				return fr
			}
			var log bytes.Buffer
			p.Log = slog.New(slog.NewTextHandler(&log, nil))
			if err := p.Del(args(conf(tt.extra, false))); err != nil {
				t.Fatalf("Del = %v", err)
			}
			if len(fb.Tables) != 0 || len(fr.regs) != 0 {
				t.Errorf("after Del: tables %v, registrations %v", fb.Tables, fr.regs)
			}
			if socket != "/run/x.sock" || timeout != DefaultTimeout {
				t.Errorf("Del asked the relay at %q within %v, want /run/x.sock within %v", socket, timeout, DefaultTimeout)
			}
			if out.Len() != 0 {
				t.Errorf("Del printed %q", out.String())
			}
			if tt.warn != "" && (!strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), tt.warn)) {
				t.Errorf("Del's log does not warn naming %q:\n%s", tt.warn, log.String())
			}
		})
	}
}

// TestConfigDebug: "debug": true in the config logs at debug level to stderr, as
// KL_CNI_DEBUG=1 does; without it ADD logs nothing on success.
func TestConfigDebug(t *testing.T) {
	for _, debug := range []bool{false, true} {
		t.Run(fmt.Sprint(debug), func(t *testing.T) {
			_, fr, fb, _ := newPlugin()
			var stdout, stderr bytes.Buffer
			p := New(context.Background(), &stdout, &stderr, false)
			p.Backend = fb
			p.NewRelay = func(string, time.Duration) Relay { return fr }
			if err := p.Add(args(conf(fmt.Sprintf(`,"debug":%v`, debug), true))); err != nil {
				t.Fatal(err)
			}
			if got := strings.Contains(stderr.String(), "level=DEBUG"); got != debug {
				t.Errorf("debug lines on stderr: %v, want %v\n%s", got, debug, stderr.String())
			}
		})
	}
}

// TestDelOneAttachment: a pod chained to two kl-cni networks (Multus, or a second
// interface) has two attachments under one container id and one netns. The DEL of one
// releases only it: the registration, the listeners and the table stay for the other,
// whose CHECK still passes, until its own DEL.
func TestDelOneAttachment(t *testing.T) {
	p, fr, fb, _ := newPlugin()
	cb := &countingBackend{Backend: fb}
	p.Backend = cb
	first := args(conf("", true))
	second := args([]byte(strings.Replace(string(conf("", true)), `"name":"kl-test"`, `"name":"net-b"`, 1)))
	second.IfName = "net1"
	for _, a := range []*skel.CmdArgs{first, second} {
		if err := p.Add(a); err != nil {
			t.Fatalf("Add(%s) = %v", a.IfName, err)
		}
	}
	want := []wire.Attachment{{Network: "kl-test", IfName: "eth0"}, {Network: "net-b", IfName: "net1"}}
	if got := fr.atts["abc123"]; !slices.Equal(got, want) {
		t.Fatalf("attachments after two ADDs = %v, want %v", got, want)
	}
	if err := p.Del(second); err != nil {
		t.Fatalf("Del(net1) = %v", err)
	}
	if _, ok := fb.Tables["/var/run/netns/pod1"]; !ok || cb.deletes != 0 {
		t.Fatalf("Del of one attachment removed the table (%d deletions) the other still needs", cb.deletes)
	}
	if _, ok := fr.regs["abc123"]; !ok {
		t.Fatal("Del of one attachment deregistered the sandbox")
	}
	if err := p.Check(first); err != nil {
		t.Errorf("Check(eth0) after the DEL of net1 = %v", err)
	}
	if err := p.Check(second); err == nil {
		t.Error("Check(net1) after its DEL passed")
	}
	if err := p.Del(first); err != nil {
		t.Fatalf("Del(eth0) = %v", err)
	}
	if len(fb.Tables) != 0 || len(fr.regs) != 0 {
		t.Errorf("after the last DEL: tables %v, registrations %v", fb.Tables, fr.regs)
	}
}

// TestAddConflict: an ADD refused because another registration holds the netns (409)
// neither installs the fail-closed table over that registration's, nor has the DEL the
// runtime sends after it remove it: the first pod stays captured.
func TestAddConflict(t *testing.T) {
	p, _, fb, _ := newPlugin()
	cb := &countingBackend{Backend: fb}
	p.Backend = cb
	if err := p.Add(args(conf(`,"excludePorts":[53]`, true))); err != nil {
		t.Fatal(err)
	}
	before := fb.Tables["/var/run/netns/pod1"].Render()
	other := args(conf("", true))
	other.ContainerID = "x1"
	err := p.Add(other)
	if err == nil || !strings.Contains(err.Error(), "already served for workload abc123") {
		t.Fatalf("Add(x1) in abc123's netns = %v, want the relay's conflict", err)
	}
	if got := fb.Tables["/var/run/netns/pod1"].Render(); got != before {
		t.Errorf("the refused ADD replaced abc123's table:\n%s\nwant\n%s", got, before)
	}
	if err := p.Del(other); err != nil {
		t.Fatalf("Del(x1) = %v", err)
	}
	if _, ok := fb.Tables["/var/run/netns/pod1"]; !ok || cb.deletes != 0 {
		t.Fatal("the DEL after the refused ADD removed abc123's table")
	}
	if err := p.Check(args(conf(`,"excludePorts":[53]`, true))); err != nil {
		t.Errorf("Check(abc123) = %v", err)
	}
}

// answeringRelay answers every Detach with status (an older kl-relayd that refuses the
// container id answers 400; 404 is a relay that does not know it).
type answeringRelay struct {
	*fakeRelay
	status int
}

func (a answeringRelay) Detach(context.Context, string, wire.Detachment) (wire.Deregistration, error) {
	return wire.Deregistration{}, &wire.HTTPError{Status: a.status, Msg: "workload id: want 1-250 characters"}
}

func (a answeringRelay) Deregister(ctx context.Context, id string) (wire.Deregistration, error) {
	return a.Detach(ctx, id, wire.Detachment{})
}

// TestDelRefusedID: the relay cannot have registered an id it refuses, nor one it does
// not know: DEL warns and succeeds, so the chain's DEL goes on to IPAM; the table (the
// fail-closed one of the refused ADD) goes. Any other refusal still fails the DEL.
func TestDelRefusedID(t *testing.T) {
	for _, tt := range []struct {
		status int
		ok     bool
	}{{400, true}, {404, true}, {500, false}} {
		t.Run(fmt.Sprint(tt.status), func(t *testing.T) {
			p, fr, fb, _ := newPlugin()
			if err := p.install("/var/run/netns/pod1", netns.Capture{RedirectPort: 15001, Mark: 0x4b4c}); err != nil {
				t.Fatal(err)
			}
			p.NewRelay = func(string, time.Duration) Relay { return answeringRelay{fr, tt.status} }
			a := args(conf("", false))
			a.ContainerID = strings.Repeat("a", 251)
			err := p.Del(a)
			if (err == nil) != tt.ok {
				t.Fatalf("Del with the relay answering %d = %v, want success %v", tt.status, err, tt.ok)
			}
			if _, left := fb.Tables["/var/run/netns/pod1"]; tt.ok && left {
				t.Error("Del left the fail-closed table")
			}
		})
	}
}

// TestGCAttachments: GC compares attachments (container id and interface), not the
// registration's network, which the latest ADD set: a stale attachment of a sandbox
// whose other attachment is valid is released, and a sandbox that another network
// still serves is left registered.
func TestGCAttachments(t *testing.T) {
	p, fr, _, _ := newPlugin()
	fr.regs["two-ifs"] = wire.Workload{ID: "two-ifs", Source: "cni", Network: "kl-test", IfName: "net1"}
	fr.regs["two-nets"] = wire.Workload{ID: "two-nets", Source: "cni", Network: "other", IfName: "net1"}
	fr.atts = map[string][]wire.Attachment{
		"two-ifs":  {{Network: "kl-test", IfName: "eth0"}, {Network: "kl-test", IfName: "net1"}},
		"two-nets": {{Network: "kl-test", IfName: "eth0"}, {Network: "other", IfName: "net1"}},
	}
	stdin := conf(`,"cni.dev/valid-attachments":[{"containerID":"two-ifs","ifname":"eth0"}]`, false)
	if err := p.GC(args(stdin)); err != nil {
		t.Fatalf("GC = %v", err)
	}
	for id, want := range map[string][]wire.Attachment{
		"two-ifs":  {{Network: "kl-test", IfName: "eth0"}},
		"two-nets": {{Network: "other", IfName: "net1"}},
	} {
		if _, ok := fr.regs[id]; !ok || !slices.Equal(fr.atts[id], want) {
			t.Errorf("after GC, %s registered %v with attachments %v, want %v", id, ok, fr.atts[id], want)
		}
	}
}
