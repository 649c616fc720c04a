package docker

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestLookup(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var gotQuery string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/containers/json" {
			http.NotFound(w, r)
			return
		}
		gotQuery = r.URL.Query().Get("filters")
		// dockerd's id filter matches prefixes: answer with a near miss first.
		w.Write([]byte(`[{"Id":"abc1","Names":["/other"],"Image":"x"},
			{"Id":"abc","Names":["/web"],"Image":"nginx","ImageID":"sha256:1","Labels":{"kl.route":"proxy"},"Extra":1}]`))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	c := Client{Socket: sock}
	ct, found, err := c.Lookup(context.Background(), "abc")
	if err != nil || !found {
		t.Fatalf("Lookup(abc) = %v, %v", found, err)
	}
	if ct.Name() != "web" || ct.Image != "nginx" || ct.Labels["kl.route"] != "proxy" {
		t.Errorf("Lookup(abc) = %+v", ct)
	}
	if gotQuery != `{"id":["abc"]}` {
		t.Errorf("filters = %s", gotQuery)
	}
	if _, found, err := c.Lookup(context.Background(), "zzz"); err != nil || found {
		t.Errorf("Lookup(zzz) = %v, %v, want not found", found, err)
	}
	_, _, err = Client{Socket: filepath.Join(t.TempDir(), "none.sock")}.Lookup(context.Background(), "abc")
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Lookup on a missing socket: %v, want ErrUnavailable", err)
	}
}

func TestFindBad(t *testing.T) {
	for _, in := range []string{``, `{}`, `[1]`, `nope`} {
		if _, _, err := Find([]byte(in), "x"); err == nil {
			t.Errorf("Find(%q): no error", in)
		}
	}
}

// Only a node without a Docker engine (no socket, or nothing listening on it) gives
// ErrUnavailable; an engine that does not answer in time is an error of its own, since
// the container asked about may be its.
func TestLookupUnavailable(t *testing.T) {
	dir := t.TempDir()
	refused := filepath.Join(dir, "refused.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: refused}); err != nil { // bound, never listening
		t.Fatal(err)
	}
	silent := filepath.Join(dir, "silent.sock")
	ln, err := net.Listen("unix", silent)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accepts and never answers, as a hung dockerd
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	tests := []struct {
		name        string
		socket      string
		unavailable bool
	}{
		{"no socket", filepath.Join(dir, "none.sock"), true},
		{"nothing listening", refused, true},
		{"engine silent", silent, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, found, err := Client{Socket: tt.socket, Timeout: 200 * time.Millisecond}.Lookup(context.Background(), "abc")
			if err == nil || found || errors.Is(err, ErrUnavailable) != tt.unavailable {
				t.Errorf("Lookup = %v, %v; want an error, ErrUnavailable: %v", found, err, tt.unavailable)
			}
		})
	}
}

// At startup dockerd starts --restart containers before it serves its API, on a socket
// that already listens (or that systemd's docker.socket holds): a lookup then gets no
// answer, and the container's own record in the data root, written when it was created,
// says who it is. Without the record the lookup fails as before, naming both.
func TestLookupRecord(t *testing.T) {
	const id = "4c5e9a1f0b3d27e8c6f1a2b9d0e4f7a3c8b5d1e6f9a0b2c4d7e8f1a3b5c6d9e0"
	sock := filepath.Join(t.TempDir(), "docker.sock")
	ln, err := net.Listen("unix", sock) // never accepts: dockerd still starting containers
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	root := t.TempDir()
	rec, err := os.ReadFile("testdata/config.v2.json")
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "containers", id), 0o700)
	if err := os.WriteFile(filepath.Join(root, "containers", id, "config.v2.json"), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	c := Client{Socket: sock, Root: root, Timeout: 200 * time.Millisecond}
	ct, found, err := c.Lookup(context.Background(), id)
	if err != nil || !found {
		t.Fatalf("Lookup(%s) = %v, %v; want the container from its record", id, found, err)
	}
	if ct.ID != id || ct.Name() != "web" || ct.Image != "nginx:1.27" || ct.ImageID != "sha256:b52e0b094bc0e26c9eddc9e4ab7a64ce0033c3360d8b7ad4ff4132c4e03e8f7b" ||
		ct.Labels["kl.egress.mode"] != "proxy" || ct.Labels["kl.route"] != "web" {
		t.Errorf("Lookup(%s) = %+v", id, ct)
	}

	other := "0" + id[1:]
	_, found, err = c.Lookup(context.Background(), other)
	recPath := filepath.Join(root, "containers", other, "config.v2.json")
	if err == nil || found || errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), recPath) {
		t.Errorf("Lookup without a record = %v, %v; want an error naming %s and %s", found, err, sock, recPath)
	}
	// A record that is not the container's own (a path trick, a copied file) is refused.
	os.MkdirAll(filepath.Dir(recPath), 0o700)
	os.WriteFile(recPath, rec, 0o600)
	if _, found, err := c.Lookup(context.Background(), other); err == nil || found {
		t.Errorf("Lookup with another container's record = %v, %v; want an error", found, err)
	}
}
