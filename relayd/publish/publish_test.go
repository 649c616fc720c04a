package publish

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func generations(t *testing.T, dir string) []string {
	t.Helper()
	names, err := readNames(dir)
	if err != nil {
		t.Fatal(err)
	}
	var gens []string
	for _, n := range names {
		if isGeneration(n) {
			gens = append(gens, n)
		}
	}
	slices.Sort(gens)
	return gens
}

func TestPublishLayout(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "kl", "rules")
	src := []byte("default: direct\n")
	if err := Publish(dir, src); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(dir); err != nil || !bytes.Equal(got, src) {
		t.Fatalf("Read = %q, %v; want %q", got, err, src)
	}
	if err := Check(dir); err != nil {
		t.Fatalf("Check: %v", err)
	}
	link, err := os.Readlink(filepath.Join(dir, FileName))
	if err != nil || link != "..data/rules.yaml" {
		t.Fatalf("rules.yaml -> %q, %v", link, err)
	}
	data, err := os.Readlink(filepath.Join(dir, DataLink))
	if err != nil || !isGeneration(data) || !strings.HasPrefix(data, "..20") {
		t.Fatalf("..data -> %q, %v", data, err)
	}
	for path, want := range map[string]os.FileMode{
		dir:                                0o755 | os.ModeDir,
		filepath.Join(dir, data):           0o755 | os.ModeDir,
		filepath.Join(dir, data, FileName): 0o644,
	} {
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, %v; want %v", path, fi.Mode(), err, want)
		}
	}
	names, _ := readNames(dir)
	slices.Sort(names)
	if want := []string{data, DataLink, FileName}; !slices.Equal(names, want) {
		t.Errorf("entries %q, want %q", names, want)
	}
}

// TestPublishUmask: under kl-relayd's systemd umask (0077) every entry containers
// traverse is still readable by any user.
func TestPublishUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := filepath.Join(t.TempDir(), "rules")
	if err := Publish(dir, []byte("default: direct\n")); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{
		dir:                          0o755,
		filepath.Join(dir, DataLink): 0o755, // the generation it points at
		filepath.Join(dir, FileName): 0o644,
	} {
		fi, err := os.Stat(p)
		if err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode %v, %v; want %v", p, fi.Mode(), err, want)
		}
	}
}

func TestPublishIdempotent(t *testing.T) {
	dir := t.TempDir()
	src := []byte("default: proxy\n")
	for range 3 {
		if err := Publish(dir, src); err != nil {
			t.Fatal(err)
		}
	}
	if gens := generations(t, dir); len(gens) != 1 {
		t.Fatalf("identical content made %d generations: %q", len(gens), gens)
	}
	// A lost rules.yaml link is repaired without a new generation.
	os.Remove(filepath.Join(dir, FileName))
	if err := Publish(dir, src); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(dir); err != nil || !bytes.Equal(got, src) {
		t.Fatalf("after repair Read = %q, %v", got, err)
	}
	if gens := generations(t, dir); len(gens) != 1 {
		t.Fatalf("repair made %d generations", len(gens))
	}
}

func TestPublishReplacesPlainFile(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, FileName), []byte("old plain file\n"), 0o644)
	if err := Publish(dir, []byte("default: deny\n")); err != nil {
		t.Fatal(err)
	}
	if err := Check(dir); err != nil {
		t.Fatal(err)
	}
	if got, _ := Read(dir); string(got) != "default: deny\n" {
		t.Fatalf("Read = %q", got)
	}
}

func TestPrune(t *testing.T) {
	tests := []struct {
		name  string
		grace time.Duration
		step  time.Duration // clock advance between publishes
		want  int           // generations left after the last publish
	}{
		{"no grace removes at once", 0, time.Millisecond, 1},
		{"within grace keeps them", time.Minute, time.Second, 4},
		{"expired ones go, the last retired stays", 2 * time.Second, 3 * time.Second, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			clock := time.Date(2026, 11, 30, 5, 40, 0, 0, time.UTC)
			p := &Publisher{Dir: dir, Grace: tt.grace, now: func() time.Time { return clock }}
			for i := range 4 {
				if err := p.Publish(fmt.Appendf(nil, "# %d\ndefault: direct\n", i)); err != nil {
					t.Fatal(err)
				}
				clock = clock.Add(tt.step)
			}
			gens := generations(t, dir)
			if len(gens) != tt.want {
				t.Fatalf("%d generations %q, want %d", len(gens), gens, tt.want)
			}
			live, _ := os.Readlink(filepath.Join(dir, DataLink))
			if gens[len(gens)-1] != live {
				t.Fatalf("newest generation %s is not live (%s)", gens[len(gens)-1], live)
			}
			if got, _ := Read(dir); string(got) != "# 3\ndefault: direct\n" {
				t.Fatalf("Read = %q", got)
			}
		})
	}
}

// TestClockBack: after the clock went back, a new generation is still named after the
// live one, so it sorts as the newest and the live link and pruning stay right.
func TestClockBack(t *testing.T) {
	dir := t.TempDir()
	clock := time.Date(2026, 11, 30, 5, 40, 0, 0, time.UTC)
	p := &Publisher{Dir: dir, now: func() time.Time { return clock }}
	for i, step := range []time.Duration{0, -time.Hour, time.Second} {
		clock = clock.Add(step)
		if err := p.Publish(fmt.Appendf(nil, "# %d\n", i)); err != nil {
			t.Fatal(err)
		}
		gens := generations(t, dir)
		live, _ := os.Readlink(filepath.Join(dir, DataLink))
		if len(gens) != 1 || gens[0] != live {
			t.Fatalf("publish %d: generations %q, live %s; want only the live one", i, gens, live)
		}
	}
	if got, _ := Read(dir); string(got) != "# 2\n" {
		t.Fatalf("Read = %q", got)
	}
}

