package audit

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kl-egress/kl/tests/testutil"
)

// smallFS mounts a tmpfs of size bytes for the test.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		testutil.Unavailable(t, "not root: cannot mount a tmpfs")
		return ""
	}
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size="+size); err != nil {
		testutil.Unavailable(t, "mount tmpfs: "+err.Error())
		return ""
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// fill writes a file until the file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	for {
		if _, err := f.Write(page); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return
		}
	}
}

// A disk full for a while drops the records written meanwhile, counted, and nothing else:
// once there is room again records reach the file, which holds only whole lines.
func TestWriteRecoversAfterDiskFull(t *testing.T) {
	dir := smallFS(t, "64k")
	path := filepath.Join(dir, "audit.jsonl")
	l, err := New(path, 1<<20, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	var logs bytes.Buffer
	l.SetLogger(slog.New(slog.NewTextHandler(&logs, nil)))
	const full = 800
	add := func(n int, note string) {
		for range n {
			l.Add(Record{At: t0, Dimension: "default", Exit: "direct", Note: note})
		}
	}
	add(10, "before")
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}

	// One page stays free, so a failing write puts part of a record in the file.
	if err := os.WriteFile(filepath.Join(dir, "page"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	fill(t, filepath.Join(dir, "rest"))
	if err := os.Remove(filepath.Join(dir, "page")); err != nil {
		t.Fatal(err)
	}
	add(full, "full") // more than two buffers: two writes fail, then the flush

	if err := l.Flush(); err == nil {
		t.Fatal("Flush on a full disk = nil")
	}
	if d, err := l.WriteErr(); d == 0 || err == nil {
		t.Fatalf("WriteErr() on a full disk = %d, %v; want drops and an error", d, err)
	}

	os.Remove(filepath.Join(dir, "rest"))
	add(10, "after")
	if err := l.Flush(); err != nil {
		t.Fatalf("Flush with room again = %v", err)
	}
	dropped, err := l.WriteErr()
	if err != nil {
		t.Errorf("WriteErr() with room again = %d, %v; want a nil error", dropped, err)
	}
	notes := map[string]uint64{}
	for _, r := range readLines(t, path) { // every line is a whole record
		notes[r.Note]++
	}
	if notes["before"] != 10 || notes["after"] != 10 || notes["full"]+dropped != full {
		t.Errorf("file holds %v with %d dropped; want 10 before, 10 after and the %d during the full disk either there or dropped", notes, dropped, full)
	}
	t.Logf("file holds %v, %d dropped", notes, dropped)
	if n := strings.Count(logs.String(), "audit file write failed"); n != 1 {
		t.Errorf("%d failure messages, want 1:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "audit file written again"); n != 1 {
		t.Errorf("%d recovery messages, want 1:\n%s", n, logs.String())
	}
}

// A rotation whose reopen fails (here the file system is out of inodes, as under
// EMFILE or a full disk) is tried again on the next record; the retry must not shift the
// rotated files a second time, which would overwrite the oldest one that keep allows
// and leave path.1 empty.
func TestRotationRetryKeepsRotatedFiles(t *testing.T) {
	// Inodes: the root, the log, path.1, path.2 and a filler that is removed later.
	dir := smallFS(t, "1m,nr_inodes=5")
	path := filepath.Join(dir, "audit.jsonl")
	older := map[string]string{path + ".1": "B", path + ".2": "C"}
	for p, note := range older {
		if err := os.WriteFile(p, appendJSON(nil, &Record{At: t0, Dimension: "default", Exit: "direct", Note: note}), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	l, err := New(path, 100, 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	if err := os.WriteFile(filepath.Join(dir, "filler"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	add := func(note string) { l.Add(Record{At: t0, Dimension: "default", Exit: "direct", Note: note}) }
	add("A") // the current file, rotated by the next record
	add("lost")
	if _, err := l.WriteErr(); err == nil {
		t.Fatal("WriteErr() = nil after a rotation that could not reopen the file")
	}
	if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
		t.Fatal(err)
	}
	add("D")
	if err := l.Flush(); err != nil {
		t.Fatalf("Flush after the retry = %v", err)
	}
	want := map[string]string{path: "D", path + ".1": "A", path + ".2": "B", path + ".3": "C"}
	for p, note := range want {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v; want it to hold %s", filepath.Base(p), err, note)
			continue
		}
		recs := readLines(t, p)
		if len(recs) != 1 || recs[0].Note != note {
			t.Errorf("%s holds %+v, want the one record %s", filepath.Base(p), recs, note)
		}
	}
}
