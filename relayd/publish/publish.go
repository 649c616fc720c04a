// Package publish keeps the "published rules" directory: a directory that holds only the
// rules the daemon last loaded successfully, updated atomically the way Kubernetes'
// AtomicWriter updates ConfigMap volumes. kl-runtime bind-mounts the directory (not the
// file) at /etc/kl in every container, so /etc/kl/rules.yaml inside resolves through the
// directory and follows every update; a bind mount of the file itself would pin the inode
// it saw at container start.
//
// Layout of DIR after a publish:
//
//	..2026_11_30_05_40_01.123456789/rules.yaml   one generation (a real directory)
//	..data -> ..2026_11_30_05_40_01.123456789     swapped with rename(2)
//	rules.yaml -> ..data/rules.yaml                created once, never changes
//
// A reader that opens DIR/rules.yaml sees either the whole old or the whole new file.
// Superseded generations are removed once they have been out of service for the grace
// period, so a reader that resolved ..data just before a swap still finds its file.
package publish

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultDir is where kl-relayd publishes the rules and kl-runtime looks for them.
const DefaultDir = "/run/kl/rules"

// FileName is the rules file inside the directory (and inside every generation).
const FileName = "rules.yaml"

// DataLink is the symlink naming the live generation.
const DataLink = "..data"

// DefaultGrace is how long a superseded generation stays on disk.
const DefaultGrace = 2 * time.Second

const (
	tmpLink   = "..data_tmp"
	genLayout = "..2006_01_02_15_04_05.000000000"
)

// ErrForeign marks a directory that holds something other than published rules: it is
// never written to (it could be /etc/kl, with the daemon's credentials beside the rules).
var ErrForeign = errors.New("not a published-rules directory")

// Publisher writes one published-rules directory.
type Publisher struct {
	// Dir is the directory; created when missing, and always made 0755. It must outlive
	// the daemon (containers mount this very directory: a new one is not seen by them).
	Dir string
	// Grace is how long a superseded generation is kept; 0 removes it at once.
	Grace time.Duration

	now func() time.Time // test seam; nil = time.Now
}

// Publish writes src as DIR/rules.yaml with the default grace period. See Publisher.Publish.
func Publish(dir string, src []byte) error {
	return (&Publisher{Dir: dir, Grace: DefaultGrace}).Publish(src)
}

// Publish makes src the content of Dir/rules.yaml atomically. Publishing the content that
// is already live changes nothing on disk (beyond repairing the rules.yaml link and
// removing expired generations). Concurrent publishers, in this process or others, are
// serialised with flock(2) on the directory.
func (p *Publisher) Publish(src []byte) error {
	if p.Dir == "" || !filepath.IsAbs(p.Dir) {
		return fmt.Errorf("publish rules: directory %q must be an absolute path", p.Dir)
	}
	if err := os.MkdirAll(p.Dir, 0o755); err != nil {
		return fmt.Errorf("publish rules: %w", err)
	}
	d, err := os.Open(p.Dir)
	if err != nil {
		return fmt.Errorf("publish rules: %w", err)
	}
	defer d.Close()
	// The daemon runs with a strict umask (the systemd unit's 0077), but the directory
	// is the root of /etc/kl in containers that run as any user: it must be 0755.
	if err := d.Chmod(0o755); err != nil {
		return fmt.Errorf("publish rules: %w", err)
	}
	if err := flock(d); err != nil {
		return fmt.Errorf("publish rules: lock %s: %w", p.Dir, err)
	}
	defer unix.Flock(int(d.Fd()), unix.LOCK_UN)

	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("publish rules: list %s: %w", p.Dir, err)
	}
	if err := CheckEntries(p.Dir, names); err != nil {
		return fmt.Errorf("publish rules: %w", err)
	}
	live, _ := os.Readlink(filepath.Join(p.Dir, DataLink))
	if live != "" && !isGeneration(live) {
		return fmt.Errorf("publish rules: %w: %s points at %q", ErrForeign, filepath.Join(p.Dir, DataLink), live)
	}
	same := false
	if live != "" {
		cur, err := os.ReadFile(filepath.Join(p.Dir, live, FileName))
		same = err == nil && bytes.Equal(cur, src)
	}
	if !same {
		gen, err := p.writeGeneration(src, names)
		if err != nil {
			return err
		}
		if err := swapLink(p.Dir, tmpLink, DataLink, gen); err != nil {
			os.RemoveAll(filepath.Join(p.Dir, gen))
			return fmt.Errorf("publish rules: %w", err)
		}
		live = gen
	}
	if err := ensureFileLink(p.Dir); err != nil {
		return fmt.Errorf("publish rules: %w", err)
	}
	return p.prune(names, live)
}

