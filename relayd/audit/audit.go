// Package audit keeps kl's decision records: one Record per flow decision, appended as
// JSON lines to a size-rotated file and kept in a ring for `kl-ctl status`, with hit
// counts per rule.
//
// It is not a general logger, and by construction it cannot leak what a flow was about:
// a Record has no field for the destination name or address, the payload or any
// identity (SPEC §5), so records can be exported as they are.
package audit

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// Record is one decision. Rule is the 1-based rule index (0 for default, guard and
// script), Priority its tier, Dimension which part of the policy decided, Exit the
// canonical exit, Note the rule's note, Reason why a flow failed or was refused (an
// upstream error, a script failure) and Path where the flow was handled ("relay", or
// "kernel" for flows the capture never sent to the relay).
type Record struct {
	At        time.Time `json:"at"`
	Rule      int       `json:"rule"`
	Priority  int       `json:"priority"`
	Dimension string    `json:"dimension"`
	Exit      string    `json:"exit"`
	Note      string    `json:"note,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	Path      string    `json:"path,omitempty"`
}

// Hit is the number of decisions made by one rule (or, for rule 0, by one of the
// dimensions default, guard and script).
type Hit struct {
	Rule      int    `json:"rule"`
	Dimension string `json:"dimension"`
	Count     uint64 `json:"count"`
}

type hitKey struct {
	rule int
	dim  string
}

// flushInterval is how often pending records reach the file, and closeWait how long
// Close waits for the file to take the last ones (vars so tests can shorten them).
var (
	flushInterval = time.Second
	closeWait     = 5 * time.Second
)

const (
	// wakeAt is how many pending bytes wake the writer before the next tick.
	wakeAt = 32 << 10
	// pendingCap bounds the pending bytes when the file does not keep up (a slow, stalled,
	// full or failing disk): records beyond it are dropped rather than kept or waited for.
	pendingCap = 4 << 20
	// spareCap is the largest pending buffer kept for reuse once written.
	spareCap = 256 << 10
)

var newline = []byte{'\n'}

// Log is a goroutine-safe decision log.
//
// Add, called on the relay's event loops, never touches the file and never waits for it:
// under mu it counts the record and appends its line to pend. One writer goroutine (or
// Flush and Close) takes pend whole and does all file work holding only wmu, so a slow
// or stalled disk delays the file, never a flow.
type Log struct {
	mu      sync.Mutex
	ring    []Record
	next    int // ring slot for the next record
	count   uint64
	hits    map[hitKey]uint64
	pend    []byte // encoded lines not yet taken by the writer
	pendN   uint64 // the records in pend
	taken   uint64 // records the writer has taken and not written or put back yet
	spare   []byte // the buffer pend becomes when the writer takes it
	shed    uint64 // records dropped at pendingCap since the writer last took pend
	dropped uint64
	err     error  // the first error of a failure that has not ended yet
	lostAt  uint64 // dropped when err began
	log     *slog.Logger
	closed  bool
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}

	// The file, owned by whoever holds wmu (the writer, Flush or Close).
	wmu      sync.Mutex
	path     string
	max      int64
	keep     int
	f        *os.File
	size     int64  // the file's size: whole records only, unless torn
	torn     bool   // the file ends in part of a record that could not be cut off
	shedding uint64 // records dropped at pendingCap since the writer last kept up
}

// New opens (appending to) the JSON-lines file at path, rotating it when it would grow
// past maxBytes and keeping `keep` rotated files (path.1 … path.keep). ring is how many
// recent records Recent can return. path "" keeps records in memory only.
func New(path string, maxBytes int64, keep int, ring int) (*Log, error) {
	if ring < 0 || keep < 0 {
		return nil, fmt.Errorf("audit: negative ring (%d) or keep (%d)", ring, keep)
	}
	l := &Log{
		ring: make([]Record, ring),
		hits: make(map[hitKey]uint64),
		path: path,
		max:  maxBytes,
		keep: keep,
	}
	if path == "" {
		return l, nil
	}
	if maxBytes <= 0 {
		return nil, fmt.Errorf("audit: max size of %s must be positive, got %d", path, maxBytes)
	}
	if err := l.open(); err != nil {
		return nil, err
	}
	l.pend, l.spare = make([]byte, 0, 2*wakeAt), make([]byte, 0, 2*wakeAt)
	l.wake, l.stop, l.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go l.writer()
	return l, nil
}

func (l *Log) open() error {
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("audit: open %s: %w", l.path, err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("audit: stat %s: %w", l.path, err)
	}
	l.f, l.size = f, st.Size()
	// A file that ends in part of a record (a crash or a power cut mid-write, or a failed
	// write that could not be cut off before a restart) gets the next record on a line of
	// its own, as within one run (write).
	l.torn = false
	if l.size > 0 {
		last := make([]byte, 1)
		r, err := os.Open(l.path)
		if err == nil {
			_, err = r.ReadAt(last, l.size-1)
			_ = r.Close()
		}
		l.torn = err != nil || last[0] != '\n'
	}
	return nil
}

// writer writes pending records every flushInterval, or sooner when Add says enough are
// pending.
func (l *Log) writer() {
	defer close(l.done)
	t := time.NewTicker(flushInterval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		case <-l.wake:
		}
		l.wmu.Lock()
		l.writePending()
		l.wmu.Unlock()
	}
}

// SetLogger makes the log report, once each, when writing to its file starts failing and
// when it works again, and when records start and stop being dropped because the file
// does not keep up. Without it failures show only in WriteErr.
func (l *Log) SetLogger(log *slog.Logger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.log = log
}

func (l *Log) logger() *slog.Logger {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.log
}

// writePending takes everything Add has appended and writes it to the file; what a failed
// write or rotation leaves is put back in front of the pending records. wmu is held.
func (l *Log) writePending() {
	l.mu.Lock()
	b := l.pend
	l.pend, l.spare = l.spare, nil
	l.taken, l.pendN = l.pendN, 0
	shed := l.shed
	l.shed = 0
	l.mu.Unlock()

	l.reportShed(shed)
	var rest []byte
	if len(b) > 0 {
		rest = l.writeBatch(b)
	}

	if len(rest) > 0 {
		l.mu.Lock()
		l.putBack(b, rest)
		l.mu.Unlock()
		return
	}
	if cap(b) > spareCap {
		b = make([]byte, 0, 2*wakeAt) // let a burst's buffer go
	}
	l.mu.Lock()
	l.spare = b[:0]
	l.mu.Unlock()
}

// putBack makes rest, the records of the batch b that a failed write or rotation left (a
// suffix of b), pending again in front of those Add appended meanwhile, so that the next
// batch writes them first and a failure loses nothing while it lasts. What goes past
// pendingCap, the newest records, is dropped and counted. mu is held.
func (l *Log) putBack(b, rest []byte) {
	n := uint64(bytes.Count(rest, newline))
	l.taken -= n
	l.pendN += n
	p := append(b[:copy(b, rest)], l.pend...)
	if len(p) > pendingCap {
		cut := bytes.LastIndexByte(p[:pendingCap], '\n') + 1 // Add keeps every record below pendingCap
		lost := uint64(bytes.Count(p[cut:], newline))
		l.dropped += lost
		l.pendN -= lost
		p = p[:cut]
	}
	l.pend, l.spare = p, l.pend[:0]
}

// reportShed logs once when records start being dropped at pendingCap and once when the
// writer has caught up again. wmu is held.
func (l *Log) reportShed(shed uint64) {
	switch {
	case shed > 0:
		if l.shedding == 0 {
			if log := l.logger(); log != nil {
				log.Warn("audit file does not keep up; records are dropped until it does", "path", l.path, "pending", pendingCap)
			}
		}
		l.shedding += shed
	case l.shedding > 0:
		if log := l.logger(); log != nil {
			log.Info("audit file keeps up again", "path", l.path, "dropped", l.shedding)
		}
		l.shedding = 0
	}
}

// writeBatch writes whole records from b, rotating the file by size between records so
// that a record never straddles two files. A failed write or rotation stops the batch:
// it returns the records not written (a suffix of b), which the next batch tries again;
// nil when every record was written. wmu is held.
func (l *Log) writeBatch(b []byte) []byte {
	for len(b) > 0 {
		first := bytes.IndexByte(b, '\n') + 1 // every line ends with '\n'
		if first == 0 {
			first = len(b)
		}
		if l.f == nil || (l.size > 0 && l.size+int64(first) > l.max) {
			// (No file: a rotation failed after closing it, and is tried again.)
			if err := l.rotate(); err != nil {
				l.fail(err)
				return b
			}
		}
		n, err := l.write(b[:l.fits(b, first)])
		l.mu.Lock()
		l.taken -= uint64(bytes.Count(b[:n], newline))
		l.mu.Unlock()
		b = b[n:]
		if err != nil {
			l.fail(err)
			return b
		}
	}
	l.wrote()
	return nil
}

// fits returns how many bytes of whole records from b fit in the file, at least the
// first record (first bytes long).
func (l *Log) fits(b []byte, first int) int {
	room := l.max - l.size
	if int64(len(b)) <= room {
		return len(b)
	}
	n := first
	for n < len(b) {
		i := bytes.IndexByte(b[n:], '\n') + 1
		if i == 0 {
			i = len(b) - n
		}
		if int64(n+i) > room {
			break
		}
		n += i
	}
	return n
}

// write appends p, whole records, to the file and returns how many bytes of whole
// records it wrote: all of p, or, when the write fails part way, the records before the
// one it failed in. Part of that record may be left in the file: it is cut off, or, when
// that fails too, the next record starts on a line of its own.
func (l *Log) write(p []byte) (int, error) {
	if l.torn {
		if _, err := l.f.Write(newline); err != nil {
			return 0, l.cutBack(0, err)
		}
		l.size++
		l.torn = false
	}
	if n, err := l.f.Write(p); err != nil {
		whole := bytes.LastIndexByte(p[:n], '\n') + 1
		return whole, l.cutBack(whole, err)
	}
	l.size += int64(len(p))
	return len(p), nil
}

// cutBack cuts what a failed write put in the file back to the whole records it wrote
// (whole bytes).
func (l *Log) cutBack(whole int, err error) error {
	want := l.size + int64(whole)
	if st, serr := l.f.Stat(); serr == nil && st.Size() > want {
		if terr := l.f.Truncate(want); terr != nil {
			want = st.Size()
			l.torn = true
		}
	}
	l.size = want
	return err
}

// wrote notes that a batch reached the file, which ends a failure.
func (l *Log) wrote() {
	l.mu.Lock()
	err, log, dropped := l.err, l.log, l.dropped-l.lostAt
	l.err = nil
	l.mu.Unlock()
	if err != nil && log != nil {
		log.Info("audit file written again", "path", l.path, "dropped", dropped)
	}
}

func (l *Log) fail(err error) {
	l.mu.Lock()
	first, log := l.err == nil, l.log
	if first {
		l.err, l.lostAt = err, l.dropped
	}
	l.mu.Unlock()
	if first && log != nil {
		log.Warn("audit file write failed; records wait until a write succeeds, and are dropped past 4 MiB", "path", l.path, "err", err)
	}
}

// Add records one decision. It never touches the file and never waits for it: the line
// is appended to memory that a writer goroutine writes every second, or sooner when
// 32 KiB are pending. A failed write is tried again with the next batch; records that
// find 4 MiB pending (the disk does not keep up, or keeps failing) are dropped: WriteErr
// counts them; they still count in the ring, Total and the hits.
func (l *Log) Add(r Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.count++
	l.hits[hitKey{r.Rule, r.Dimension}]++
	if len(l.ring) > 0 {
		l.ring[l.next] = r
		l.next = (l.next + 1) % len(l.ring)
	}
	if l.wake == nil || l.closed {
		return
	}
	n := len(l.pend)
	l.pend = appendJSON(l.pend, &r)
	switch {
	case len(l.pend) > pendingCap:
		l.pend = l.pend[:n]
		l.dropped++
		l.shed++
		return
	case n < wakeAt && len(l.pend) >= wakeAt:
		select {
		case l.wake <- struct{}{}:
		default: // already woken
		}
	}
	l.pendN++
}

// rotate moves path to path.1 (path.1 to path.2 …), drops the oldest and reopens. wmu
// is held.
//
// A rotation that fails part way is tried again by the next batch, so it must be safe
// to repeat: when path is already gone (moved, then the reopen failed) nothing is
// shifted again, and the shift stops at the first free slot (one a failed rename left),
// so a retry never pushes the rotated files one step further and drops the oldest that
// keep allows.
func (l *Log) rotate() error {
	if l.f != nil {
		if err := l.f.Close(); err != nil {
			l.fail(err)
		}
		l.f = nil
	}
	if _, err := os.Lstat(l.path); errors.Is(err, os.ErrNotExist) {
		// Already moved away by a rotation whose reopen failed.
	} else if l.keep == 0 {
		if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("audit: rotate %s: %w", l.path, err)
		}
	} else {
		free := 1 // the first of path.1 … path.keep that does not exist (keep when all do)
		for ; free < l.keep; free++ {
			if _, err := os.Lstat(l.path + "." + strconv.Itoa(free)); errors.Is(err, os.ErrNotExist) {
				break
			}
		}
		for i := free - 1; i >= 1; i-- {
			from := l.path + "." + strconv.Itoa(i)
			if err := os.Rename(from, l.path+"."+strconv.Itoa(i+1)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("audit: rotate %s: %w", from, err)
			}
		}
		if err := os.Rename(l.path, l.path+".1"); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("audit: rotate %s: %w", l.path, err)
		}
	}
	return l.open()
}

// Recent returns up to n of the most recent records, oldest first.
func (l *Log) Recent(n int) []Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	size := len(l.ring)
	have := int(min(l.count, uint64(size)))
	n = max(0, min(n, have))
	out := make([]Record, n)
	start := (l.next - n + size) % max(size, 1)
	for i := range out {
		out[i] = l.ring[(start+i)%size]
	}
	return out
}

// Hits returns decision counts per rule number; rule 0 adds up default, guard and
// script decisions (HitCounts tells them apart).
func (l *Log) Hits() map[int]uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[int]uint64, len(l.hits))
	for k, v := range l.hits {
		m[k.rule] += v
	}
	return m
}

// ResetHits starts the counts again: the daemon calls it when other rules load, whose
// numbers name other rules (the records themselves, the ring and Total are kept).
func (l *Log) ResetHits() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.hits)
}

// HitCounts returns the counts per rule and dimension (rule 0 is the default, the guard
// or a script, told apart by it; any other rule has one), sorted by rule then dimension.
func (l *Log) HitCounts() []Hit {
	l.mu.Lock()
	out := make([]Hit, 0, len(l.hits))
	for k, v := range l.hits {
		out = append(out, Hit{Rule: k.rule, Dimension: k.dim, Count: v})
	}
	l.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Rule != out[j].Rule {
			return out[i].Rule < out[j].Rule
		}
		return out[i].Dimension < out[j].Dimension
	})
	return out
}

// Total is the number of records added since New.
func (l *Log) Total() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count
}

// WriteErr reports how many records did not reach the file since New, because the file
// did not take them (a slow, stalled, full or failing disk) before 4 MiB were pending or
// before Close, and the first error of a failure still going on (nil once a write
// succeeds again).
func (l *Log) WriteErr() (dropped uint64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped, l.err
}

// Flush writes pending records to the file now, waiting for the disk, and returns the
// error of a failure still going on.
func (l *Log) Flush() error {
	if l.wake == nil {
		return nil
	}
	l.wmu.Lock()
	l.writePending()
	l.wmu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Close writes every pending record and closes the file, waiting for the disk at most
// closeWait (5s): a disk that has not taken them by then (a stalled disk, NFS) makes
// Close return an error that names the file and how many records it did not take yet,
// and the writes go on in the background. Records added after Close still reach the ring
// and the hit counts.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed || l.wake == nil {
		l.closed = true
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	close(l.stop)
	closed := make(chan error, 1)
	go func() {
		<-l.done
		l.wmu.Lock()
		l.writePending()
		if l.f != nil {
			if err := l.f.Close(); err != nil {
				l.fail(err)
			}
			l.f = nil
		}
		l.wmu.Unlock()
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.pendN > 0 { // put back by a failed last write: nothing writes them now
			closed <- fmt.Errorf("audit: close %s: %d records not written: %w", l.path, l.pendN, l.err)
			l.dropped += l.pendN
			l.pend, l.pendN = nil, 0
			return
		}
		closed <- l.err
	}()
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case err := <-closed:
		return err
	case <-t.C:
		l.mu.Lock()
		defer l.mu.Unlock()
		return fmt.Errorf("audit: close %s: the file did not take the last records within %s: %d records not written", l.path, closeWait, l.pendN+l.taken)
	}
}

// appendJSON encodes r exactly as encoding/json would (same keys, order and escaping),
// followed by a newline, without allocating.
func appendJSON(b []byte, r *Record) []byte {
	b = append(b, `{"at":"`...)
	b = r.At.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","rule":`...)
	b = strconv.AppendInt(b, int64(r.Rule), 10)
	b = append(b, `,"priority":`...)
	b = strconv.AppendInt(b, int64(r.Priority), 10)
	b = append(b, `,"dimension":`...)
	b = appendString(b, r.Dimension)
	b = append(b, `,"exit":`...)
	b = appendString(b, r.Exit)
	if r.Note != "" {
		b = append(b, `,"note":`...)
		b = appendString(b, r.Note)
	}
	if r.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendString(b, r.Reason)
	}
	if r.Path != "" {
		b = append(b, `,"path":`...)
		b = appendString(b, r.Path)
	}
	return append(b, "}\n"...)
}

const hexDigits = "0123456789abcdef"

// appendString is encoding/json's string encoding (HTML-safe, invalid UTF-8 replaced).
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
