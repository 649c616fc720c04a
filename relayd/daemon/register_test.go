package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestRegisterAfterDel: CNI ADD and DEL of one sandbox, in every order the daemon can
// see them. An ADD whose client gave up (kl-cni's timeout ran out, or the runtime killed
// it) while its request waited, and that the daemon gets to only after the runtime's DEL
// ran, must make nothing: no registration, no listeners, no capture table, and it must
// leave a newer registration of the same id alone.
func TestRegisterAfterDel(t *testing.T) {
	testutil.RequireTool(t, "nft")
	const id = "sandbox-race"
	type step struct {
		op    string // "add" (the client waits for the answer), "stale-add" (it has gone), "del"
		netns int    // index into the test's netns
		want  int    // HTTP status
	}
	tests := []struct {
		name  string
		steps []step
		want  int // index of the netns the id is registered and captured in at the end; -1: none
	}{
		{"ADD then DEL", []step{{"add", 0, http.StatusOK}, {"del", 0, http.StatusOK}}, -1},
		{"DEL then the stale ADD", []step{{"del", 0, http.StatusOK}, {"stale-add", 0, http.StatusServiceUnavailable}}, -1},
		{"DEL twice around the stale ADD", []step{{"del", 0, http.StatusOK}, {"stale-add", 0, http.StatusServiceUnavailable}, {"del", 0, http.StatusOK}}, -1},
		{"sandbox recreated, then the stale ADD of the old one", []step{
			{"del", 0, http.StatusOK}, {"add", 1, http.StatusOK}, {"stale-add", 0, http.StatusServiceUnavailable},
		}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, t.TempDir())
			var logs bytes.Buffer
			d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			nss := []*testutil.Netns{testutil.NewNetns(t, "klrace"), testutil.NewNetns(t, "klrace")}
			t.Cleanup(func() { _ = d.Deregister(id) })
			h := d.Handler()
			for i, s := range tt.steps {
				var req *http.Request
				switch s.op {
				case "del":
					req = httptest.NewRequest(http.MethodDelete, "/v1/workloads/"+id, nil)
				case "add", "stale-add":
					w := api.Workload{ID: id, Netns: nss[s.netns].Path, Mode: api.ModeTransparent, Source: "cni",
						Capture: &api.Capture{RedirectPort: cfg.RedirectPort, Mark: cfg.Mark, IPv6: true, RejectQUIC: true}}
					body, err := json.Marshal(w)
					if err != nil {
						t.Fatal(err)
					}
					req = httptest.NewRequest(http.MethodPost, "/v1/workloads", bytes.NewReader(body))
					if s.op == "stale-add" {
						ctx, cancel := context.WithCancel(req.Context())
						cancel()
						req = req.WithContext(ctx)
					}
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != s.want {
					t.Errorf("step %d (%s in netns %d) = %d %s, want %d; logs:\n%s", i, s.op, s.netns, rec.Code, rec.Body, s.want, logs.String())
				}
			}

			regs := d.Registrations()
			entries, errs := mustStore(t, cfg).Load()
			switch {
			case tt.want < 0 && (len(regs) != 0 || len(entries) != 0 || len(errs) != 0):
				t.Errorf("left registered: %+v, stored: %+v %v", regs, entries, errs)
			case tt.want >= 0 && (len(regs) != 1 || regs[0].Workload.Netns != nss[tt.want].Path || len(entries) != 1):
				t.Errorf("registrations %+v, stored %+v; want one, in %s", regs, entries, nss[tt.want].Path)
			}
			for i, ns := range nss {
				_, tableErr := ns.Command("nft", "list", "table", "inet", netns.TableName).CombinedOutput()
				listens, err := listeningIn(ns.Path, cfg.RedirectPort)
				if err != nil {
					t.Fatal(err)
				}
				if want := i == tt.want; (tableErr == nil) != want || listens != want {
					t.Errorf("netns %d: capture table present %v, relay listening %v; want %v", i, tableErr == nil, listens, want)
				}
			}
		})
	}
}

// listeningIn says whether something accepts TCP on 127.0.0.1:port in the netns (the
// relay resets what it accepts there: only a refusal means "not listening").
func listeningIn(nsPath string, port uint16) (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := netns.Dial(ctx, nsPath, 0, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if errors.Is(err, syscall.ECONNREFUSED) {
		return false, nil
	}
	if c != nil {
		c.Close()
	}
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		return false, fmt.Errorf("dial 127.0.0.1:%d in %s: %w", port, nsPath, err)
	}
	return true, nil
}
