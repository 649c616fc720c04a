package oci

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kl-egress/kl/tests/testutil"
)

// runc's --config FILE may be a symlink (a bundle assembled from shared files): SaveFile
// writes the target, through the link, and keeps the target's owner and mode; the link
// stays a link. A plain file keeps its owner and mode too.
func TestSaveFileKeepsLinkOwnerMode(t *testing.T) {
	testutil.RequirePrivileged(t) // chown to another uid
	const uid, gid = 4242, 4343
	tests := []struct {
		name string
		link func(t *testing.T, dir, target string) string // returns the path to save; "" saves target itself
	}{
		{name: "plain file"},
		{name: "absolute symlink", link: func(t *testing.T, dir, target string) string {
			p := filepath.Join(dir, "bundle", "config.json")
			mkLink(t, target, p)
			return p
		}},
		{name: "relative symlink", link: func(t *testing.T, dir, target string) string {
			p := filepath.Join(dir, "bundle", "config.json")
			mkLink(t, "../shared/spec.json", p)
			return p
		}},
		{name: "symlink to a symlink", link: func(t *testing.T, dir, target string) string {
			mid := filepath.Join(dir, "mid.json")
			mkLink(t, target, mid)
			p := filepath.Join(dir, "bundle", "config.json")
			mkLink(t, mid, p)
			return p
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			target := filepath.Join(dir, "shared", "spec.json")
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(target, []byte(`{"process":{"env":["PATH=/bin"]}}`), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(target, 0o640); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(target, uid, gid); err != nil {
				t.Fatal(err)
			}
			p := target
			if tt.link != nil {
				p = tt.link(t, dir, target)
			}
			s, err := LoadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := (Env{Vars: []Var{{"HTTP_PROXY", "http://127.0.0.1:15080"}}}).Modify(s); err != nil {
				t.Fatal(err)
			}
			if err := s.SaveFile(p); err != nil {
				t.Fatal(err)
			}
			if p != target {
				if fi, err := os.Lstat(p); err != nil || fi.Mode().Type() != os.ModeSymlink {
					t.Errorf("%s after save is not a symlink (%v); want the symlink kept", p, err)
				}
			}
			data, err := os.ReadFile(target)
			if err != nil || !strings.Contains(string(data), "HTTP_PROXY=http://127.0.0.1:15080") {
				t.Errorf("target after save = %s, %v; want the edit", data, err)
			}
			fi, err := os.Lstat(target)
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o640 || st.Uid != uid || st.Gid != gid {
				t.Errorf("target after save: %v uid %d gid %d; want a regular file, -rw-r----- %d:%d", fi.Mode(), st.Uid, st.Gid, uid, gid)
			}
			for _, d := range []string{filepath.Dir(target), filepath.Join(dir, "bundle")} {
				ents, _ := os.ReadDir(d)
				for _, e := range ents {
					if strings.Contains(e.Name(), ".kl-") {
						t.Errorf("temporary file left: %s", filepath.Join(d, e.Name()))
					}
				}
			}
		})
	}
}

func mkLink(t *testing.T, oldname, newname string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(newname), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(oldname, newname); err != nil {
		t.Fatal(err)
	}
}