// writeGeneration writes src into a fresh generation directory and returns its name. Names
// only ever grow, even when the clock went back, so they sort in creation order (prune
// relies on it); after a clock jump back, old generations just wait out the jump.
// Nothing is fsynced: the directory lives on tmpfs (/run) and the daemon publishes again
// after every start, so a crash can at worst leave a generation the next start replaces.
func (p *Publisher) writeGeneration(src []byte, existing []string) (string, error) {
	now := time.Now
	if p.now != nil {
		now = p.now
	}
	t := now().UTC()
	for _, n := range existing {
		if isGeneration(n) {
			if nt, _ := time.Parse(genLayout, n); !nt.Before(t) {
				t = nt.Add(time.Nanosecond)
			}
		}
	}
	var gen string
	for i := 0; ; i++ {
		gen = t.Add(time.Duration(i)).Format(genLayout)
		err := os.Mkdir(filepath.Join(p.Dir, gen), 0o755)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) || i >= 1000 {
			return "", fmt.Errorf("publish rules: new generation: %w", err)
		}
	}
	dir := filepath.Join(p.Dir, gen)
	fail := func(err error) (string, error) {
		os.RemoveAll(dir)
		return "", fmt.Errorf("publish rules: write %s: %w", dir, err)
	}
	// MkdirAll and Mkdir are subject to the umask: set the modes explicitly, since
	// containers run as any user and must be able to read the rules.
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, FileName), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fail(err)
	}
	_, err = f.Write(src)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	return gen, nil
}

// swapLink points dir/name at target atomically: a temporary symlink renamed over it.
func swapLink(dir, tmp, name, target string) error {
	tp := filepath.Join(dir, tmp)
	if err := os.Remove(tp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Symlink(target, tp); err != nil {
		return err
	}
	if err := os.Rename(tp, filepath.Join(dir, name)); err != nil {
		os.Remove(tp)
		return err
	}
	return nil
}

// ensureFileLink makes dir/rules.yaml the symlink ..data/rules.yaml, replacing atomically
// whatever else is there (a plain file left by an older layout).
func ensureFileLink(dir string) error {
	want := filepath.Join(DataLink, FileName)
	if got, err := os.Readlink(filepath.Join(dir, FileName)); err == nil && got == want {
		return nil
	}
	return swapLink(dir, tmpLink, FileName, want)
}

// prune removes generations that are out of service for longer than the grace period. A
// generation leaves service when its successor is created; the successor's creation time
// is read from its name (the names sort chronologically).
func (p *Publisher) prune(names []string, live string) error {
	gens := []string{}
	for _, n := range names {
		if isGeneration(n) && n != live {
			gens = append(gens, n)
		}
	}
	if len(gens) == 0 {
		return nil
	}
	gens = append(gens, live)
	slices.Sort(gens) // the layout sorts chronologically
	now := time.Now
	if p.now != nil {
		now = p.now
	}
	var errs []error
	for i, g := range gens[:len(gens)-1] {
		if g == live {
			continue
		}
		retired, _ := time.Parse(genLayout, gens[i+1])
		if p.Grace > 0 && now().Sub(retired) < p.Grace {
			continue
		}
		if err := os.RemoveAll(filepath.Join(p.Dir, g)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("publish rules: remove old generations: %w", err)
	}
	return nil
}

// Read returns the live content of a published-rules directory.
func Read(dir string) ([]byte, error) {
	return os.ReadFile(filepath.Join(dir, FileName))
}

// Check reports whether dir is a published-rules directory that is safe to mount into a
// container: it holds only kl's own entries and a readable rules.yaml link into the live
// generation. A missing directory gives an error wrapping os.ErrNotExist.
func Check(dir string) error {
	names, err := readNames(dir)
	if err != nil {
		return err
	}
	if err := CheckEntries(dir, names); err != nil {
		return err
	}
	link := filepath.Join(dir, FileName)
	got, err := os.Readlink(link)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrForeign, link, err)
	}
	if got != filepath.Join(DataLink, FileName) {
		return fmt.Errorf("%w: %s points at %q, not %s", ErrForeign, link, got, filepath.Join(DataLink, FileName))
	}
	live, err := os.Readlink(filepath.Join(dir, DataLink))
	if err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	if !isGeneration(live) {
		return fmt.Errorf("%w: %s points at %q", ErrForeign, filepath.Join(dir, DataLink), live)
	}
	fi, err := os.Stat(link)
	if err != nil {
		return fmt.Errorf("%s: %w", link, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w: %s is %s, not a regular file", ErrForeign, link, fi.Mode().Type())
	}
	return nil
}

func readNames(dir string) ([]string, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%w: %s is not a directory", ErrForeign, dir)
	}
	return d.Readdirnames(-1)
}

// CheckEntries refuses a directory listing with anything other than kl's own entries:
// rules.yaml, ..data, ..data_tmp and generations.
func CheckEntries(dir string, names []string) error {
	var foreign []string
	for _, n := range names {
		if n == FileName || n == DataLink || n == tmpLink || isGeneration(n) {
			continue
		}
		foreign = append(foreign, n)
	}
	if len(foreign) > 0 {
		slices.Sort(foreign)
		if len(foreign) > 5 {
			foreign = append(foreign[:5], "…")
		}
		return fmt.Errorf("%w: %s also holds %s", ErrForeign, dir, strings.Join(foreign, ", "))
	}
	return nil
}

func isGeneration(name string) bool {
	if len(name) != len(genLayout) || !strings.HasPrefix(name, "..") {
		return false
	}
	_, err := time.Parse(genLayout, name)
	return err == nil
}

func flock(d *os.File) error {
	for {
		err := unix.Flock(int(d.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
