// Package audit keeps kl's decision records: one Record per flow decision, appended as
// JSON lines to a size-rotated file and kept in a ring for `kl-ctl status`, with hit
// counts per rule.
//
// It is not a general logger, and by construction it cannot leak what a flow was about:
// a Record has no field for the destination name or address, the payload or any
// identity (SPEC §5), so records can be exported as they are.
package audit

import (
	"bufio"
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

// flushInterval is how often buffered records reach the file (a var so tests can
// shorten it).
var flushInterval = time.Second

// Log is a goroutine-safe decision log.
type Log struct {
	mu      sync.Mutex
	ring    []Record
	next    int // ring slot for the next record
	count   uint64
	hits    map[hitKey]uint64
	line    []byte // reused encoding buffer
	path    string
	max     int64
	keep    int
	f       *os.File
	w       *bufio.Writer
	size    int64  // the file's size once the buffer is written
	synced  int64  // the file's size after the last successful write: whole records only
	pending uint64 // records written to the buffer since synced
	err     error  // the first error of a failure that has not ended yet
	lostAt  uint64 // dropped when err began
	torn    bool   // the file ends in part of a record that could not be cut off
	dropped uint64
	log     *slog.Logger
	closed  bool
	stop    chan struct{}
	done    chan struct{}
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
		line: make([]byte, 0, 256),
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
	l.stop, l.done = make(chan struct{}), make(chan struct{})
	go l.flusher()
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
	l.f, l.size, l.synced, l.pending = f, st.Size(), st.Size(), 0
	if l.w == nil {
		l.w = bufio.NewWriterSize(f, 32<<10)
	} else {
		l.w.Reset(f)
	}
	return nil
}

func (l *Log) flusher() {
	defer close(l.done)
	t := time.NewTicker(flushInterval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.mu.Lock()
			l.flushLocked()
			l.mu.Unlock()
		}
	}
}

// SetLogger makes the log report, once each, when writing to its file starts failing and
// when it works again. Without it failures show only in WriteErr.
func (l *Log) SetLogger(log *slog.Logger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.log = log
}

func (l *Log) flushLocked() {
	if l.w == nil || l.w.Buffered() == 0 {
		return
	}
	if err := l.w.Flush(); err != nil {
		l.writeFailed(err)
		return
	}
	l.wrote()
}

// wrote notes that everything given to the buffer is in the file, which ends a failure.
func (l *Log) wrote() {
	l.synced, l.pending = l.size, 0
	if l.err == nil {
		return
	}
	if l.log != nil {
		l.log.Info("audit file written again", "path", l.path, "dropped", l.dropped-l.lostAt)
	}
	l.err = nil
}

// writeFailed recovers from a failed write (a disk full for a moment): the buffer's error
// is sticky, so it starts a fresh buffer, and the file, which may end in part of a record,
// is cut back to the last successful write. The records buffered since count as dropped;
// the next flush tries again.
func (l *Log) writeFailed(err error) {
	l.fail(err)
	l.dropped += l.pending
	l.pending = 0
	l.w.Reset(l.f)
	l.size = l.synced
	if st, serr := l.f.Stat(); serr == nil && st.Size() > l.synced {
		if terr := l.f.Truncate(l.synced); terr != nil {
			// The file keeps a partial line; the next record starts on a line of its own.
			l.size = st.Size()
			l.torn = true
		}
	}
}

func (l *Log) fail(err error) {
	if l.err != nil {
		return
	}
	l.err, l.lostAt = err, l.dropped
	if l.log != nil {
		l.log.Warn("audit file write failed; records are dropped until a write succeeds", "path", l.path, "err", err)
	}
}

// Add records one decision. It never blocks on disk: the line goes to a buffer that is
// flushed every second, or sooner when it is full. A failed write drops the records it
// held (WriteErr counts them; they still count in the hits) and the next one tries again.
func (l *Log) Add(r Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.count++
	k := hitKey{rule: r.Rule}
	if r.Rule == 0 {
		k.dim = r.Dimension
	}
	l.hits[k]++
	if len(l.ring) > 0 {
		l.ring[l.next] = r
		l.next = (l.next + 1) % len(l.ring)
	}
	if l.w == nil || l.closed {
		return
	}
	l.line = appendJSON(l.line[:0], &r)
	if l.f == nil || (l.size+int64(len(l.line)) > l.max && l.size > 0) {
		// (No file: a rotation failed after closing it, and is tried again.)
		if err := l.rotateLocked(); err != nil {
			l.fail(err)
			l.dropped++
			return
		}
	}
	if len(l.line) >= l.w.Available() {
		// Flush before the buffer fills, so that every write to the file ends with a
		// whole record and a failed one can be cut back to one.
		l.flushLocked()
	}
	if l.torn {
		// The file ends in part of a record: this one starts on a line of its own.
		l.line = appendJSON(append(l.line[:0], '\n'), &r)
		l.torn = false
	}
	l.pending++
	l.size += int64(len(l.line))
	if _, err := l.w.Write(l.line); err != nil {
		l.writeFailed(err) // a line longer than the buffer goes to the file directly
	} else if l.w.Buffered() == 0 {
		l.wrote()
	}
}

// rotateLocked moves path to path.1 (path.1 to path.2 …), drops the oldest and reopens.
//
// A rotation that fails part way is tried again by the next record, so it must be safe
// to repeat: when path is already gone (moved, then the reopen failed) nothing is
// shifted again, and the shift stops at the first free slot (one a failed rename left),
// so a retry never pushes the rotated files one step further and drops the oldest that
// keep allows.
func (l *Log) rotateLocked() error {
	if l.f != nil {
		l.flushLocked()
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
	if err := l.open(); err != nil {
		return err
	}
	l.torn = false
	return nil
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

// HitCounts returns the counts per rule, with rule 0 split by dimension, sorted by rule
// then dimension.
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

// WriteErr reports how many records did not reach the file because of errors since New,
// and the first error of a failure still going on (nil once a write succeeds again).
func (l *Log) WriteErr() (dropped uint64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped, l.err
}

// Flush writes buffered records to the file now.
func (l *Log) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked()
	return l.err
}

// Close flushes and closes the file. Records added afterwards still reach the ring and
// the hit counts.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed || l.w == nil {
		l.closed = true
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	close(l.stop)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked()
	if l.f != nil {
		if err := l.f.Close(); err != nil {
			l.fail(err)
		}
	}
	return l.err
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
