package daemon

import (
	"fmt"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/fastpath"
)

// Capture tables the daemon installs itself: kl-cni registers a transparent sandbox with
// its capture configuration (api.Workload.Capture) instead of programming the netns in
// its own short-lived process. The table goes in before the listeners open, as when the
// plugin installed it, and with the kernel fast path in the same transaction as the
// pod's kernel decisions (one table write per ADD instead of two). At deregistration the
// daemon removes the table it installed; kl-cni DEL removes it itself when the daemon does
// not say it did (the daemon is down, or the registration is unknown).

// wantsCapture says whether a registration asks the daemon to install its table.
func wantsCapture(w api.Workload) bool {
	return w.Capture != nil && w.Mode == api.ModeTransparent
}

// installCapture installs w's capture table (d.mu held). fast reports that the kernel
// fast path installed it with the pod's decisions and watches the pod: the caller then
// skips fastRegister. When the fast path fails the plain capture goes in and the fast
// path is left to fastRegister's retries, as for a table kl-cni installed.
func (d *Daemon) installCapture(w api.Workload) (fast bool, err error) {
	c := captureOf(w.Capture)
	if d.fast != nil {
		err := d.fast.Add(fastpath.Pod{ID: w.ID, Netns: w.Netns, Labels: w.Labels, Image: w.Image, Capture: &c}, d.policy.Load())
		if err == nil {
			return true, nil
		}
		d.log.Info("kernel fast path not installed with the capture; installing the plain capture", "workload", w.ID, "err", err)
	}
	if err := netns.Install(w.Netns, c); err != nil {
		return false, fmt.Errorf("workload %s: %w", w.ID, err)
	}
	return false, nil
}

// removeCapture removes w's capture table (d.mu held, listeners closed). A netns that is
// gone counts as removed; on any other failure the caller (kl-cni DEL) tries itself.
func (d *Daemon) removeCapture(w api.Workload) bool {
	if err := netns.Remove(w.Netns); err != nil {
		d.log.Warn("capture table not removed; kl-cni removes it", "workload", w.ID, "err", err)
		return false
	}
	return true
}

// captureOf is the capture table a registration asks for.
func captureOf(wc *api.Capture) netns.Capture {
	return netns.Capture{
		RedirectPort: wc.RedirectPort,
		Mark:         wc.Mark,
		IPv6:         wc.IPv6,
		RejectQUIC:   wc.RejectQUIC,
		ExcludeCIDRs: wc.ExcludeCIDRs,
		ExcludePorts: wc.ExcludePorts,
	}
}