func TestForeignDirectory(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "relayd.yaml")
	os.WriteFile(secret, []byte("upstream: http://user:pw@proxy:3128\n"), 0o600)
	err := Publish(dir, []byte("default: direct\n"))
	if !errors.Is(err, ErrForeign) || !strings.Contains(err.Error(), "relayd.yaml") {
		t.Fatalf("Publish into a directory with relayd.yaml: %v, want ErrForeign naming it", err)
	}
	names, _ := readNames(dir)
	if len(names) != 1 {
		t.Fatalf("Publish wrote into a foreign directory: %q", names)
	}
	if err := Check(dir); !errors.Is(err, ErrForeign) {
		t.Fatalf("Check: %v, want ErrForeign", err)
	}
}

func TestCheck(t *testing.T) {
	good := func(t *testing.T) string {
		dir := t.TempDir()
		if err := Publish(dir, []byte("default: direct\n")); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	tests := []struct {
		name    string
		setup   func(t *testing.T) string
		foreign bool
		missing bool
	}{
		{"published", good, false, false},
		{"missing", func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope") }, false, true},
		{"empty", func(t *testing.T) string { return t.TempDir() }, true, false},
		{"plain file", func(t *testing.T) string {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, FileName), []byte("x"), 0o644)
			return dir
		}, true, false},
		{"not a directory", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "f")
			os.WriteFile(p, []byte("x"), 0o644)
			return p
		}, true, false},
		{"data escapes", func(t *testing.T) string {
			dir := good(t)
			os.Remove(filepath.Join(dir, DataLink))
			os.Symlink("/etc", filepath.Join(dir, DataLink))
			return dir
		}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(tt.setup(t))
			switch {
			case tt.missing && !errors.Is(err, os.ErrNotExist):
				t.Fatalf("Check = %v, want ErrNotExist", err)
			case tt.foreign && !errors.Is(err, ErrForeign):
				t.Fatalf("Check = %v, want ErrForeign", err)
			case !tt.missing && !tt.foreign && err != nil:
				t.Fatalf("Check = %v", err)
			}
		})
	}
}

// content returns a distinctive file of about 64 KiB whose last line is the checksum of
// the rest, so a torn read is detectable.
func content(i int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# generation %d\ndefault: direct\nrules:\n", i)
	for j := 0; b.Len() < 64<<10; j++ {
		fmt.Fprintf(&b, "  - {match: {domain: host-%d-%d.example.com}, exit: proxy}\n", i, j)
	}
	sum := sha256.Sum256(b.Bytes())
	fmt.Fprintf(&b, "# sha256 %x\n", sum)
	return b.Bytes()
}

func complete(b []byte) bool {
	i := bytes.LastIndex(b, []byte("# sha256 "))
	if i < 0 {
		return false
	}
	sum := sha256.Sum256(b[:i])
	return string(b[i:]) == fmt.Sprintf("# sha256 %x\n", sum)
}

func TestReadersDuringSwaps(t *testing.T) {
	dir := t.TempDir()
	const swaps = 300
	versions := make([][]byte, swaps)
	for i := range versions {
		versions[i] = content(i)
	}
	if err := Publish(dir, versions[0]); err != nil {
		t.Fatal(err)
	}
	var (
		stop          atomic.Bool
		reads, failed atomic.Int64
		wg            sync.WaitGroup
		mu            sync.Mutex
		problems      []string
	)
	path := filepath.Join(dir, FileName)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(30 * time.Second)
			for !stop.Load() && time.Now().Before(deadline) {
				b, err := os.ReadFile(path)
				reads.Add(1)
				if err == nil && complete(b) {
					continue
				}
				failed.Add(1)
				mu.Lock()
				if len(problems) < 5 {
					problems = append(problems, fmt.Sprintf("read %d bytes, err %v", len(b), err))
				}
				mu.Unlock()
			}
		}()
	}
	for i := 1; i < swaps; i++ {
		if err := Publish(dir, versions[i]); err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of %d reads saw no complete file: %q", failed.Load(), reads.Load(), problems)
	}
	if reads.Load() < swaps {
		t.Logf("only %d reads during %d swaps", reads.Load(), swaps)
	}
	if got, _ := Read(dir); !bytes.Equal(got, versions[swaps-1]) {
		t.Fatal("final content is not the last published")
	}
	t.Logf("%d reads during %d swaps, all complete; %d generations left", reads.Load(), swaps, len(generations(t, dir)))
}

func TestConcurrentPublishers(t *testing.T) {
	dir := t.TempDir()
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				errs <- (&Publisher{Dir: dir}).Publish(content(w*100 + i))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := Check(dir); err != nil {
		t.Fatal(err)
	}
	if got, _ := Read(dir); !complete(got) {
		t.Fatal("torn final content")
	}
	if gens := generations(t, dir); len(gens) != 1 {
		t.Fatalf("grace 0 left %d generations", len(gens))
	}
}

func TestPublishBadDir(t *testing.T) {
	for _, dir := range []string{"", "relative/rules"} {
		if err := Publish(dir, []byte("x")); err == nil || !strings.Contains(err.Error(), "absolute") {
			t.Errorf("Publish(%q) = %v, want an absolute-path error", dir, err)
		}
	}
}
