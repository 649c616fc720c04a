package install

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"
)

// CNIAgent keeps kl chained into a node's CNI configuration: the job of the install-cni
// container of the Kubernetes DaemonSet (as istio-cni's install-cni does). The cluster's
// network plugin rewrites its conflist when it restarts or upgrades, dropping kl's
// entry, so the agent checks again every Interval and puts it back. A configuration it
// cannot chain kl-cni into (a single-plugin .conf such as Multus's, a cniVersion kl-cni
// does not support) is logged and tried again, and `kl-ctl install cni --check` (CNI's
// Check), the install-cni container's readiness probe, fails meanwhile: the node's kl
// pod is not ready while pods created there would start without kl's capture.
type CNIAgent struct {
	ConfDir string // the node's CNI configuration directory (DefaultCNIConfDir)
	BinDir  string // the node's CNI plugin directory (DefaultCNIBinDir)
	Binary  string // kl-cni to copy into BinDir; "" copies nothing
	Entry   CNI    // kl's conflist entry
	// Interval between checks; 5s when zero.
	Interval time.Duration
	// UninstallOnExit takes kl's entry out of the conflist when Run's context ends, for a
	// watcher that is going away for good (the DaemonSet being deleted). It is off in the
	// shipped DaemonSet: on a restart, pods created while the entry is out would start
	// without kl-cni and stay uncaptured, while with the entry in place their ADD fails
	// closed until kl is back. The kl-cni binary stays either way: pods already set up
	// still need it for CNI DEL.
	UninstallOnExit bool
	// LockWait bounds each wait for the conflist's lock, which a `kl-ctl install cni` or
	// `uninstall cni` run by hand on the node holds while it edits the file (Options).
	LockWait time.Duration
	Log      *slog.Logger
}

// Run installs kl-cni and keeps it installed until ctx ends. A node whose network
// plugin has not written its configuration yet is waited for, not an error.
func (a CNIAgent) Run(ctx context.Context) error {
	log := a.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	confDir, binDir := or(a.ConfDir, DefaultCNIConfDir), or(a.BinDir, DefaultCNIBinDir)
	interval := a.Interval
	if interval <= 0 {
		interval = 5 * time.Second
	}
	if a.Binary != "" {
		dst, err := CopyBinary(a.Binary, binDir, a.Entry.typ())
		if err != nil {
			return err
		}
		log.Info("installed CNI plugin", "path", dst)
	}
	// Chain kl-cni only into networks whose cniVersion it accepts; otherwise every pod
	// on the node would fail to start.
	entry := a.Entry
	vs, err := PluginVersions(ctx, filepath.Join(binDir, entry.typ()))
	if err != nil {
		return fmt.Errorf("installed CNI plugin: %w", err)
	}
	entry.Versions = vs
	var lastErr string
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		if err := a.once(confDir, entry, log); err != nil {
			// Log each distinct problem once, not every interval.
			if err.Error() != lastErr {
				log.Warn("cannot chain kl-cni yet; the readiness probe (install cni --check) fails until it is", "err", err)
				lastErr = err.Error()
			}
		} else {
			if lastErr != "" {
				log.Info("kl-cni is chained now")
			}
			lastErr = ""
		}
		select {
		case <-ctx.Done():
			if !a.UninstallOnExit {
				return nil
			}
			return a.uninstall(confDir, log)
		case <-tick.C:
		}
	}
}

func (a CNIAgent) once(confDir string, entry CNI, log *slog.Logger) error {
	path, err := FindCNIConfig(confDir)
	if err != nil {
		return err
	}
	// No backups: the network plugin owns this file and rewrites it; a backup per
	// rewrite would pile up in the configuration directory.
	ch, err := Apply(path, entry, Options{NoBackup: true, LockWait: a.LockWait})
	if err != nil {
		return err
	}
	if ch.Changed {
		log.Info("chained kl-cni into the CNI configuration", "path", path, "diff", ch.Diff)
	}
	return nil
}

func (a CNIAgent) uninstall(confDir string, log *slog.Logger) error {
	if _, err := CNIConfigs(confDir); err != nil {
		// Nothing to take kl out of.
		log.Info("no CNI configuration left to clean", "err", err)
		return nil
	}
	// Every conflist of the directory: the network plugin may have renamed its file
	// since kl was chained into it.
	chs, err := UninstallCNIDir(confDir, a.Entry, Options{NoBackup: true, LockWait: a.LockWait})
	for _, ch := range chs {
		if ch.Changed {
			log.Info("removed kl-cni from the CNI configuration", "path", ch.Path)
		}
	}
	if err != nil {
		return fmt.Errorf("remove kl-cni: %w", err)
	}
	return nil
}
