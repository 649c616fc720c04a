package wire

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Client talks to kl-relayd over its unix socket with one HTTP/1.0 exchange per call
// (a request with a Content-Length, a response read to its length or to the end), which
// is all the daemon's API needs. It holds no connections: the zero value with a Socket is
// ready, and a Client may be used by several goroutines.
type Client struct {
	Socket  string        // DefaultSocket when empty
	Timeout time.Duration // per call; 5s when zero
}

// MaxResponse bounds a response body.
const MaxResponse = 16 << 20

// Register adds (or refreshes) a workload and returns once its listeners exist.
func (c *Client) Register(ctx context.Context, w Workload) (Registration, error) {
	var r Registration
	err := c.Call(ctx, "POST", "/v1/workloads", w, &r)
	return r, err
}

// Deregister removes a workload. Removing an unknown id is not an error.
func (c *Client) Deregister(ctx context.Context, id string) (Deregistration, error) {
	var d Deregistration
	err := c.Call(ctx, "DELETE", "/v1/workloads/"+url.PathEscape(id), nil, &d)
	return d, err
}

// Detach releases one CNI attachment of a workload (a CNI DEL): the daemon drops the
// attachment and deregisters the workload only when none is left, and says whether
// d.Netns is still served. A daemon that predates attachments ignores the query and
// deregisters the workload, as Deregister does.
func (c *Client) Detach(ctx context.Context, id string, d Detachment) (Deregistration, error) {
	q := url.Values{}
	if d.Network != "" || d.IfName != "" {
		q.Set("network", d.Network)
		q.Set("ifname", d.IfName)
	}
	if d.Netns != "" {
		q.Set("netns", d.Netns)
	}
	path := "/v1/workloads/" + url.PathEscape(id)
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out Deregistration
	err := c.Call(ctx, "DELETE", path, nil, &out)
	return out, err
}

// Get returns one registration; found is false when the id is not registered.
func (c *Client) Get(ctx context.Context, id string) (r Registration, found bool, err error) {
	err = c.Call(ctx, "GET", "/v1/workloads/"+url.PathEscape(id), nil, &r)
	var he *HTTPError
	if errors.As(err, &he) && he.Status == 404 {
		return r, false, nil
	}
	return r, err == nil, err
}

// List returns every registration.
func (c *Client) List(ctx context.Context) ([]Registration, error) {
	var rs []Registration
	err := c.Call(ctx, "GET", "/v1/workloads", nil, &rs)
	return rs, err
}

// Ping succeeds when the daemon is up and ready.
func (c *Client) Ping(ctx context.Context) error {
	return c.Call(ctx, "GET", "/v1/ready", nil, nil)
}

// Call performs one JSON call: in (when not nil) is the request body, out (when not nil)
// receives the response body. A failure to connect, to send the request or to receive
// a response is ErrUnreachable; a non-2xx answer is an *HTTPError.
func (c *Client) Call(ctx context.Context, method, path string, in, out any) error {
	socket, timeout := c.Socket, c.Timeout
	if socket == "" {
		socket = DefaultSocket
	}
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var body []byte
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = b
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("%w at %s: %w", ErrUnreachable, socket, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	// A cancelled ctx interrupts a blocked read or write.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.0\r\nHost: kl-relayd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", method, path, len(body))
	req.Write(body)
	if _, err := conn.Write(req.Bytes()); err != nil {
		return fmt.Errorf("%w at %s: send %s %s: %w", ErrUnreachable, socket, method, path, err)
	}
	status, data, err := ReadResponse(bufio.NewReader(conn), MaxResponse)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			err = fmt.Errorf("%w (%w)", err, cerr)
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			// The connection's deadline is the context's; it fired first.
			err = fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
		}
		return fmt.Errorf("%w at %s: %s %s: %w", ErrUnreachable, socket, method, path, err)
	}
	if status/100 != 2 {
		var eb ErrorBody
		if json.Unmarshal(data, &eb) != nil || eb.Error == "" {
			eb.Error = string(bytes.TrimSpace(data))
		}
		return &HTTPError{Status: status, Msg: eb.Error}
	}
	if out != nil && len(data) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decode response from %s: %w", socket, err)
		}
	}
	return nil
}

// ReadResponse reads one HTTP/1.x response: the status code and the body (up to its
// Content-Length, or to the end of the stream without one), at most limit bytes. A
// chunked body is refused (the daemon does not send one to an HTTP/1.0 request).
func ReadResponse(r *bufio.Reader, limit int64) (status int, body []byte, err error) {
	line, err := readLine(r)
	if err != nil {
		return 0, nil, fmt.Errorf("read status line: %w", err)
	}
	proto, rest, _ := strings.Cut(line, " ")
	code, _, _ := strings.Cut(rest, " ")
	if !strings.HasPrefix(proto, "HTTP/1.") || len(code) != 3 {
		return 0, nil, fmt.Errorf("malformed status line %q", trunc(line))
	}
	status, err = strconv.Atoi(code)
	if err != nil || status < 100 {
		return 0, nil, fmt.Errorf("malformed status code in %q", trunc(line))
	}
	length := int64(-1)
	for n := 0; ; n++ {
		if n > 100 {
			return 0, nil, errors.New("more than 100 header lines")
		}
		h, err := readLine(r)
		if err != nil {
			return 0, nil, fmt.Errorf("read headers: %w", err)
		}
		if h == "" {
			break
		}
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			return 0, nil, fmt.Errorf("malformed header line %q", trunc(h))
		}
		v = strings.TrimSpace(v)
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "content-length":
			l, err := strconv.ParseInt(v, 10, 64)
			if err != nil || l < 0 {
				return 0, nil, fmt.Errorf("malformed Content-Length %q", trunc(v))
			}
			length = l
		case "transfer-encoding":
			if !strings.EqualFold(v, "identity") {
				return 0, nil, fmt.Errorf("unsupported Transfer-Encoding %q", trunc(v))
			}
		}
	}
	if length > limit {
		return 0, nil, fmt.Errorf("response body of %d bytes exceeds %d", length, limit)
	}
	if length >= 0 {
		body = make([]byte, length)
		if _, err := io.ReadFull(r, body); err != nil {
			return 0, nil, fmt.Errorf("read body: %w", err)
		}
		return status, body, nil
	}
	body, err = io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return 0, nil, fmt.Errorf("read body: %w", err)
	}
	if int64(len(body)) > limit {
		return 0, nil, fmt.Errorf("response body exceeds %d bytes", limit)
	}
	return status, body, nil
}

// maxLine bounds a status or header line.
const maxLine = 8 << 10

func readLine(r *bufio.Reader) (string, error) {
	var b []byte
	for {
		frag, more, err := r.ReadLine()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return "", err
		}
		b = append(b, frag...)
		if len(b) > maxLine {
			return "", fmt.Errorf("line longer than %d bytes", maxLine)
		}
		if !more {
			return string(b), nil
		}
	}
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
