package install

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzEditors feeds arbitrary files to every editor: no panics, and whenever an install
// succeeds it is idempotent and can be undone.
func FuzzEditors(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.*")
	for _, p := range files {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	editors := []Editor{CNI{}, Docker{}, Docker{Default: true}, Containerd{}, Containerd{Version: 3}, Containerd{Default: true}, Containerd{Version: 3, Default: true}}
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, e := range editors {
			got, err := e.Install(in)
			if err != nil {
				continue
			}
			again, err := e.Install(got)
			if err != nil || !bytes.Equal(again, got) {
				t.Fatalf("%T: second Install = %q, %v; want %q", e, again, err, got)
			}
			back, err := e.Uninstall(got)
			if err != nil {
				t.Fatalf("%T: Uninstall(Install(%q)): %v", e, in, err)
			}
			if twice, err := e.Uninstall(back); err != nil || !bytes.Equal(twice, back) {
				t.Fatalf("%T: Uninstall not idempotent on %q: %q, %v", e, back, twice, err)
			}
		}
	})
}
