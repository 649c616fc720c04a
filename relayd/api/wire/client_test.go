package wire

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serve runs h on a unix socket in a temporary directory and returns the socket path.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func TestClientAgainstNetHTTPServer(t *testing.T) {
	regs := map[string]Registration{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/workloads", func(w http.ResponseWriter, r *http.Request) {
		var wl Workload
		if err := json.NewDecoder(r.Body).Decode(&wl); err != nil {
			w.WriteHeader(400)
			json.NewEncoder(w).Encode(ErrorBody{Error: "decode: " + err.Error()})
			return
		}
		reg := Registration{Workload: wl, Listeners: Listeners{Redirect: DefaultRedirectPort}, Captured: wl.Capture != nil}
		regs[wl.ID] = reg
		json.NewEncoder(w).Encode(reg)
	})
	mux.HandleFunc("GET /v1/workloads/{id}", func(w http.ResponseWriter, r *http.Request) {
		reg, ok := regs[r.PathValue("id")]
		if !ok {
			w.WriteHeader(404)
			json.NewEncoder(w).Encode(ErrorBody{Error: "not registered"})
			return
		}
		json.NewEncoder(w).Encode(reg)
	})
	mux.HandleFunc("GET /v1/workloads", func(w http.ResponseWriter, r *http.Request) {
		var out []Registration
		for _, r := range regs {
			out = append(out, r)
		}
		// Larger than the server's buffer, so it is streamed without a Content-Length.
		big := strings.Repeat("x", 64<<10)
		out = append(out, Registration{Workload: Workload{ID: "big", Name: big}})
		json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("DELETE /v1/workloads/{id}", func(w http.ResponseWriter, r *http.Request) {
		_, known := regs[r.PathValue("id")]
		delete(regs, r.PathValue("id"))
		json.NewEncoder(w).Encode(Deregistration{TableRemoved: known})
	})
	mux.HandleFunc("GET /v1/ready", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(503)
		w.Write([]byte("plain text refusal\n"))
	})
	c := &Client{Socket: serve(t, mux), Timeout: 2 * time.Second}
	ctx := context.Background()

	w := Workload{ID: "pod-1", Netns: "/var/run/netns/p", Mode: ModeTransparent, Source: "cni",
		Labels: map[string]string{"app": "x"}, Capture: &Capture{RedirectPort: 15001, Mark: 1, IPv6: true}}
	reg, err := c.Register(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	if reg.Workload.ID != "pod-1" || reg.Listeners.Redirect != DefaultRedirectPort || !reg.Captured || reg.Workload.Labels["app"] != "x" {
		t.Errorf("register: %+v", reg)
	}
	got, found, err := c.Get(ctx, "pod-1")
	if err != nil || !found || got.Workload.Netns != w.Netns {
		t.Errorf("get pod-1: %+v %v %v", got, found, err)
	}
	if _, found, err := c.Get(ctx, "nope"); err != nil || found {
		t.Errorf("get nope: found %v err %v, want not found and no error", found, err)
	}
	list, err := c.List(ctx)
	if err != nil || len(list) != 2 || len(list[1].Workload.Name) != 64<<10 {
		t.Errorf("list: %d entries, %v", len(list), err)
	}
	if d, err := c.Deregister(ctx, "pod-1"); err != nil || !d.TableRemoved {
		t.Fatalf("deregister: %+v %v", d, err)
	}
	if _, found, _ := c.Get(ctx, "pod-1"); found {
		t.Error("pod-1 still registered after Deregister")
	}
	err = c.Ping(ctx)
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != 503 || he.Msg != "plain text refusal" {
		t.Errorf("ping: %v, want HTTP 503 with the plain body", err)
	}
	if errors.Is(err, ErrUnreachable) {
		t.Errorf("a refusal is not unreachable: %v", err)
	}
}

func TestClientUnreachable(t *testing.T) {
	dir := t.TempDir()
	// No socket at all.
	c := &Client{Socket: filepath.Join(dir, "none.sock"), Timeout: time.Second}
	if err := c.Ping(context.Background()); !errors.Is(err, ErrUnreachable) {
		t.Errorf("missing socket: %v, want ErrUnreachable", err)
	}
	// A socket that accepts and never answers: the timeout ends the call.
	sock := filepath.Join(dir, "mute.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	c = &Client{Socket: sock, Timeout: 200 * time.Millisecond}
	start := time.Now()
	err = c.Ping(context.Background())
	if !errors.Is(err, ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("mute daemon: %v, want ErrUnreachable and the deadline", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("mute daemon: the call took %v", time.Since(start))
	}
	// Cancelling the context ends a blocked call too.
	ctx, cancel := context.WithCancel(context.Background())
	c.Timeout = time.Minute
	time.AfterFunc(100*time.Millisecond, cancel)
	if err := c.Ping(ctx); !errors.Is(err, ErrUnreachable) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want ErrUnreachable and context.Canceled", err)
	}
}

func TestReadResponse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		status   int
		body     string
		err      string
	}{
		{"length", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}trailing", 200, "{}", ""},
		{"to end", "HTTP/1.0 404 Not Found\r\nContent-Type: application/json\r\n\r\n{\"error\":\"x\"}\n", 404, "{\"error\":\"x\"}\n", ""},
		{"bare LF", "HTTP/1.1 200 OK\nContent-Length: 0\n\n", 200, "", ""},
		{"no reason", "HTTP/1.1 204\r\n\r\n", 204, "", ""},
		{"empty", "", 0, "", "read status line"},
		{"not http", "SSH-2.0-OpenSSH\r\n\r\n", 0, "", "malformed status line"},
		{"bad code", "HTTP/1.1 2x0 OK\r\n\r\n", 0, "", "malformed status code"},
		{"bad header", "HTTP/1.1 200 OK\r\nnocolon\r\n\r\n", 0, "", "malformed header line"},
		{"bad length", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", 0, "", "malformed Content-Length"},
		{"short body", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 0, "", "read body"},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 0, "", "unsupported Transfer-Encoding"},
		{"too long", "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", 0, "", "exceeds"},
		{"too long to end", "HTTP/1.1 200 OK\r\n\r\n" + strings.Repeat("x", 65), 0, "", "exceeds"},
		{"headers cut", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", 0, "", "read headers"},
		{"long line", "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("y", 9000) + "\r\n\r\n", 0, "", "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, err := ReadResponse(bufio.NewReaderSize(strings.NewReader(tc.in), 16), 64)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || status != tc.status || string(body) != tc.body {
				t.Fatalf("got %d %q %v, want %d %q", status, body, err, tc.status, tc.body)
			}
		})
	}
}

