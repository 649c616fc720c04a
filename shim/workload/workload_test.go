package workload

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/shim/config"
	"github.com/kl-egress/kl/shim/docker"
)

type fakeLookup struct {
	c   map[string]docker.Container
	err error
}

func (f fakeLookup) Lookup(_ context.Context, id string) (docker.Container, bool, error) {
	c, ok := f.c[id]
	return c, ok, f.err
}

func TestIdentify(t *testing.T) {
	dk := fakeLookup{c: map[string]docker.Container{
		"d1": {ID: "d1", Names: []string{"/web"}, Image: "nginx", Labels: map[string]string{"kl.route": "proxy", "kl.egress.mode": "proxy"}},
	}}
	tests := []struct {
		name                              string
		id                                string
		ann                               map[string]string
		dk                                Lookup
		exempt                            config.Exempt
		mode, from, image, engine, ns, nm string
		label                             string
		exemptWhy                         string
	}{
		{name: "docker labels", id: "d1", dk: dk, mode: "proxy", from: "label", image: "docker.io/library/nginx:latest", engine: "docker", nm: "web", label: "kl.route=proxy"},
		{name: "annotation beats label", id: "d1", dk: dk, ann: map[string]string{"kl.egress.mode": "env"}, mode: "env", from: "annotation", image: "docker.io/library/nginx:latest", engine: "docker", nm: "web", label: "kl.route=proxy"},
		{name: "cri", id: "c1", ann: map[string]string{"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-namespace": "shop", "io.kubernetes.cri.image-name": "ghcr.io/a/b:1", "io.kubernetes.cri.container-name": "app"},
			mode: "transparent", from: "node default", image: "ghcr.io/a/b:1", engine: "cri", ns: "shop", nm: "app"},
		{name: "ctr annotations are labels", id: "c2", ann: map[string]string{"kl.route": "proxy"}, dk: fakeLookup{err: docker.ErrUnavailable}, mode: "transparent", from: "node default", engine: "oci", label: "kl.route=proxy"},
		// kl-runtime's own bookkeeping in the spec is not the workload's.
		{name: "kl's annotations are not labels", id: "c2", ann: map[string]string{"kl.route": "proxy", AnnotCreatedMode: "proxy", AnnotEnvOmitted: "relay down"}, mode: "transparent", from: "node default", engine: "oci", label: "kl.route=proxy"},
		{name: "exempt namespace", id: "c3", ann: map[string]string{"io.kubernetes.cri.sandbox-namespace": "kube-system"}, exempt: config.Exempt{Namespaces: []string{"kube-system"}},
			mode: "transparent", from: "node default", engine: "cri", ns: "kube-system", exemptWhy: "namespace kube-system"},
		{name: "exempt image normalized", id: "d1", dk: dk, exempt: config.Exempt{Images: []string{"docker.io/library/nginx:*"}},
			mode: "proxy", from: "label", image: "docker.io/library/nginx:latest", engine: "docker", nm: "web", label: "kl.route=proxy", exemptWhy: "exempt pattern"},
		{name: "exempt image raw", id: "d1", dk: dk, exempt: config.Exempt{Images: []string{"nginx"}},
			mode: "proxy", from: "label", image: "docker.io/library/nginx:latest", engine: "docker", nm: "web", label: "kl.route=proxy", exemptWhy: "exempt pattern nginx"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &config.Config{Mode: "transparent", Exempt: tt.exempt}
			in, err := Identify(context.Background(), cfg, tt.id, tt.ann, tt.dk, config.Discard())
			if err != nil {
				t.Fatal(err)
			}
			if in.Mode != tt.mode || in.ModeFrom != tt.from || in.Image != tt.image || in.Engine != tt.engine || in.Namespace != tt.ns || in.Name != tt.nm {
				t.Errorf("Identify = %+v", in)
			}
			if tt.label != "" {
				k, v, _ := strings.Cut(tt.label, "=")
				if in.Labels[k] != v {
					t.Errorf("labels = %v, want %s", in.Labels, tt.label)
				}
			}
			if _, ok := in.Labels[AnnotCreatedMode]; ok {
				t.Errorf("labels = %v, kl's own annotation among them", in.Labels)
			}
			if _, ok := in.Labels[AnnotEnvOmitted]; ok {
				t.Errorf("labels = %v, kl's own annotation among them", in.Labels)
			}
			if (tt.exemptWhy == "") != (in.Exempt == "") || !strings.Contains(in.Exempt, tt.exemptWhy) {
				t.Errorf("Exempt = %q, want %q", in.Exempt, tt.exemptWhy)
			}
		})
	}
}

