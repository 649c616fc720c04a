// Package registry persists kl-relayd's workload registrations under its state directory,
// one JSON file per workload, so that a restarted daemon can reopen its listeners in every
// pod netns that still exists.
//
// It is not the live set of listeners (package relay) and does not decide whether a
// netns is still alive: it stores what it is given, with the netns identity (device and
// inode) the daemon recorded, and hands it back.
package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/kl-egress/kl/relayd/api"
)

// Entry is one persisted registration.
type Entry struct {
	Registration api.Registration `json:"registration"`
	// NetnsDev and NetnsIno identify the netns the listeners were opened in, so a restart
	// can tell "the same netns" from "a new netns at the same path" (or a reused PID).
	NetnsDev uint64 `json:"netnsDev"`
	NetnsIno uint64 `json:"netnsIno"`
}

// validID is what a workload id may look like: the CNI container id rule, bounded so
// that its file name, id + ".json", fits in a directory entry (255 bytes). Container and
// sandbox ids are 64 characters.
var validID = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]{0,249}$`)

// CheckID returns an error unless id can be a registration key (and a file name).
func CheckID(id string) error {
	if !validID.MatchString(id) {
		return fmt.Errorf("workload id %q: want 1-250 characters of letters, digits, '_', '.', '-', starting with a letter or digit", id)
	}
	return nil
}

// CheckWorkload returns an error unless wl is a workload the daemon can serve: an id
// CheckID accepts, an absolute netns path, the transparent or proxy mode. The daemon
// checks every registration it is sent with it, and Load every one it restores, so a
// store file edited by hand or corrupted cannot slip past what the API refuses.
func CheckWorkload(wl api.Workload) error {
	if err := CheckID(wl.ID); err != nil {
		return err
	}
	if wl.Netns == "" || !filepath.IsAbs(wl.Netns) {
		return fmt.Errorf("workload %s: netns %q is not an absolute path", wl.ID, wl.Netns)
	}
	switch wl.Mode {
	case api.ModeTransparent, api.ModeProxy:
	default:
		return fmt.Errorf("workload %s: mode %q is not %s or %s", wl.ID, wl.Mode, api.ModeTransparent, api.ModeProxy)
	}
	return nil
}

// Store is a directory of registrations. Its methods are safe for concurrent use on
// distinct ids; the daemon serialises calls for one id.
type Store struct {
	dir string
}

const suffix = ".json"

// Open creates (if needed) and opens the store in dir/workloads.
func Open(stateDir string) (*Store, error) {
	dir := filepath.Join(stateDir, "workloads")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open registry: %w", err)
	}
	return &Store{dir: dir}, nil
}

// Dir is where the entries live.
func (s *Store) Dir() string { return s.dir }

// Put writes an entry atomically (write a temporary file, rename), refusing one that Load
// would refuse (CheckWorkload). It does not fsync: registrations must survive a restart
// of the daemon, which the page cache guarantees, not a reboot, after which every netns
// they name is gone anyway. Skipping the sync keeps it off the sandbox-creation path.
func (s *Store) Put(e Entry) error {
	id := e.Registration.Workload.ID
	if err := CheckWorkload(e.Registration.Workload); err != nil {
		return fmt.Errorf("persist registration: %w", err)
	}
	data, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("persist registration %s: %w", id, err)
	}
	f, err := os.CreateTemp(s.dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("persist registration %s: %w", id, err)
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("persist registration %s: %w", id, err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, id+suffix)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("persist registration %s: %w", id, err)
	}
	return nil
}

// Delete removes an entry; removing an absent one is not an error.
func (s *Store) Delete(id string) error {
	if err := CheckID(id); err != nil {
		return fmt.Errorf("delete registration: %w", err)
	}
	if err := os.Remove(filepath.Join(s.dir, id+suffix)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete registration %s: %w", id, err)
	}
	return nil
}

// Load returns every readable entry sorted by id. Entries that cannot be read or decoded,
// or whose workload the API would refuse (CheckWorkload) or whose id is not the one the
// file's name says, are returned as errors (one per file, naming it) and left in place
// for an operator to inspect; leftover temporary files from an interrupted Put are
// removed.
func (s *Store) Load() ([]Entry, []error) {
	des, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, []error{fmt.Errorf("read registry %s: %w", s.dir, err)}
	}
	var out []Entry
	var errs []error
	for _, de := range des {
		name := de.Name()
		p := filepath.Join(s.dir, name)
		if strings.HasPrefix(name, ".tmp-") {
			os.Remove(p)
			continue
		}
		if !strings.HasSuffix(name, suffix) || de.IsDir() {
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("read registration %s: %w", p, err))
			continue
		}
		var e Entry
		if err := json.Unmarshal(data, &e); err != nil {
			errs = append(errs, fmt.Errorf("decode registration %s: %w", p, err))
			continue
		}
		if err := CheckWorkload(e.Registration.Workload); err != nil {
			errs = append(errs, fmt.Errorf("registration %s: %w", p, err))
			continue
		}
		if id := e.Registration.Workload.ID; id+suffix != name {
			errs = append(errs, fmt.Errorf("registration %s holds id %q, not the one its name says", p, id))
			continue
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Registration.Workload.ID < out[j].Registration.Workload.ID })
	return out, errs
}
