package registry

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
)

func entry(id string) Entry {
	return Entry{
		Registration: api.Registration{
			Workload: api.Workload{ID: id, Netns: "/var/run/netns/" + id, Mode: api.ModeTransparent, Source: "cni",
				Network: "net-b", IfName: "net1",
				Labels: map[string]string{"app": "web"}, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}},
			Listeners: api.Listeners{Redirect: 15001},
			Since:     time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
			// A sandbox chained to two kl-cni networks: a restart keeps both attachments.
			Attachments: []api.Attachment{{Network: "rcnet", IfName: "eth0"}, {Network: "net-b", IfName: "net1"}},
		},
		NetnsDev: 4, NetnsIno: 4026532000,
	}
}

func TestPutLoadDelete(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"b", "a", "c"} {
		if err := s.Put(entry(id)); err != nil {
			t.Fatalf("Put(%s) = %v", id, err)
		}
	}
	// Overwrite is a refresh, not a duplicate.
	if err := s.Put(entry("a")); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("b"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("b"); err != nil {
		t.Fatalf("second Delete = %v, want nil", err)
	}
	// Reopen as a restarted daemon would.
	s2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, errs := s2.Load()
	if len(errs) != 0 {
		t.Fatalf("Load errors: %v", errs)
	}
	want := []Entry{entry("a"), entry("c")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Load = %+v\nwant %+v", got, want)
	}
}

func TestLoadReportsBadFiles(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(entry("ok")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(s.Dir(), "broken.json"), []byte("{"), 0o600)
	os.WriteFile(filepath.Join(s.Dir(), "other.json"), []byte(`{"registration":{"workload":{"id":"ok"}}}`), 0o600)
	os.WriteFile(filepath.Join(s.Dir(), ".tmp-x-123"), []byte("partial"), 0o600)
	got, errs := s.Load()
	if len(got) != 1 || got[0].Registration.Workload.ID != "ok" {
		t.Errorf("Load = %+v, want just ok", got)
	}
	if len(errs) != 2 {
		t.Fatalf("Load errors = %v, want 2", errs)
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), ".tmp-x-123")); !os.IsNotExist(err) {
		t.Errorf("leftover temporary file not removed: %v", err)
	}
}

// TestLoadRefusesInvalid: a store file edited by hand or corrupted into a workload the
// API would refuse is not restored; the error names the file and what is wrong with the
// record, and the valid entries beside it still load.
func TestLoadRefusesInvalid(t *testing.T) {
	record := func(id, netns, mode string) string {
		return `{"registration":{"workload":{"id":` + strconv.Quote(id) + `,"netns":` + strconv.Quote(netns) +
			`,"mode":` + strconv.Quote(mode) + `,"source":"cni"},"listeners":{"redirect":15001}},"netnsDev":4,"netnsIno":4026532000}`
	}
	for _, tc := range []struct {
		name, file, data string
		want             string // in the error, besides the file's path
	}{
		{"empty id", ".json", record("", "/var/run/netns/x", "transparent"), `workload id ""`},
		{"id starting with a dash", "-x.json", record("-x", "/var/run/netns/x", "transparent"), `workload id "-x"`},
		{"hidden id", ".x.json", record(".x", "/var/run/netns/x", "transparent"), `workload id ".x"`},
		{"space in id", "a b.json", record("a b", "/var/run/netns/x", "transparent"), `workload id "a b"`},
		{"relative netns", "rel.json", record("rel", "netns/x", "proxy"), `netns "netns/x" is not an absolute path`},
		{"no netns", "nons.json", record("nons", "", "proxy"), `netns "" is not an absolute path`},
		{"unknown mode", "mode.json", record("mode", "/var/run/netns/x", "tproxy"), `mode "tproxy" is not transparent or proxy`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Put(entry("ok")); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(s.Dir(), tc.file)
			if err := os.WriteFile(p, []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			got, errs := s.Load()
			if len(got) != 1 || got[0].Registration.Workload.ID != "ok" {
				t.Errorf("Load = %+v, want just ok", got)
			}
			if len(errs) != 1 || !strings.Contains(errs[0].Error(), p) || !strings.Contains(errs[0].Error(), tc.want) {
				t.Errorf("Load errors = %v, want one naming %s and saying %s", errs, p, tc.want)
			}
			if _, err := os.Stat(p); err != nil {
				t.Errorf("refused file not left in place: %v", err)
			}
		})
	}
}

func TestCheckID(t *testing.T) {
	for _, tt := range []struct {
		id string
		ok bool
	}{
		{"0123abcdef", true}, {"k8s_POD.web-1", true}, {"", false}, {"../etc", false},
		{"a/b", false}, {".hidden", false}, {strings.Repeat("a", 250), true}, {strings.Repeat("a", 251), false},
	} {
		if err := CheckID(tt.id); (err == nil) != tt.ok {
			t.Errorf("CheckID(%q) = %v, want ok=%v", tt.id, err, tt.ok)
		}
	}
	s, _ := Open(t.TempDir())
	// Every id CheckID takes can be stored and loaded (its file name fits).
	for _, n := range []int{64, 240, 250} {
		id := strings.Repeat("a", n)
		if err := s.Put(entry(id)); err != nil {
			t.Errorf("an id of %d characters passes CheckID, but Put: %v", n, err)
		}
	}
	if ents, errs := s.Load(); len(ents) != 3 || len(errs) != 0 {
		t.Errorf("Load = %d entries, %v; want the 3 long ids", len(ents), errs)
	}
	if err := s.Put(entry("../x")); err == nil {
		t.Error("Put with a path-like id succeeded")
	}
	bad := entry("x")
	bad.Registration.Workload.Mode = "tproxy"
	if err := s.Put(bad); err == nil {
		t.Error("Put of a workload Load would refuse succeeded")
	}
}
