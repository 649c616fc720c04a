// Package workload identifies the container behind an OCI create or hook call: its
// egress mode, image, labels and Kubernetes namespace, from the spec's annotations and,
// for Docker containers, from the Docker Engine API. It also applies the operator's
// exemptions. It does not edit specs or talk to the relay.
package workload

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/rules/imageref"
	"github.com/kl-egress/kl/shim/config"
	"github.com/kl-egress/kl/shim/docker"
)

// Annotation keys the engines write into config.json that kl reads.
const (
	AnnotCRIImage        = "io.kubernetes.cri.image-name"        // containerd CRI
	AnnotCRINamespace    = "io.kubernetes.cri.sandbox-namespace" // containerd CRI
	AnnotCRIName         = "io.kubernetes.cri.container-name"    // containerd CRI
	AnnotCRIContainerTyp = "io.kubernetes.cri.container-type"    // "sandbox" or "container"
	AnnotPodNamespace    = "io.kubernetes.pod.namespace"         // CRI-O and dockershim
	AnnotContainerdImage = "io.containerd.image.name"            // set by some containerd clients
)

// Annotations kl-runtime writes into config.json at create, for its own later calls on the
// same container (exec). They are kl's bookkeeping, never a workload's labels.
const (
	// AnnotCreatedMode is the egress mode kl chose at create, in every mode: the node
	// default may change while the container runs.
	AnnotCreatedMode = "kl.egress.mode.created"
	// AnnotEnvOmitted says why kl left the proxy variables out at create (failOpen with
	// kl-relayd down); absent when it did not.
	AnnotEnvOmitted = "kl.egress.env.omitted"
)

// Info is what kl knows about one container.
type Info struct {
	ID          string
	Mode        string // env, proxy or transparent
	ModeFrom    string // "annotation", "label" or "node default"
	Image       string // normalized when it parses, else as given
	Namespace   string // Kubernetes namespace, when known
	Name        string
	Labels      map[string]string
	Annotations map[string]string
	Engine      string // "docker", "cri" or "oci" (plain annotations only)
	Exempt      string // why the operator exempted it; "" when kl applies
}

// Lookup finds a Docker container by id (docker.Client in production).
type Lookup interface {
	Lookup(ctx context.Context, id string) (docker.Container, bool, error)
}

// Docker is the Lookup the settings ask for: the API at DockerSocket, answering within
// timeout (0: the client's default), and the records in DockerRoot when it does not
// answer; nil when dockerSocket is "-".
func Docker(cfg *config.Config, timeout time.Duration) Lookup {
	if cfg.DockerSocket == "-" {
		return nil
	}
	c := docker.Client{Socket: cfg.DockerSocket, Root: cfg.DockerRoot, Timeout: timeout}
	if c.Root == "-" {
		c.Root = ""
	}
	return c
}

// Identify gathers Info for container id with spec annotations ann. dk may be nil (no
// Docker lookup). A container whose spec carries the CRI's annotations is the CRI's
// (Kubernetes), and Docker is not asked. Otherwise a Docker socket that is absent or
// that nothing listens on is not an error: the container belongs to another engine. A
// Docker engine that is there but fails to answer is, unless the container's record in
// Docker's data root answers for it: the container may be Docker's.
func Identify(ctx context.Context, cfg *config.Config, id string, ann map[string]string, dk Lookup, log *slog.Logger) (Info, error) {
	in := Info{ID: id, Annotations: ann, Engine: "oci"}
	var ct docker.Container
	var isDocker bool
	isCRI := ann[AnnotCRIContainerTyp] != "" || ann[AnnotCRINamespace] != ""
	if dk != nil && !isCRI {
		var err error
		ct, isDocker, err = dk.Lookup(ctx, id)
		switch {
		case errors.Is(err, docker.ErrUnavailable):
			log.Debug("no docker engine to ask", "id", id, "err", err)
		case err != nil:
			return in, fmt.Errorf("identify container %s: %w", id, err)
		}
	}
	rawImage := first(ann[AnnotCRIImage], ann[AnnotContainerdImage])
	switch {
	case isDocker:
		in.Engine = "docker"
		in.Labels = maps.Clone(ct.Labels)
		in.Name = ct.Name()
		if rawImage == "" {
			rawImage = ct.Image
		}
	case isCRI:
		in.Engine = "cri"
		in.Name = ann[AnnotCRIName]
	default:
		// ctr, nerdctl and other plain containerd clients: annotations (ctr --annotation)
		// are the only per-container metadata in the spec, so they serve as labels.
		in.Labels = maps.Clone(ann)
		delete(in.Labels, AnnotCreatedMode)
		delete(in.Labels, AnnotEnvOmitted)
	}
	in.Namespace = first(ann[AnnotCRINamespace], ann[AnnotPodNamespace])
	if rawImage != "" {
		if n, err := imageref.Normalize(rawImage); err == nil {
			in.Image = n
		} else {
			log.Warn("image reference does not parse; using it as given", "id", id, "image", rawImage, "err", err)
			in.Image = rawImage
		}
	}

	in.Mode, in.ModeFrom = cfg.Mode, "node default"
	if m, ok := ann[api.LabelMode]; ok {
		in.Mode, in.ModeFrom = m, "annotation"
	} else if m, ok := in.Labels[api.LabelMode]; ok && isDocker {
		in.Mode, in.ModeFrom = m, "label"
	}
	if !config.ValidMode(in.Mode) {
		return in, fmt.Errorf("container %s: %s %s=%q: want env, proxy or transparent", id, in.ModeFrom, api.LabelMode, in.Mode)
	}
	in.Exempt = exempt(cfg, rawImage, in)
	return in, nil
}

func exempt(cfg *config.Config, rawImage string, in Info) string {
	for _, ns := range cfg.Exempt.Namespaces {
		if in.Namespace != "" && ns == in.Namespace {
			return "namespace " + ns + " is exempt"
		}
	}
	for _, g := range cfg.Exempt.Images {
		if (rawImage != "" && Glob(g, rawImage)) || (in.Image != "" && Glob(g, in.Image)) {
			return "image matches exempt pattern " + g
		}
	}
	return ""
}

func first(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// Glob matches s against pattern: `*` is any run of characters (including `/`), `?` one
// character; everything else matches itself. The whole string must match.
func Glob(pattern, s string) bool {
	px, sx := 0, 0
	starP, starS := -1, 0
	for sx < len(s) {
		switch {
		case px < len(pattern) && (pattern[px] == '?' || pattern[px] == s[sx]) && pattern[px] != '*':
			px++
			sx++
		case px < len(pattern) && pattern[px] == '*':
			starP, starS = px, sx
			px++
		case starP >= 0:
			starS++
			px, sx = starP+1, starS
		default:
			return false
		}
	}
	for px < len(pattern) && pattern[px] == '*' {
		px++
	}
	return px == len(pattern)
}
