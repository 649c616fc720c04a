package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 4, 0, 0, 123456789, time.UTC)

func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	tests := []struct {
		name string
		r    Record
	}{
		{"zero", Record{}},
		{"full", Record{At: t0, Rule: 3, Priority: 400, Dimension: "domain", Exit: "proxy", Note: "exit A", Reason: "upstream down", Path: "relay"}},
		{"zone", Record{At: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("X", 3600)), Rule: 0, Priority: 999, Dimension: "default", Exit: "direct"}},
		{"escapes", Record{Note: "quote\" back\\ nl\n tab\t ctl\x01 <html>&amp; \u2028\u2029 ünïcødé 出口", Reason: "bad\xffutf8"}},
		{"negative", Record{Rule: -1, Priority: -5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := json.Marshal(tt.r)
			if err != nil {
				t.Fatal(err)
			}
			got := appendJSON(nil, &tt.r)
			if string(got) != string(want)+"\n" {
				t.Fatalf("appendJSON(%+v)\n got %s\nwant %s", tt.r, got, want)
			}
		})
	}
}

func FuzzAppendJSON(f *testing.F) {
	f.Add(3, 400, "domain", "proxy", "exit A", "", "relay", int64(0))
	f.Add(0, 999, "default", "direct", "<\u2028\"\\\x00", "x\xff", "kernel", int64(1e18))
	f.Fuzz(func(t *testing.T, rule, prio int, dim, exit, note, reason, path string, nanos int64) {
		r := Record{At: time.Unix(0, nanos).UTC(), Rule: rule, Priority: prio, Dimension: dim, Exit: exit, Note: note, Reason: reason, Path: path}
		want, err := json.Marshal(r)
		if err != nil {
			return // a time encoding/json refuses; appendJSON is never given one by the relay
		}
		if got := appendJSON(nil, &r); string(got) != string(want)+"\n" {
			t.Fatalf("appendJSON(%+v)\n got %s\nwant %s", r, got, want)
		}
	})
}

func TestRecentAndHits(t *testing.T) {
	l, err := New("", 0, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Recent(10); len(got) != 0 {
		t.Fatalf("Recent on an empty log = %v", got)
	}
	adds := []Record{
		{Rule: 1, Priority: 100, Dimension: "label", Exit: "proxy"},
		{Rule: 0, Priority: 999, Dimension: "default", Exit: "direct"},
		{Rule: 0, Priority: 0, Dimension: "guard", Exit: "direct"},
		{Rule: 1, Priority: 100, Dimension: "label", Exit: "proxy"},
		{Rule: 2, Priority: 400, Dimension: "domain", Exit: "deny"},
		{Rule: 0, Priority: 999, Dimension: "default", Exit: "direct"},
	}
	for i, r := range adds {
		r.At = t0.Add(time.Duration(i) * time.Second)
		l.Add(r)
	}
	rec := l.Recent(3)
	if len(rec) != 3 || !rec[0].At.Equal(t0.Add(3*time.Second)) || !rec[2].At.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("Recent(3) = %+v, want records 4..6 oldest first", rec)
	}
	if rec := l.Recent(100); len(rec) != 4 || !rec[0].At.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("Recent(100) = %+v, want the 4 kept by the ring", rec)
	}
	if got, want := l.Hits(), map[int]uint64{0: 3, 1: 2, 2: 1}; !reflect.DeepEqual(got, want) {
		t.Fatalf("Hits() = %v, want %v", got, want)
	}
	want := []Hit{{0, "default", 2}, {0, "guard", 1}, {1, "label", 2}, {2, "domain", 1}}
	if got := l.HitCounts(); !reflect.DeepEqual(got, want) {
		t.Fatalf("HitCounts() = %v, want %v", got, want)
	}
	if l.Total() != 6 {
		t.Fatalf("Total() = %d, want 6", l.Total())
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	zero, _ := New("", 0, 0, 0)
	zero.Add(Record{Rule: 1})
	if got := zero.Recent(5); len(got) != 0 {
		t.Fatalf("Recent with no ring = %v", got)
	}
}

func readLines(t *testing.T, path string) []Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out []Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s: line %q: %v", path, sc.Text(), err)
		}
		out = append(out, r)
	}
	return out
}

func TestRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	const maxBytes, keep, n = 1000, 2, 200
	l, err := New(path, maxBytes, keep, 8)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= n; i++ {
		l.Add(Record{At: t0, Rule: i, Priority: 500, Dimension: "cidr", Exit: "direct"})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Fatalf("%s.3 exists (keep=%d): %v", path, keep, err)
	}
	// Oldest file first: the rules must be consecutive and end with n.
	var all []Record
	for _, p := range []string{path + ".2", path + ".1", path} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > maxBytes {
			t.Fatalf("%s is %d bytes, over %d", p, st.Size(), maxBytes)
		}
		all = append(all, readLines(t, p)...)
	}
	for i := 1; i < len(all); i++ {
		if all[i].Rule != all[i-1].Rule+1 {
			t.Fatalf("records not consecutive across rotated files at %d: %d then %d", i, all[i-1].Rule, all[i].Rule)
		}
	}
	if all[len(all)-1].Rule != n || len(all) < 20 {
		t.Fatalf("kept %d records ending with %d, want the newest ending with %d", len(all), all[len(all)-1].Rule, n)
	}

	// Reopening appends to the existing file.
	l2, err := New(path, maxBytes, keep, 8)
	if err != nil {
		t.Fatal(err)
	}
	before := len(readLines(t, path))
	l2.Add(Record{At: t0, Rule: n + 1, Dimension: "port", Exit: "deny"})
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	after := readLines(t, path)
	if len(after) != before+1 && !(len(after) == 1 && after[0].Rule == n+1) {
		t.Fatalf("reopen: %d lines before, %d after", before, len(after))
	}
}

// A file left ending in part of a record (a crash mid-write) gets the next run's first
// record on a line of its own, not glued to the torn one.
func TestReopenAfterTornRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	const torn = `{"at":"2026-01-01T00:00:00Z","rule":1,"priority":500,"dimension":"cidr","exit":"pro`
	whole := `{"at":"2026-01-01T00:00:00Z","rule":2,"priority":500,"dimension":"cidr","exit":"direct"}` + "\n"
	for _, tt := range []struct{ name, before, want string }{
		{"torn", whole + torn, whole + torn + "\n"},
		{"whole", whole, whole},
		{"empty", "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(tt.before), 0o640); err != nil {
				t.Fatal(err)
			}
			l, err := New(path, 1<<20, 3, 10)
			if err != nil {
				t.Fatal(err)
			}
			l.Add(Record{At: t0, Rule: 3, Priority: 500, Dimension: "cidr", Exit: "deny"})
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			rest, ok := strings.CutPrefix(string(got), tt.want)
			var r Record
			if !ok || json.Unmarshal([]byte(rest), &r) != nil || r.Rule != 3 {
				t.Fatalf("file after a reopen:\n%s\nwant %q followed by the new record on a line of its own", got, tt.want)
			}
		})
	}
}

