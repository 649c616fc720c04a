package daemon

import (
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/fastpath"
)

// The kernel fast path (package fastpath) of transparent workloads: on registration (and
// restore) the pod's table gets the kernel-decidable part of its policy, a reload swaps
// every pod's table, the reap loop puts back decisions a plain capture reinstall removed
// and those of older rules a failed swap left in place. A failure is logged only: the pod
// keeps the table it had (its plain capture, or the decisions last installed, which the
// reap loop and the next reload replace) and the relay decides every other flow. Callers hold d.mu, so a registration and a reload never
// install plans of different policies out of order.
//
// A workload the fast path does not serve (it is off, or the workload is in proxy mode)
// must not keep kernel decisions either: its table can still carry those of an earlier
// kl-relayd (one that ran with the fast path on before a restart with noFastPath) or of
// its transparent registration before a refresh into proxy mode. Nothing would audit the
// flows they send out, and no reload would change them, so a destination the rules deny
// now would stay reachable. Registration, restore and the reap loop's check put the
// plain capture back in their place (plainCapture).

// fastAdd installs w's kernel decisions under the live policy (w exactly as the relay
// hands it to Decide: labels and image after enrichment), or, when the fast path does
// not serve w, takes any kernel decisions out of its table.
func (d *Daemon) fastAdd(w api.Workload) error {
	if d.fast == nil || w.Mode != api.ModeTransparent {
		err := d.plainCapture(w)
		if d.fast != nil {
			// A refresh into proxy mode. The watcher stops after the decisions are gone, so
			// the flows they decided until then are recorded.
			d.fast.Remove(w.ID)
		}
		return err
	}
	return d.fast.Add(fastpath.Pod{ID: w.ID, Netns: w.Netns, Labels: w.Labels, Image: w.Image}, d.policy.Load())
}

// fastRetry is when a registration whose kernel decisions could not be installed is
// tried once more: the OCI hook registers before it installs the capture, so the first
// attempt finds no table. The reap loop's check tries again after that.
var fastRetry = time.Second

// plainCapture reinstalls the capture underneath w's table, without its kernel
// decisions, if the table carries any (see above). Only the decisions go, in one
// transaction with the rest of the table: the capture is read back from it. A netns
// without a kl table is left alone.
func (d *Daemon) plainCapture(w api.Workload) error {
	marks, err := netns.InstalledMarks(w.Netns)
	if err != nil || len(marks) == 0 {
		return err
	}
	c, err := netns.Installed(w.Netns)
	if err != nil {
		return err
	}
	if c.RedirectPort == 0 {
		c.RedirectPort = d.cfg.RedirectPort // every flow was decided in the kernel
	}
	if err := netns.Install(w.Netns, c); err != nil {
		return err
	}
	d.log.Info("kernel decisions no watcher audits removed from the workload's table; the relay decides its flows", "workload", w.ID, "mode", w.Mode, "fast_path", d.fast != nil)
	return nil
}

// fastRegister is fastAdd on the registration path: an error is logged, never returned.
func (d *Daemon) fastRegister(w api.Workload) {
	err := d.fastAdd(w)
	if err == nil {
		return
	}
	if d.fast == nil || w.Mode != api.ModeTransparent {
		d.log.Warn("kernel decisions not removed from the workload's table; the reap loop tries again", "workload", w.ID, "err", err)
		return
	}
	d.log.Info("kernel fast path not installed yet; the relay decides every flow of the workload", "workload", w.ID, "err", err)
	time.AfterFunc(fastRetry, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		e, ok := d.regs[w.ID]
		if d.fastClosed || !ok || e.Registration.Workload.Netns != w.Netns || e.Registration.Workload.Mode != api.ModeTransparent || d.fast.Verify(w.ID, d.policy.Load()) == nil {
			return
		}
		if err := d.fastAdd(e.Registration.Workload); err != nil {
			d.log.Warn("kernel fast path not installed; the relay decides every flow of the workload", "workload", w.ID, "err", err)
		}
	})
}

func (d *Daemon) fastRemove(id string) {
	if d.fast != nil {
		d.fast.Remove(id)
	}
}

// fastReload swaps every registered pod's table to the live policy.
func (d *Daemon) fastReload() {
	if d.fast == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.fast.Reload(d.policy.Load()); err != nil {
		d.log.Error("kernel fast path reload: the previous tables stay for these workloads until the reap loop or the next reload installs them", "err", err)
	}
}

// fastRepair installs the live policy's decisions for the workloads a failed install
// left on older ones (a reload that found the rules unchanged: nothing else to swap).
func (d *Daemon) fastRepair() {
	if d.fast == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, id := range d.fast.Stale(d.policy.Load()) {
		e, ok := d.regs[id]
		if !ok || e.Registration.Workload.Mode != api.ModeTransparent {
			continue
		}
		if err := d.fastAdd(e.Registration.Workload); err != nil {
			d.log.Warn("kernel decisions of the live rules not installed; the workload keeps its previous table", "workload", id, "err", err)
		} else {
			d.log.Info("kernel decisions installed again", "workload", id)
		}
	}
}

// fastVerify checks every transparent workload's table (d.mu held) and installs the
// kernel decisions again where they are missing, changed or not the live policy's: a
// kl-cni ADD or CHECK, or an OCI hook that installed the capture after registering, left
// the plain capture, or a reload's table swap failed. The tables of workloads the fast
// path does not serve lose any kernel decisions they still carry.
//
// The workloads in grace are skipped: their netns path has gone, and the sweep keeps
// them for an interval in case their netns lives on under another path (sweep). There is
// no table to read or install under that path, and adding them again would stop the
// watcher of a netns whose table still decides flows.
func (d *Daemon) fastVerify(grace map[string]bool) {
	for id, e := range d.regs {
		w := e.Registration.Workload
		if grace[id] {
			continue
		}
		if d.fast == nil || w.Mode != api.ModeTransparent {
			if err := d.plainCapture(w); err != nil {
				d.log.Debug("kernel decisions not removed from the workload's table", "workload", id, "err", err)
			}
			continue
		}
		err := d.fast.Verify(id, d.policy.Load())
		if err == nil {
			continue
		}
		d.log.Debug("kernel decisions missing or changed; installing them again", "workload", id, "err", err)
		if err := d.fastAdd(w); err != nil {
			d.log.Debug("kernel fast path not installed", "workload", id, "err", err)
		} else {
			d.log.Info("kernel decisions installed again", "workload", id)
		}
	}
}

func (d *Daemon) fastClose() {
	if d.fast != nil {
		d.mu.Lock()
		d.fastClosed = true
		d.mu.Unlock()
		_ = d.fast.Close()
	}
}

// fastStatus is the fast path's part of Status.
func (d *Daemon) fastStatus(s *api.Status) {
	if d.fast == nil {
		return
	}
	s.FastPath = true
	for _, p := range d.fast.Status() {
		s.Kernel = append(s.Kernel, api.KernelStatus{
			ID: p.ID, Share: p.Share, Entries: p.Entries, KernelEntries: p.Kernel, AllKernel: p.AllKernel,
			Flows: p.Flows, Lost: p.Lost, Overruns: p.Overruns, Late: p.Late, Unknown: p.Unknown, Generation: p.Generation, Policy: p.Policy, Error: p.Error, Plan: p.Plan,
		})
	}
	for _, h := range d.fast.Hits() {
		s.KernelHits = append(s.KernelHits, api.RuleHit{Rule: h.Rule, Dimension: h.Dimension, Count: h.Count})
	}
}
