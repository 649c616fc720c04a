package docker

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
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
