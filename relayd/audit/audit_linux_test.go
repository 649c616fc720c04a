package audit

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

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

// A disk full for a while loses nothing: the records that did not fit wait and reach the
// file, whole, once, and in order, as soon as there is room again, behind the whole
// records the failed write did put in the file.
func TestWriteRecoversAfterDiskFull(t *testing.T) {
	dir := smallFS(t, "1m")
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
	// The writer is held off so that the records come as one batch, far more than the free
	// page: its write fails part way. (Smaller batches taken as the records come could fit
	// in the page and end the failure early.)
	l.wmu.Lock()
	add(full, "full")
	l.wmu.Unlock()

	if err := l.Flush(); err == nil {
		t.Fatal("Flush on a full disk = nil")
	}
	if d, err := l.WriteErr(); d != 0 || err == nil {
		t.Fatalf("WriteErr() on a full disk = %d, %v; want no drops (the records wait) and an error", d, err)
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
	var got []string
	notes := map[string]int{}
	for _, r := range readLines(t, path) { // every line is a whole record
		got = append(got, r.Note)
		notes[r.Note]++
	}
	want := slices.Concat(slices.Repeat([]string{"before"}, 10), slices.Repeat([]string{"full"}, full), slices.Repeat([]string{"after"}, 10))
	if dropped != 0 || !slices.Equal(got, want) {
		t.Errorf("file holds %v with %d dropped; want 10 before, %d full and 10 after, in that order, and none dropped", notes, dropped, full)
	}
	if n := strings.Count(logs.String(), "audit file write failed"); n != 1 {
		t.Errorf("%d failure messages, want 1:\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "audit file written again"); n != 1 {
		t.Errorf("%d recovery messages, want 1:\n%s", n, logs.String())
	} else if want := "dropped=" + strconv.FormatUint(dropped, 10) + "\n"; !strings.Contains(logs.String(), want) {
		t.Errorf("the recovery message does not say %q (every record dropped during the failure):\n%s", want, logs.String())
	}
}

// A disk that keeps failing keeps pendingCap of records waiting, the oldest, and drops
// the rest: once the disk has room again the file holds exactly the records before the
// drops, and WriteErr counts exactly the ones it does not hold.
func TestFailingDiskKeepsRecordsUpToTheCap(t *testing.T) {
	dir := smallFS(t, "16m")
	path := filepath.Join(dir, "audit.jsonl")
	l, err := New(path, 1<<30, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	fill(t, filepath.Join(dir, "rest"))
	long := strings.Repeat("x", 1000)
	rec := func(i int) Record {
		return Record{At: t0, Dimension: "default", Exit: "direct", Note: strconv.Itoa(i) + long}
	}
	n := 2 * pendingCap / len(long) // twice what the cap holds
	for i := range n {
		l.Add(rec(i))
		if i%500 == 499 { // failing writes meanwhile, each putting its batch back
			if err := l.Flush(); err == nil {
				t.Fatalf("Flush on a full disk after %d records = nil", i+1)
			}
		}
	}
	dropped, err := l.WriteErr()
	if dropped == 0 || dropped >= uint64(n) || err == nil {
		t.Fatalf("WriteErr() on a full disk past the cap = %d, %v; want some of the %d records dropped and an error", dropped, err, n)
	}

	if err := os.Remove(filepath.Join(dir, "rest")); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(); err != nil {
		t.Fatalf("Flush with room again = %v", err)
	}
	if d, err := l.WriteErr(); d != dropped || err != nil {
		t.Fatalf("WriteErr() with room again = %d, %v; want still %d, nil", d, err, dropped)
	}
	recs := readLines(t, path)
	if len(recs)+int(dropped) != n {
		t.Fatalf("the file holds %d records and %d were dropped; want %d in all", len(recs), dropped, n)
	}
	for i, r := range recs {
		if want := rec(i).Note; r.Note != want {
			t.Fatalf("record %d in the file is %.10s…, want %.10s… (the oldest records, in order)", i, r.Note, want)
		}
	}
}

// A rotation whose reopen fails (here the file system is out of inodes, as under
// EMFILE or a full disk) is tried again by the next batch, with the record that waited
// for it; the retry must not shift the rotated files a second time, which would
// overwrite the oldest one that keep allows and leave path.1 empty.
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
	add("D") // waits for the rotation
	if err := l.Flush(); err == nil {
		t.Fatal("Flush() = nil after a rotation that could not reopen the file")
	}
	if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
		t.Fatal(err)
	}
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

// stalledLog returns a log whose file is a FIFO with a full pipe, so that the log's
// writes block until the test reads. The test's end is opened read-write, so that
// neither it nor the log's open blocks; filler is how many bytes the test put in the pipe.
func stalledLog(t *testing.T, ring int) (l *Log, rw *os.File, filler int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit.fifo")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	rw, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rw.Close() })
	raw, err := rw.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	cerr := raw.Control(func(fd uintptr) {
		if werr = unix.SetNonblock(int(fd), true); werr != nil {
			return
		}
		// Pages first, then single bytes for what is left of the last page. A pipe holds
		// at most 1 MiB unless the administrator raised pipe-max-size.
		for _, chunk := range []int{4096, 1} {
			buf := bytes.Repeat([]byte{'#'}, chunk)
			for i := 0; ; i++ {
				if i == 1<<20 {
					werr = errors.New("the pipe never filled")
					return
				}
				n, err := unix.Write(int(fd), buf)
				filler += max(n, 0)
				if errors.Is(err, unix.EAGAIN) {
					break
				}
				if err != nil {
					werr = err
					return
				}
			}
		}
	})
	if cerr != nil || werr != nil {
		t.Fatalf("fill the pipe of %s: %v %v", path, cerr, werr)
	}
	if l, err = New(path, 1<<30, 1, ring); err != nil {
		t.Fatal(err)
	}
	return l, rw, filler
}

// closeAndRead lets the test's end of a stalled FIFO read while l is closed, and checks
// that after the filler the log wrote exactly want: every record, whole and in order.
func closeAndRead(t *testing.T, l *Log, rw *os.File, filler int, want []byte) {
	t.Helper()
	if err := rw.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	read := make(chan []byte, 1)
	go func() {
		b := make([]byte, filler+len(want))
		n, err := io.ReadFull(rw, b)
		if err != nil {
			t.Errorf("read %d bytes from the audit FIFO: got %d: %v", len(b), n, err)
		}
		read <- b[:n]
	}()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := <-read; len(got) < filler || !bytes.Equal(got[filler:], want) {
		t.Fatalf("the FIFO got %d bytes after the filler, want %d records in order (%d bytes)", len(got)-filler, bytes.Count(want, newline), len(want))
	}
}

// waitAdded waits (bounded) for a goroutine adding records; if they do not return, it
// drains the FIFO so that the stalled log can finish, and fails.
func waitAdded(t *testing.T, added <-chan struct{}, rw *os.File) {
	t.Helper()
	select {
	case <-added:
	case <-time.After(30 * time.Second):
		go func() { _, _ = io.Copy(io.Discard, rw) }()
		t.Fatal("Add blocked while the write to the audit file was stalled")
	}
}

// The relay's event loops call Add for every flow: a write to the file that does not
// return (a stalled disk, NFS) must not hold them. Here the file is a FIFO nobody reads
// yet, so the writer blocks for real; every Add still returns, and once the reader reads,
// every record arrives, whole and in order.
func TestAddNeverWaitsForTheFile(t *testing.T) {
	l, rw, filler := stalledLog(t, 16)
	const n = 3000 // about 250 KiB: several wakes of the writer, more than the pipe holds
	var want []byte
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = Record{At: t0, Rule: 1, Priority: 500, Dimension: "cidr", Exit: "direct", Note: strconv.Itoa(i), Path: "relay"}
		want = appendJSON(want, &recs[i])
	}
	added := make(chan struct{})
	go func() {
		defer close(added)
		for _, r := range recs {
			l.Add(r)
		}
	}()
	waitAdded(t, added, rw)
	// Nothing has read the pipe, which holds far less than the records: the writer is
	// still blocked in a write.
	if got := l.Total(); got != n {
		t.Fatalf("Total() = %d, want %d", got, n)
	}
	if got := l.Recent(1); len(got) != 1 || got[0].Note != strconv.Itoa(n-1) {
		t.Fatalf("Recent(1) = %+v, want record %d", got, n-1)
	}

	closeAndRead(t, l, rw, filler, want)
	if d, err := l.WriteErr(); d != 0 || err != nil {
		t.Fatalf("WriteErr() = %d, %v; want 0, nil", d, err)
	}
}

// A disk that does not keep up does not make the pending records grow without bound:
// past pendingCap records are dropped and counted, still counted in Total, and the log
// says so once.
func TestPendingCapDropsAndCounts(t *testing.T) {
	l, rw, filler := stalledLog(t, 4)
	var logs bytes.Buffer // written by the writer, read after Close
	l.SetLogger(slog.New(slog.NewTextHandler(&logs, nil)))
	long := strings.Repeat("x", 1000)
	n := 2 * pendingCap / len(long) // twice what the cap holds
	added := make(chan struct{})
	go func() {
		defer close(added)
		for i := range n {
			l.Add(Record{At: t0, Dimension: "default", Exit: "direct", Note: strconv.Itoa(i) + long})
		}
	}()
	waitAdded(t, added, rw)
	l.mu.Lock()
	pending := len(l.pend)
	l.mu.Unlock()
	if pending > pendingCap {
		t.Errorf("%d bytes pending, over the cap of %d", pending, pendingCap)
	}
	dropped, werr := l.WriteErr()
	if dropped == 0 || dropped >= uint64(n) || werr != nil {
		t.Fatalf("WriteErr() with the file stalled = %d, %v; want some of the %d records dropped, no error", dropped, werr, n)
	}
	if got := l.Total(); got != uint64(n) {
		t.Errorf("Total() = %d, want %d (dropped records count too)", got, n)
	}

	// The writer was stalled all along: the file gets the records before the cap was
	// reached, all of them, and none after.
	kept := n - int(dropped)
	var want []byte
	for i := range kept {
		want = appendJSON(want, &Record{At: t0, Dimension: "default", Exit: "direct", Note: strconv.Itoa(i) + long})
	}
	closeAndRead(t, l, rw, filler, want)
	if d, _ := l.WriteErr(); d != dropped {
		t.Errorf("WriteErr() after Close = %d dropped, want still %d", d, dropped)
	}
	if c := strings.Count(logs.String(), "does not keep up"); c != 1 {
		t.Errorf("%d messages about records dropped at the cap, want 1:\n%s", c, logs.String())
	}
}

// Close on a file that takes no writes (a FIFO nobody reads, as a hung disk) returns after
// closeWait instead of waiting for ever, so that the daemon's shutdown ends, and its error
// names the file and every record the file did not take.
func TestCloseGivesUpOnAStalledFile(t *testing.T) {
	defer func(d time.Duration) { closeWait = d }(closeWait)
	closeWait = 100 * time.Millisecond
	l, rw, _ := stalledLog(t, 0)
	const n = 1000 // about 100 KiB: more than one wake of the writer
	for i := range n {
		l.Add(Record{At: t0, Dimension: "default", Exit: "direct", Note: strconv.Itoa(i)})
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	var err error
	select {
	case err = <-closed:
	case <-time.After(30 * time.Second):
		go func() { _, _ = io.Copy(io.Discard, rw) }() // let the stalled Close finish
		t.Fatal("Close waited for a write to the audit file that does not return")
	}
	go func() { _, _ = io.Copy(io.Discard, rw) }() // let the background writes finish
	want := l.path + ": the file did not take the last records within 100ms: " + strconv.Itoa(n) + " records not written"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Close() on a stalled file = %v; want an error saying %q", err, want)
	}
}

// Close on a full disk cannot write the records still waiting: it counts them as dropped
// and its error says how many.
func TestCloseOnAFullDiskCountsWhatItLoses(t *testing.T) {
	dir := smallFS(t, "1m")
	path := filepath.Join(dir, "audit.jsonl")
	l, err := New(path, 1<<20, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	fill(t, filepath.Join(dir, "rest"))
	const n = 100
	for range n {
		l.Add(Record{At: t0, Dimension: "default", Exit: "direct"})
	}
	err = l.Close()
	if want := "audit: close " + path + ": " + strconv.Itoa(n) + " records not written: "; err == nil || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("Close() on a full disk = %v; want %q and the write's error", err, want)
	}
	if d, _ := l.WriteErr(); d != n {
		t.Errorf("WriteErr() after Close = %d dropped, want %d", d, n)
	}
}