func TestFlushInterval(t *testing.T) {
	old := flushInterval
	flushInterval = 20 * time.Millisecond
	defer func() { flushInterval = old }()
	path := filepath.Join(t.TempDir(), "a.jsonl")
	l, err := New(path, 1<<20, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	l.Add(Record{At: t0, Rule: 7, Priority: 600, Dimension: "port", Exit: "deny"})
	deadline := time.Now().Add(2 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if bytes.Contains(b, []byte(`"rule":7`)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("record not flushed to the file without Close")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConcurrentAdd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.jsonl")
	l, err := New(path, 4096, 3, 64)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 500 {
				l.Add(Record{At: t0, Rule: g, Dimension: "label", Exit: "proxy", Note: fmt.Sprint(i)})
				if i%100 == 0 {
					_ = l.Recent(10)
					_ = l.Hits()
				}
			}
		}()
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var sum uint64
	for _, v := range l.Hits() {
		sum += v
	}
	if sum != 4000 || l.Total() != 4000 {
		t.Fatalf("hits sum %d, total %d; want 4000", sum, l.Total())
	}
	_ = readLines(t, path) // every line parses
	if d, err := l.WriteErr(); d != 0 || err != nil {
		t.Fatalf("WriteErr() = %d, %v", d, err)
	}
}

func TestAddAllocs(t *testing.T) {
	l, err := New(filepath.Join(t.TempDir(), "a.jsonl"), 1<<30, 1, 128)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	r := Record{At: t0, Rule: 2, Priority: 400, Dimension: "domain", Exit: "proxy", Note: "exit A", Path: "relay"}
	l.Add(r) // warm the hit map entry
	if n := testing.AllocsPerRun(1000, func() { l.Add(r) }); n != 0 {
		t.Fatalf("Add allocates %v times per call, want 0", n)
	}
}

func TestBadArgs(t *testing.T) {
	if _, err := New(filepath.Join(t.TempDir(), "x"), 0, 1, 1); err == nil || !strings.Contains(err.Error(), "must be positive") {
		t.Fatalf("New with max 0 = %v", err)
	}
	if _, err := New(filepath.Join(t.TempDir(), "no", "such", "dir"), 10, 1, 1); err == nil || !strings.Contains(err.Error(), "audit: open") {
		t.Fatalf("New in a missing dir = %v", err)
	}
	if _, err := New("", 0, 0, -1); err == nil {
		t.Fatal("New with a negative ring succeeded")
	}
}

// The privacy promise (SPEC §5): records of flows to a known name and address hold
// neither, in the file, in Recent's JSON or in the hit counts; and Record has no field
// that could hold them.
func TestRecordsNeverHoldDestination(t *testing.T) {
	const host, ip = "secret-destination.example.com", "203.0.113.77"
	path := filepath.Join(t.TempDir(), "a.jsonl")
	l, err := New(path, 1<<20, 1, 16)
	if err != nil {
		t.Fatal(err)
	}
	// What the relay knows about each flow, and the record it builds from the decision.
	flows := []struct {
		host, dst string
		rec       Record
	}{
		{host, ip + ":443", Record{At: t0, Rule: 2, Priority: 400, Dimension: "domain", Exit: "proxy", Note: "exit A", Path: "relay"}},
		{"", ip + ":22", Record{At: t0, Rule: 3, Priority: 500, Dimension: "cidr", Exit: "deny", Path: "relay"}},
		{host, "[2001:db8::77]:443", Record{At: t0, Rule: 0, Priority: 999, Dimension: "default", Exit: "proxy",
			Reason: "upstream socks5://127.0.0.1:1080: refused by upstream: SOCKS reply 0x05 (connection refused)", Path: "relay"}},
	}
	for _, f := range flows {
		l.Add(f.rec)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	recent, err := json.Marshal(struct {
		Recent []Record
		Hits   []Hit
	}{l.Recent(16), l.HitCounts()})
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range [][]byte{file, recent} {
		for _, secret := range []string{host, ip, "2001:db8::77", "203.0.113", "secret-destination"} {
			if bytes.Contains(out, []byte(secret)) {
				t.Fatalf("audit output contains %q:\n%s", secret, out)
			}
		}
	}
	// A new field on Record must be a deliberate decision reviewed against SPEC §5.
	var fields []string
	rt := reflect.TypeOf(Record{})
	for i := range rt.NumField() {
		fields = append(fields, rt.Field(i).Name)
	}
	want := "At Rule Priority Dimension Exit Note Reason Path"
	if got := strings.Join(fields, " "); got != want {
		t.Fatalf("Record fields = %q, want %q (records must never hold a destination, payload or identity)", got, want)
	}
}

// The writer gets many records at once; rotation still goes by record, as when each
// record was written on its own: no record straddles two files, no file passes maxBytes,
// and a file is rotated only when the next record would not fit.
func TestRotationSplitsABatch(t *testing.T) {
	old := flushInterval
	flushInterval = time.Hour // one batch: the Flush below
	defer func() { flushInterval = old }()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	const maxBytes, n = 1000, 60
	l, err := New(path, maxBytes, 50, 0)
	if err != nil {
		t.Fatal(err)
	}
	var lines [][]byte
	for i := range n {
		r := Record{At: t0, Rule: i, Dimension: "cidr", Exit: "direct", Note: strings.Repeat("n", i%7*9)}
		lines = append(lines, appendJSON(nil, &r))
		l.Add(r)
	}
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var files []string // oldest first
	for i := 50; i >= 1; i-- {
		if _, err := os.Stat(fmt.Sprintf("%s.%d", path, i)); err == nil {
			files = append(files, fmt.Sprintf("%s.%d", path, i))
		}
	}
	files = append(files, path)
	if len(files) < 3 {
		t.Fatalf("%d files, want the batch split over several", len(files))
	}
	next := 0 // the first line the next file must start with
	for i, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > maxBytes {
			t.Errorf("%s is %d bytes, over %d", filepath.Base(p), len(b), maxBytes)
		}
		for len(b) > 0 && next < n && bytes.HasPrefix(b, lines[next]) {
			b = b[len(lines[next]):]
			next++
		}
		if len(b) > 0 {
			t.Fatalf("%s: after record %d comes %q, want record %d whole", filepath.Base(p), next-1, b, next)
		}
		if fi, _ := os.Stat(p); i < len(files)-1 && next < n && fi.Size()+int64(len(lines[next])) <= maxBytes {
			t.Errorf("%s was rotated with room for record %d", filepath.Base(p), next)
		}
	}
	if next != n {
		t.Fatalf("the files hold records 0..%d, want all %d", next-1, n)
	}
}
