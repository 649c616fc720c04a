package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/rules/pac"
)

// watchRules reloads the rules when the file's content changes. It polls the content at
// cfg.RulesPoll, and also wakes on change notifications for the file's directory and, when
// the path is a symlink, for the directories along its links: Kubernetes ConfigMap volumes
// swap a `..data` symlink, which a watch on the file itself would never see, and each swap
// moves the content to a new directory, so the watched set is worked out again after
// every check. Comparing content (not events or times) makes both paths agree and a touch
// without a change a no-op. A bad or unreadable file is reported once, not at every poll,
// until its content (or why it cannot be read) changes.
func (d *Daemon) watchRules(ctx context.Context) {
	var (
		events <-chan fsnotify.Event
		errs   <-chan error
		w      *fsnotify.Watcher
	)
	watched := map[string]bool{}
	if nw, err := fsnotify.NewWatcher(); err != nil {
		d.log.Warn("rules: no change notifications, polling only", "err", err)
	} else {
		w = nw
		defer w.Close()
		events, errs = w.Events, w.Errors
	}
	rewatch := func() {
		if w == nil {
			return
		}
		want := watchDirs(d.cfg.Rules)
		for dir := range watched {
			if !want[dir] {
				_ = w.Remove(dir) // gone with an old ConfigMap version, or no longer on the path
				delete(watched, dir)
			}
		}
		for dir := range want {
			if watched[dir] {
				continue
			}
			if err := w.Add(dir); err != nil {
				d.log.Debug("rules: cannot watch directory; polling covers it", "dir", dir, "err", err)
				continue
			}
			watched[dir] = true
		}
	}
	rewatch()
	t := time.NewTicker(d.cfg.RulesPoll)
	defer t.Stop()
	lastBad := ""
	limit := int64(rules.MaxFileBytes)
	if d.cfg.PAC != "" {
		limit = pac.MaxScriptBytes
	}
	check := func() {
		defer rewatch()
		// Bounded: a file grown past what loads is refused by the reload below, not read
		// whole (it could take the daemon's memory, and the rules with it).
		data, err := rules.ReadFile(d.cfg.Rules, limit)
		if err != nil {
			if key := "unreadable: " + err.Error(); key != lastBad {
				if d.Reload() != nil {
					lastBad = key
				}
			}
			return
		}
		if d.cfg.PAC != "" {
			data = rules.ScriptSource(data, d.cfg.RouteDefault) // what the live policy's hash covers
		}
		h := sha256.Sum256(data)
		sum := hex.EncodeToString(h[:])
		if sum == d.policy.Load().Hash() {
			if lastBad != "" {
				// Back to the live content: reload once so status drops the stale error.
				lastBad = ""
				_ = d.Reload()
			}
			return
		}
		if sum == lastBad {
			return
		}
		if err := d.Reload(); err != nil {
			lastBad = sum
		} else {
			lastBad = ""
		}
	}
	// A change made between the load at start and the watches going in has no event:
	// look once now that they are in.
	check()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check()
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			// Writers often truncate then write: let the burst settle.
			time.Sleep(20 * time.Millisecond)
			check()
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			// An overflowed event queue lost notifications: look now rather than at the
			// next poll. Read, so fsnotify's reader never blocks on this channel.
			d.log.Debug("rules: change notifications reported an error; checking the file", "err", err)
			check()
		}
	}
}

// watchDirs is the set of directories whose changes can change what path reads, each by
// its resolved name: the file's own directory, the directory of each symlink's target on
// the way to the file (rules.yaml -> /etc/kl-cm/rules.yaml, a ConfigMap's
// rules.yaml -> ..data/rules.yaml), and the one the file resolves to (..data ->
// ..2026_12_01_…, a new directory at every swap).
func watchDirs(path string) map[string]bool {
	dirs := map[string]bool{}
	add := func(dir string) {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
		dirs[dir] = true
	}
	add(filepath.Dir(path))
	cur := path
	for range 16 { // bounded: a symlink loop ends here
		target, err := os.Readlink(cur)
		if err != nil {
			break
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(cur), target)
		}
		add(filepath.Dir(target))
		cur = target
	}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		add(filepath.Dir(real))
	}
	return dirs
}
