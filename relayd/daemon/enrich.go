package daemon

import (
	"context"
	"maps"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/shim/docker"
)

// enrichTimeout bounds the container engine lookup on the registration path (a CNI ADD
// waits for it).
var enrichTimeout = time.Second

// enrich fills what a registration lacks from the container engine, when one is
// configured: the container's labels (the registration's own win on a conflict) and its
// image, normalized (`nginx` is docker.io/library/nginx:latest). A container the
// engine does not know, or an engine that does not answer, leaves the registration as
// it came (logged at debug level): enrichment never fails a registration.
func (d *Daemon) enrich(w api.Workload) api.Workload {
	if d.cfg.Docker == "" || (w.Image != "" && len(w.Labels) > 0) {
		return w
	}
	ctx, cancel := context.WithTimeout(context.Background(), enrichTimeout)
	defer cancel()
	ct, found, err := docker.Client{Socket: d.cfg.Docker, Timeout: enrichTimeout}.Lookup(ctx, w.ID)
	if err != nil || !found {
		d.log.Debug("no container engine metadata", "workload", w.ID, "found", found, "err", err)
		return w
	}
	if len(ct.Labels) > 0 {
		labels := maps.Clone(ct.Labels)
		maps.Copy(labels, w.Labels)
		w.Labels = labels
	}
	if w.Image == "" && ct.Image != "" {
		if img, err := rules.NormalizeImage(ct.Image); err == nil {
			w.Image = img
		} else {
			d.log.Debug("container image reference not usable", "workload", w.ID, "err", err)
		}
	}
	return w
}
