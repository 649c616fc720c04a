package registry

import (
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
)

func entry(id string) Entry {
	return Entry{
		Registration: api.Registration{
			Workload: api.Workload{ID: id, Netns: "/var/run/netns/" + id, Mode: api.ModeTransparent, Source: "cni",
				Labels: map[string]string{"app": "web"}, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}},
			Listeners: api.Listeners{Redirect: 15001},
			Since:     time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
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

func TestCheckID(t *testing.T) {
	for _, tt := range []struct {
		id string
		ok bool
	}{
		{"0123abcdef", true}, {"k8s_POD.web-1", true}, {"", false}, {"../etc", false},
		{"a/b", false}, {".hidden", false}, {strings.Repeat("a", 253), true}, {strings.Repeat("a", 254), false},
	} {
		if err := CheckID(tt.id); (err == nil) != tt.ok {
			t.Errorf("CheckID(%q) = %v, want ok=%v", tt.id, err, tt.ok)
		}
	}
	s, _ := Open(t.TempDir())
	if err := s.Put(entry("../x")); err == nil {
		t.Error("Put with a path-like id succeeded")
	}
}
