package daemon

import (
	"errors"
	"strings"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/publish"
	"github.com/kl-egress/kl/rules"
)

// Reload loads the rules file again. On success the new policy replaces the live one
// atomically (flows already decided keep going; new flows use the new rules) and one load
// event is logged; on failure the live rules stay and the reason, with its code, shows in
// Status and the log. It is what SIGHUP and POST /v1/reload do; the file watcher of the
// next issue calls it too. Reloads run one at a time, each reading the file when it
// starts: SIGHUP, the API and the watcher can ask at once, and a slow load of older
// content finishing last must not replace newer rules or leave a stale error in status.
func (d *Daemon) Reload() error {
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	p, err := loadRules(d.cfg)
	now := time.Now().UTC()
	d.rulesMu.Lock()
	defer d.rulesMu.Unlock()
	if err != nil {
		d.rules.LastError = d.refusedText(err)
		d.rules.LastErrorCode = errCode(err)
		d.rules.LastErrorAt = now
		code := d.rules.LastErrorCode
		if code == "" {
			code = "unknown"
		}
		d.metrics.Reloaded(now, code)
		d.log.Error("rules reload failed; the previous rules stay live", "path", d.cfg.Rules, "code", d.rules.LastErrorCode, "err", err)
		return err
	}
	d.fallback = false
	old := d.policy.Swap(p)
	d.publishRules(p)
	d.metrics.Reloaded(now, "")
	d.rules = api.RulesStatus{Path: d.cfg.Rules, Hash: p.Hash(), LoadedAt: now}
	if old != nil && old.Hash() == p.Hash() {
		// The same rules: only workloads whose table swap failed before need them.
		d.fastRepair()
		return nil
	}
	d.log.Info("rules loaded", "path", d.cfg.Rules, "hash", p.Hash())
	d.hitsSince = now
	d.audit.ResetHits() // rule numbers name other rules from now on
	if d.fast != nil {
		d.fast.ResetHits()
	}
	d.attachReload()
	d.fastReload()
	return nil
}

// errText is a rules load error for status, which shows its reason code (errCode) and
// the file's path beside it: a rules error's own words, rule and line, without either.
func errText(err error) string {
	var re *rules.Error
	if !errors.As(err, &re) {
		return err.Error()
	}
	return strings.TrimPrefix(re.Error(), string(re.Code)+": ")
}

// refusedText is errText for status, saying so when the live rules are not the file's
// at all but the last published ones (d.fallback; under rulesMu).
func (d *Daemon) refusedText(err error) string {
	if d.fallback {
		return errText(err) + " (running the last rules that loaded, from " + d.cfg.PublishedRules + ")"
	}
	return errText(err)
}

// errCode is the reason code of a rules load error ("" when it has none).
func errCode(err error) string {
	var re *rules.Error
	if errors.As(err, &re) {
		return string(re.Code)
	}
	return ""
}

// publishRules hands rules that loaded successfully to running containers (relayd/publish:
// kl-runtime mounts the directory at /etc/kl). Publishing identical content changes
// nothing; a failure is logged and the load stands: containers keep the last published
// rules, never a file that failed to load.
func (d *Daemon) publishRules(p *rules.Policy) {
	if d.cfg.PublishedRules == "-" {
		return
	}
	if err := publish.Publish(d.cfg.PublishedRules, p.Source()); err != nil {
		d.log.Error("rules not published for containers; they keep the previous rules", "dir", d.cfg.PublishedRules, "err", err)
	}
}
