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
)

// watchRules reloads the rules when the file's content changes. It polls the content at
// cfg.RulesPoll, and also wakes on change notifications for the file's directory and, when
// the path is a symlink, for the directory it resolves to: Kubernetes ConfigMap volumes
// swap a `..data` symlink, which a watch on the file itself would never see. Comparing
// content (not events or times) makes both paths agree and a touch without a change a
// no-op. A bad file is reported once, not at every poll, until its content changes again.
func (d *Daemon) watchRules(ctx context.Context) {
	var events <-chan fsnotify.Event
	if w, err := fsnotify.NewWatcher(); err != nil {
		d.log.Warn("rules: no change notifications, polling only", "err", err)
	} else {
		defer w.Close()
		dirs := map[string]bool{filepath.Dir(d.cfg.Rules): true}
		if real, err := filepath.EvalSymlinks(d.cfg.Rules); err == nil {
			dirs[filepath.Dir(real)] = true
		}
		for dir := range dirs {
			if err := w.Add(dir); err != nil {
				d.log.Warn("rules: cannot watch directory, polling only", "dir", dir, "err", err)
			}
		}
		events = w.Events
	}
	t := time.NewTicker(d.cfg.RulesPoll)
	defer t.Stop()
	lastBad := ""
	check := func() {
		data, err := os.ReadFile(d.cfg.Rules)
		sum := ""
		if err == nil && d.cfg.PAC != "" {
			data = rules.ScriptSource(data, d.cfg.RouteDefault) // what the live policy's hash covers
		}
		if err == nil {
			h := sha256.Sum256(data)
			sum = hex.EncodeToString(h[:])
			if sum == d.policy.Load().Hash() {
				if lastBad != "" {
					// Back to the live content: reload once so status drops the stale error.
					lastBad = ""
					_ = d.Reload()
				}
				return
			}
		}
		if sum != "" && sum == lastBad {
			return
		}
		if err := d.Reload(); err != nil {
			lastBad = sum
			if sum == "" {
				lastBad = "unreadable"
			}
		} else {
			lastBad = ""
		}
	}
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
		}
	}
}
