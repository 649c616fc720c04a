package docker

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"testing"
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
