package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"time"

	"github.com/kl-egress/kl/relayd/api/wire"
)

// ErrUnreachable wraps every failure to reach the daemon at all, so callers that must
// fail closed (kl-cni ADD, kl-hook) can say so precisely.
var ErrUnreachable = wire.ErrUnreachable

// Client talks to kl-relayd over its unix socket.
type Client struct {
	Socket  string
	Timeout time.Duration // per call; default 5s
	hc      *http.Client
}

// NewClient returns a client for the daemon at socket (DefaultSocket when empty).
func NewClient(socket string, timeout time.Duration) *Client {
	if socket == "" {
		socket = DefaultSocket
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	c := &Client{Socket: socket, Timeout: timeout}
	c.hc = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}}
	return c
}

// Register adds (or refreshes) a workload and returns once its listeners exist.
func (c *Client) Register(ctx context.Context, w Workload) (Registration, error) {
	var r Registration
	err := c.do(ctx, http.MethodPost, "/v1/workloads", w, &r)
	return r, err
}

// Deregister removes a workload. Removing an unknown id is not an error.
func (c *Client) Deregister(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/workloads/"+url.PathEscape(id), nil, nil)
}

// Get returns one registration; found is false when the id is not registered.
func (c *Client) Get(ctx context.Context, id string) (r Registration, found bool, err error) {
	err = c.do(ctx, http.MethodGet, "/v1/workloads/"+url.PathEscape(id), nil, &r)
	var he *HTTPError
	if errors.As(err, &he) && he.Status == http.StatusNotFound {
		return r, false, nil
	}
	return r, err == nil, err
}

// List returns every registration.
func (c *Client) List(ctx context.Context) ([]Registration, error) {
	var rs []Registration
	err := c.do(ctx, http.MethodGet, "/v1/workloads", nil, &rs)
	return rs, err
}

// Ping succeeds when the daemon is up and ready.
func (c *Client) Ping(ctx context.Context) error {
	return c.do(ctx, http.MethodGet, "/v1/ready", nil, nil)
}

// Call performs any other JSON call (status, reload); out may be nil.
func (c *Client) Call(ctx context.Context, method, path string, in, out any) error {
	return c.do(ctx, method, path, in, out)
}

// HTTPError is a well-formed refusal from the daemon.
type HTTPError = wire.HTTPError

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://kl-relayd"+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w at %s: %w", ErrUnreachable, c.Socket, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("read response from %s: %w", c.Socket, err)
	}
	if resp.StatusCode/100 != 2 {
		var eb ErrorBody
		if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
			eb.Error = string(bytes.TrimSpace(data))
		}
		return &HTTPError{Status: resp.StatusCode, Msg: eb.Error}
	}
	if out != nil {
		// An answer that is expected must be there: an empty body, or null where an
		// object is due (which would decode to a zero value), is no answer at all.
		body := bytes.TrimSpace(data)
		if len(body) == 0 || string(body) == "null" && reflect.TypeOf(out).Elem().Kind() == reflect.Struct {
			return fmt.Errorf("decode response from %s: %s %s answered %q, want a JSON answer", c.Socket, method, path, body)
		}
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decode response from %s: %w", c.Socket, err)
		}
	}
	return nil
}
