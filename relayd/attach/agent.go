package attach

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// DefaultControl is the background agent's control socket: in $XDG_RUNTIME_DIR when set,
// else in ~/.kl.
func DefaultControl(getenv func(string) string) string {
	if d := getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "kl-attach.sock")
	}
	home := getenv("HOME")
	if home == "" {
		home = os.TempDir()
	}
	return filepath.Join(home, ".kl", "attach.sock")
}

// AgentStatus is what `kl-ctl attach status` prints.
type AgentStatus struct {
	PID    int    `json:"pid"`
	Server string `json:"server"`
	Stats  Stats  `json:"stats"`
}

// ServeControl answers status and stop requests on a unix socket at path (mode 0600)
// until ctx is done or a stop request arrives; stop is called for the latter. A stale
// socket is replaced; one a live agent answers on is not.
func ServeControl(ctx context.Context, path string, c *Client, stop func()) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
		conn.Close()
		return fmt.Errorf("control socket %s: another attach agent is running", path)
	}
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	defer os.Remove(path)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("control socket: %w", err)
	}
	status := func() AgentStatus { return AgentStatus{PID: os.Getpid(), Server: c.o.Server, Stats: c.Stats()} }
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(status())
	})
	mux.HandleFunc("POST /stop", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(status())
		stop()
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		<-ctx.Done()
		// Shutdown, not Close: the answer to the stop request that ended ctx is still
		// being written, and the caller is told the agent stopped only once it is.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-shut
	return nil
}

func controlClient(path string) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}}
}

// ErrNoAgent means nothing answers on the control socket.
var ErrNoAgent = errors.New("no attach agent is running")

// AgentRequest asks the agent at path for its status ("status") or to stop ("stop").
func AgentRequest(ctx context.Context, path, what string) (AgentStatus, error) {
	var st AgentStatus
	method := http.MethodGet
	if what == "stop" {
		method = http.MethodPost
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://agent/"+what, nil)
	if err != nil {
		return st, err
	}
	resp, err := controlClient(path).Do(req)
	if err != nil {
		if _, serr := os.Stat(path); serr != nil {
			return st, fmt.Errorf("%w (no control socket %s)", ErrNoAgent, path)
		}
		return st, fmt.Errorf("%w: %s: %v", ErrNoAgent, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("attach agent: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return st, fmt.Errorf("attach agent: %w", err)
	}
	return st, nil
}
