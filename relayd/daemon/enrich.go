package daemon

import (
	"context"
	"maps"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/containerd"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/shim/docker"
)

// enrichTimeout bounds the container engine lookups on the registration path, all
// engines together (a CNI ADD waits for them).
var enrichTimeout = time.Second

// engineContainer is what an engine knows of a container, for enrichment.
type engineContainer struct {
	labels map[string]string
	image  string // "" when the engine's image is not the workload's (a CRI pod sandbox)
}

// engine looks a container up by id in one container engine.
type engine struct {
	name   string
	lookup func(ctx context.Context, id string) (engineContainer, bool, error)
}

// engines are the configured container engines, in the order they are asked.
func (d *Daemon) engines() []engine {
	var es []engine
	if sock := d.cfg.Docker; sock != "" {
		es = append(es, engine{"docker", func(ctx context.Context, id string) (engineContainer, bool, error) {
			ct, found, err := docker.Client{Socket: sock, Timeout: enrichTimeout}.Lookup(ctx, id)
			return engineContainer{labels: ct.Labels, image: ct.Image}, found, err
		}})
	}
	if cd := d.cfg.Containerd; cd.Socket != "" {
		es = append(es, engine{"containerd", func(ctx context.Context, id string) (engineContainer, bool, error) {
			ct, found, err := containerd.Client{Socket: cd.Socket, Namespaces: cd.Namespaces, Timeout: enrichTimeout}.Lookup(ctx, id)
			ec := engineContainer{labels: ct.Labels, image: ct.Image}
			if ct.Sandbox {
				// A CRI pod sandbox runs the pause image; its labels are the pod's.
				ec.image = ""
			}
			return ec, found, err
		}})
	}
	return es
}

// enrich fills what a registration lacks from the container engines, when any are
// configured (Docker, then containerd): the container's labels (the registration's own
// win on a conflict) and its image, normalized (`nginx` is
// docker.io/library/nginx:latest), from the first engine that knows the id. A container no
// engine knows, or an engine that does not answer within enrichTimeout, leaves the
// registration as it came (logged at debug level): enrichment never fails a
// registration.
func (d *Daemon) enrich(w api.Workload) api.Workload {
	es := d.engines()
	if len(es) == 0 || (w.Image != "" && len(w.Labels) > 0) {
		return w
	}
	ctx, cancel := context.WithTimeout(context.Background(), enrichTimeout)
	defer cancel()
	for _, e := range es {
		ct, found, err := e.lookup(ctx, w.ID)
		if err != nil || !found {
			d.log.Debug("no container engine metadata", "engine", e.name, "workload", w.ID, "found", found, "err", err)
			continue
		}
		return d.merge(w, e.name, ct)
	}
	return w
}

// merge adds an engine's labels and image to a registration.
func (d *Daemon) merge(w api.Workload, engine string, ct engineContainer) api.Workload {
	if len(ct.labels) > 0 {
		labels := maps.Clone(ct.labels)
		maps.Copy(labels, w.Labels)
		w.Labels = labels
	}
	if w.Image == "" && ct.image != "" {
		if img, err := rules.NormalizeImage(ct.image); err == nil {
			w.Image = img
		} else {
			d.log.Debug("container image reference not usable", "engine", engine, "workload", w.ID, "err", err)
		}
	}
	d.log.Debug("enriched from the container engine", "engine", engine, "workload", w.ID, "labels", len(ct.labels), "image", w.Image != "")
	return w
}
