// Package docker reads one container's labels and image from the Docker Engine API over
// its unix socket, for kl-runtime and kl-hook.
//
// It is deliberately a single HTTP GET with net/http rather than github.com/docker/docker's
// client: that module drags in a large dependency tree for one read-only call. It asks
// the container list endpoint (filtered by id), not /containers/{id}/json: dockerd holds
// the container's lock while it creates and starts the task, and inspect waits for that
// lock, so an inspect from inside `runc create` (kl-runtime) or a createRuntime hook
// (kl-hook) would deadlock until the hook timed out. The list endpoint reads dockerd's
// lock-free in-memory view and already holds labels, image and names.
//
// When the API does not answer, it reads the container's own record in dockerd's data
// root instead: at startup dockerd starts the containers of a restart policy before it
// serves its API, on a socket that already listens (or that systemd's docker.socket
// holds), so a lookup made from their `runc create` gets no answer at all.
package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Container is what kl needs to know about a Docker container.
type Container struct {
	ID      string            `json:"Id"`
	Names   []string          `json:"Names"`
	Image   string            `json:"Image"`   // as the user gave it (or the image id)
	ImageID string            `json:"ImageID"` // sha256:…
	Labels  map[string]string `json:"Labels"`
}

// Name is the container's primary name without the leading slash.
func (c Container) Name() string {
	if len(c.Names) == 0 {
		return ""
	}
	return strings.TrimPrefix(c.Names[0], "/")
}

// ErrUnavailable marks a Docker socket that is absent or that nothing listens on: no
// Docker engine runs on this node (a containerd-only node), and callers take the
// container for another engine's. An engine that is there but does not answer in time,
// or answers wrongly, is an error like any other: the container may well be Docker's,
// and treating it as another engine's would lose its labels, mode and exemptions.
var ErrUnavailable = errors.New("docker engine unavailable")

// errNoAnswer marks a request the engine did not answer: it timed out, or the
// connection failed otherwise than ErrUnavailable says or broke.
var errNoAnswer = errors.New("no answer")

// Client reads from one Docker Engine socket, and from the engine's data root when the
// socket does not answer.
type Client struct {
	Socket string
	// Root is dockerd's data root (--data-root, /var/lib/docker by default); "" never
	// reads it.
	Root    string
	Timeout time.Duration
}

// Lookup returns the container with exactly this id; found is false when Docker does not
// know it (the container belongs to another engine). An engine that does not answer is
// an error unless the container's record in Root says who it is: the record is dockerd's
// own, but its layout is not an API, and a missing one may mean only that the data root
// is elsewhere, so it is never taken for "not Docker's".
func (c Client) Lookup(ctx context.Context, id string) (ct Container, found bool, err error) {
	if id == "" {
		return ct, false, errors.New("docker lookup: empty container id")
	}
	ct, found, err = c.ask(ctx, id)
	if !errors.Is(err, errNoAnswer) || c.Root == "" {
		return ct, found, err
	}
	ct, rerr := c.record(id)
	if rerr != nil {
		return ct, false, fmt.Errorf("%w; %w", err, rerr)
	}
	return ct, true, nil
}

// ask is Lookup through the API.
func (c Client) ask(ctx context.Context, id string) (ct Container, found bool, err error) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", c.Socket)
		},
		DisableKeepAlives: true,
	}}
	filters, _ := json.Marshal(map[string][]string{"id": {id}})
	u := "http://docker/containers/json?all=1&filters=" + url.QueryEscape(string(filters))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return ct, false, fmt.Errorf("docker lookup %s: %w", id, err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return ct, false, fmt.Errorf("%w at %s: %w", ErrUnavailable, c.Socket, err)
		}
		return ct, false, fmt.Errorf("docker lookup %s at %s: %w: %w", id, c.Socket, errNoAnswer, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return ct, false, fmt.Errorf("docker lookup %s at %s: %w: read response: %w", id, c.Socket, errNoAnswer, err)
	}
	if resp.StatusCode != http.StatusOK {
		return ct, false, fmt.Errorf("docker lookup %s: HTTP %d: %s", id, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	return Find(data, id)
}

// record reads the container's config.v2.json in Root (moby's container.Container,
// written when the container is created): its name, its image as given (Config.Image)
// and by id (Image), and its labels (Config.Labels).
func (c Client) record(id string) (Container, error) {
	if strings.ContainsRune(id, '/') {
		return Container{}, fmt.Errorf("docker record of %q: not a container id", id)
	}
	p := filepath.Join(c.Root, "containers", id, "config.v2.json")
	f, err := os.Open(p)
	if err != nil {
		return Container{}, fmt.Errorf("docker record: %w", err)
	}
	defer f.Close()
	var rec struct {
		ID     string
		Name   string
		Image  string
		Config struct {
			Image  string
			Labels map[string]string
		}
	}
	if err := json.NewDecoder(io.LimitReader(f, 8<<20)).Decode(&rec); err != nil {
		return Container{}, fmt.Errorf("docker record %s: %w", p, err)
	}
	if rec.ID != id {
		return Container{}, fmt.Errorf("docker record %s: holds container %q", p, rec.ID)
	}
	return Container{ID: id, Names: []string{rec.Name}, Image: rec.Config.Image, ImageID: rec.Image, Labels: rec.Config.Labels}, nil
}

// Find picks the container with this id out of a /containers/json answer.
func Find(data []byte, id string) (Container, bool, error) {
	var list []Container
	if err := json.Unmarshal(data, &list); err != nil {
		return Container{}, false, fmt.Errorf("docker lookup %s: decode container list: %w", id, err)
	}
	for _, ct := range list {
		if ct.ID == id {
			return ct, true, nil
		}
	}
	return Container{}, false, nil
}