// FuzzReadResponse: any byte stream gives a status and a bounded body or an error, never
// a panic.
func FuzzReadResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
	f.Add([]byte("HTTP/1.0 500 Internal Server Error\r\n\r\n{\"error\":\"boom\"}"))
	f.Fuzz(func(t *testing.T, in []byte) {
		status, body, err := ReadResponse(bufio.NewReader(strings.NewReader(string(in))), 1024)
		if err != nil {
			return
		}
		if status < 100 || status > 999 || len(body) > 1024 {
			t.Fatalf("status %d, body of %d bytes", status, len(body))
		}
	})
}

// TestDetach: a CNI DEL names its attachment and netns in the query of the DELETE, so a
// daemon that predates attachments (it reads only the path) deregisters as before, and
// reads the answer's new fields.
func TestDetach(t *testing.T) {
	var got []string
	mux := http.NewServeMux()
	mux.HandleFunc("DELETE /v1/workloads/{id}", func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.PathValue("id")+" "+r.URL.RawQuery)
		json.NewEncoder(w).Encode(Deregistration{NetnsServed: true, ServedBy: "c1"})
	})
	c := &Client{Socket: serve(t, mux), Timeout: 2 * time.Second}
	ctx := context.Background()
	d, err := c.Detach(ctx, "x1", Detachment{Attachment: Attachment{Network: "net b", IfName: "net1"}, Netns: "/var/run/netns/p&q"})
	if err != nil || !d.NetnsServed || d.ServedBy != "c1" {
		t.Fatalf("Detach = %+v %v", d, err)
	}
	if _, err := c.Deregister(ctx, "x1"); err != nil {
		t.Fatal(err)
	}
	want := []string{"x1 ifname=net1&netns=%2Fvar%2Frun%2Fnetns%2Fp%26q&network=net+b", "x1 "}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("requests %q, want %q", got, want)
	}
}