func TestIdentifyErrors(t *testing.T) {
	cfg := &config.Config{Mode: "transparent"}
	if _, err := Identify(context.Background(), cfg, "x", map[string]string{"kl.egress.mode": "none"}, nil, config.Discard()); err == nil || !strings.Contains(err.Error(), `"none"`) {
		t.Errorf("bad mode: %v", err)
	}
	if _, err := Identify(context.Background(), cfg, "x", nil, fakeLookup{err: errors.New("HTTP 500")}, config.Discard()); err == nil {
		t.Errorf("docker error swallowed")
	}
	// A Docker engine that fails to answer is an error for a container that may be its;
	// a CRI container is the CRI's, and Docker is not asked.
	silent := fakeLookup{err: errors.New("docker lookup x: context deadline exceeded")}
	if _, err := Identify(context.Background(), cfg, "x", map[string]string{"kl.route": "proxy"}, silent, config.Discard()); err == nil {
		t.Errorf("a silent docker engine taken for no engine: the container's labels and mode would be lost")
	}
	cri := map[string]string{"io.kubernetes.cri.container-type": "container", "io.kubernetes.cri.sandbox-namespace": "shop"}
	if in, err := Identify(context.Background(), cfg, "x", cri, silent, config.Discard()); err != nil || in.Engine != "cri" {
		t.Errorf("a CRI container with docker silent: %+v, %v", in, err)
	}
	// On a plain containerd container the annotation (ctr --annotation) picks the mode.
	in, _ := Identify(context.Background(), cfg, "x", map[string]string{"kl.egress.mode": "proxy"}, nil, config.Discard())
	if in.Mode != "proxy" {
		t.Errorf("annotation mode = %s", in.Mode)
	}
}

func TestGlob(t *testing.T) {
	tests := []struct {
		p, s string
		want bool
	}{
		{"*", "anything/at/all", true},
		{"docker.io/library/*", "docker.io/library/nginx:latest", true},
		{"docker.io/library/*", "docker.io/bitnami/nginx:latest", false},
		{"*/nginx:*", "docker.io/library/nginx:1", true},
		{"nginx", "nginx:1", false},
		{"ngin?", "nginx", true},
		{"ngin?", "ngin", false},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{"", "", true},
		{"**", "", true},
	}
	for _, tt := range tests {
		if got := Glob(tt.p, tt.s); got != tt.want {
			t.Errorf("Glob(%q, %q) = %v, want %v", tt.p, tt.s, got, tt.want)
		}
	}
}

func TestDocker(t *testing.T) {
	tests := []struct {
		name, socket, root string
		want               Lookup
	}{
		{"both", "/run/docker.sock", "/var/lib/docker", docker.Client{Socket: "/run/docker.sock", Root: "/var/lib/docker", Timeout: time.Second}},
		{"no records", "/run/docker.sock", "-", docker.Client{Socket: "/run/docker.sock", Timeout: time.Second}},
		{"no lookup", "-", "/var/lib/docker", nil},
	}
	for _, tt := range tests {
		if got := Docker(&config.Config{DockerSocket: tt.socket, DockerRoot: tt.root}, time.Second); got != tt.want {
			t.Errorf("%s: Docker = %#v, want %#v", tt.name, got, tt.want)
		}
	}
}
