package hook

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/kl-egress/kl/atomicfile"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/shim/config"
)

// Containers that share a network namespace (`docker run --network container:A`, or any
// spec whose network namespace is another container's /proc/PID/ns/net) share the relay
// registration of the first one: kl-relayd serves a netns under one id. A share record
// (one JSON file per such registration, in SharesDir) lists the containers using it, so
// that poststop deregisters only when the last of them is gone, and moves the
// registration's netns path to a container still running when the one it named exits
// (kl-relayd drops a registration whose netns path disappears).
//
// A registration nobody shares has no record: its container's poststop deregisters it as
// before. Create and Delete hold an exclusive lock on the directory while they decide.

// SharesDir is where kl-hook keeps its share records: "hook" beside the relay's socket
// (/run/kl/hook by default), on the same tmpfs, so a reboot clears them with the netns.
func SharesDir(cfg *config.Config) string {
	return filepath.Join(filepath.Dir(cfg.RelaySocket), "hook")
}

// share is the record of one registration that several containers use.
type share struct {
	// Workload is the registration as the hook last made it: what it re-registers with
	// when the netns path it names is gone.
	Workload api.Workload `json:"workload"`
	Members  []member     `json:"members"`
}

// member is one container using a shared registration: the netns's device and inode as
// seen through its pid when it joined, so a reused pid is not taken for it.
type member struct {
	ID  string `json:"id"`
	Pid int    `json:"pid"`
	Dev uint64 `json:"dev"`
	Ino uint64 `json:"ino"`
}

func nsPathOf(pid int) string { return procRoot + "/" + strconv.Itoa(pid) + "/ns/net" }

// pidOf is the pid of a netns path the hook registers (procRoot/PID/ns/net), 0 for any
// other path.
func pidOf(nsPath string) int {
	s, ok := strings.CutPrefix(nsPath, procRoot+"/")
	if !ok {
		return 0
	}
	if s, ok = strings.CutSuffix(s, "/ns/net"); !ok {
		return 0
	}
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

func memberOf(id string, pid int) (member, error) {
	dev, ino, err := nsID(nsPathOf(pid))
	if err != nil {
		return member{}, fmt.Errorf("network namespace of pid %d: %w", pid, err)
	}
	return member{ID: id, Pid: pid, Dev: dev, Ino: ino}, nil
}

// alive reports whether m's pid still has the netns it joined with.
func (m member) alive() bool {
	dev, ino, err := nsID(nsPathOf(m.Pid))
	return err == nil && dev == m.Dev && ino == m.Ino
}

func sharePath(dir, regID string) string { return filepath.Join(dir, regID+".json") }

func loadShare(dir, regID string) (share, bool, error) {
	var s share
	data, err := os.ReadFile(sharePath(dir, regID))
	if errors.Is(err, os.ErrNotExist) {
		return s, false, nil
	}
	if err != nil {
		return s, false, fmt.Errorf("share record: %w", err)
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, false, fmt.Errorf("share record %s: %w", sharePath(dir, regID), err)
	}
	return s, true, nil
}

// saveShare replaces the record atomically (a reader never sees half of it).
func saveShare(dir, regID string, s share) error {
	data, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("share record: %w", err)
	}
	if err := atomicfile.Write(sharePath(dir, regID), data, 0o600, nil); err != nil {
		return fmt.Errorf("share record: %w", err)
	}
	return nil
}

func removeShare(dir, regID string) error {
	if err := os.Remove(sharePath(dir, regID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("share record: %w", err)
	}
	return nil
}

// findShare returns the record container id takes part in: the one of its own
// registration, else the one that lists it. A record that does not decode is logged and
// skipped, unless it is the container's own.
func findShare(dir, id string, log *slog.Logger) (regID string, s share, ok bool, err error) {
	if s, ok, err := loadShare(dir, id); ok || err != nil {
		return id, s, ok, err
	}
	err = eachShare(dir, log, func(name string, r share) bool {
		if slices.ContainsFunc(r.Members, func(m member) bool { return m.ID == id }) {
			regID, s, ok = name, r, true
			return false
		}
		return true
	})
	return regID, s, ok, err
}

// pruneShares removes the records none of whose members runs any more: their containers
// all ended without a poststop (a shim killed with them, a node agent that never deleted
// them), so no poststop would ever remove them. A poststop that still comes finds no
// record and deregisters as for a netns nobody shares. The directory's lock is held.
func pruneShares(dir string, log *slog.Logger) {
	_ = eachShare(dir, log, func(regID string, s share) bool {
		if slices.ContainsFunc(s.Members, member.alive) {
			return true
		}
		if err := removeShare(dir, regID); err != nil {
			log.Warn("share record of ended containers not removed", "registered_id", regID, "err", err)
		} else {
			log.Info("share record removed: none of its containers runs any more", "registered_id", regID)
		}
		return true
	})
}

// eachShare calls f with each record in dir (by registration id) until f returns false.
// A record that does not decode is logged and skipped.
func eachShare(dir string, log *slog.Logger, f func(regID string, s share) bool) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("share records: %w", err)
	}
	for _, e := range ents {
		name, isRecord := strings.CutSuffix(e.Name(), ".json")
		if !isRecord || strings.HasPrefix(name, ".") {
			continue
		}
		s, found, err := loadShare(dir, name)
		if err != nil {
			log.Warn("share record unreadable; skipped", "err", err)
			continue
		}
		if found && !f(name, s) {
			return nil
		}
	}
	return nil
}
