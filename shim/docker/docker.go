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

// Client reads from one Docker Engine socket.
type Client struct {
	Socket  string
	Timeout time.Duration
}

// Lookup returns the container with exactly this id; found is false when Docker does not
// know it (the container belongs to another engine).
func (c Client) Lookup(ctx context.Context, id string) (ct Container, found bool, err error) {
	if id == "" {
		return ct, false, errors.New("docker lookup: empty container id")
	}
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
		return ct, false, fmt.Errorf("docker lookup %s at %s: %w", id, c.Socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return ct, false, fmt.Errorf("docker lookup %s: read response: %w", id, err)
	}
	if resp.StatusCode != http.StatusOK {
		return ct, false, fmt.Errorf("docker lookup %s: HTTP %d: %s", id, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	return Find(data, id)
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
