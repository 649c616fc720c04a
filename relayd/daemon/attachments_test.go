package daemon

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/config"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestDeregisterAttachments: kl-cni's DEL releases one CNI attachment (container id,
// network, interface), and the registration, its listeners and its table stay while
// the sandbox has another; a DEL whose netns another registration serves (the DEL of an
// ADD refused with a conflict) leaves that registration alone and says the netns is
// served, so kl-cni leaves its table. A DEL without attachment (kl-hook, an older kl-cni)
// deregisters as before.
func TestDeregisterAttachments(t *testing.T) {
	testutil.RequireTool(t, "nft")
	type step struct {
		op      string // "add" (body: network/ifname), "del" (query: network/ifname; "-": none)
		id      string
		network string
		ifname  string
		want    int  // HTTP status
		served  bool // del: the answer says the netns is still served
	}
	long := strings.Repeat("a", 251)
	tests := []struct {
		name  string
		steps []step
		want  []api.Attachment // c1's attachments at the end; nil: c1 not registered
	}{
		{"two networks, DEL of one", []step{
			{"add", "c1", "rcnet", "eth0", 200, false},
			{"add", "c1", "netB", "net1", 200, false},
			{"del", "c1", "netB", "net1", 200, true},
		}, []api.Attachment{{Network: "rcnet", IfName: "eth0"}}},
		{"two networks, DEL of both", []step{
			{"add", "c1", "rcnet", "eth0", 200, false},
			{"add", "c1", "netB", "net1", 200, false},
			{"del", "c1", "netB", "net1", 200, true},
			{"del", "c1", "rcnet", "eth0", 200, false},
		}, nil},
		{"repeated ADD is a refresh", []step{
			{"add", "c1", "rcnet", "eth0", 200, false},
			{"add", "c1", "rcnet", "eth0", 200, false},
			{"del", "c1", "rcnet", "eth0", 200, false},
		}, nil},
		{"DEL of an attachment never added", []step{
			{"add", "c1", "rcnet", "eth0", 200, false},
			{"del", "c1", "netB", "net1", 200, true},
		}, []api.Attachment{{Network: "rcnet", IfName: "eth0"}}},
		{"DEL without attachment deregisters", []step{
			{"add", "c1", "rcnet", "eth0", 200, false},
			{"add", "c1", "netB", "net1", 200, false},
			{"del", "c1", "-", "", 200, false},
		}, nil},
		{"DEL after a conflicting ADD", []step{
			{"add", "c1", "rcnet", "eth0", 200, false},
			{"add", "x1", "rcnet", "eth0", http.StatusConflict, false},
			{"del", "x1", "rcnet", "eth0", 200, true},
		}, []api.Attachment{{Network: "rcnet", IfName: "eth0"}}},
		{"DEL of an id the registry refuses", []step{
			{"add", "c1", "rcnet", "eth0", 200, false},
			{"del", long, "rcnet", "eth0", 200, true},
			{"del", long, "-", "", http.StatusBadRequest, false},
		}, []api.Attachment{{Network: "rcnet", IfName: "eth0"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t, t.TempDir())
			d, logs := attachDaemon(t, cfg)
			ns := testutil.NewNetns(t, "klatt")
			t.Cleanup(func() { _ = d.Deregister("c1") })
			h := d.Handler()
			for i, s := range tt.steps {
				req := delRequest(s.id, s.network, s.ifname, ns.Path)
				if s.op == "add" {
					req = addRequest(t, cniWorkload(cfg, s.id, ns.Path, s.network, s.ifname))
				}
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != s.want {
					t.Fatalf("step %d (%s %s %s/%s) = %d %s, want %d; logs:\n%s", i, s.op, s.id, s.network, s.ifname, rec.Code, rec.Body, s.want, logs.String())
				}
				if s.op == "del" && s.want == 200 {
					var out api.Deregistration
					if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
						t.Fatal(err)
					}
					if out.NetnsServed != s.served || s.served && out.ServedBy != "c1" || s.served && out.TableRemoved {
						t.Errorf("step %d (del %s %s/%s) answered %+v, want netns served %v (by c1)", i, s.id, s.network, s.ifname, out, s.served)
					}
				}
			}

			regs := d.Registrations()
			entries, errs := mustStore(t, cfg).Load()
			_, tableErr := ns.Command("nft", "list", "table", "inet", netns.TableName).CombinedOutput()
			listens, err := listeningIn(ns.Path, cfg.RedirectPort)
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == nil {
				if len(regs) != 0 || len(entries) != 0 || len(errs) != 0 || tableErr == nil || listens {
					t.Errorf("left: registrations %+v, stored %+v %v, table %v, listening %v", regs, entries, errs, tableErr == nil, listens)
				}
				return
			}
			if len(regs) != 1 || regs[0].Workload.ID != "c1" || !slices.Equal(regs[0].Attachments, tt.want) {
				t.Fatalf("registrations %+v, want c1 with attachments %v", regs, tt.want)
			}
			// Persisted, so a restart keeps them; the network an older kl-cni's GC compares
			// is one still served.
			if len(entries) != 1 || !slices.Equal(entries[0].Registration.Attachments, tt.want) {
				t.Errorf("stored %+v %v, want c1 with attachments %v", entries, errs, tt.want)
			}
			if w := regs[0].Workload; w.Network != tt.want[len(tt.want)-1].Network {
				t.Errorf("registered network %q, want %q", w.Network, tt.want[len(tt.want)-1].Network)
			}
			if tableErr != nil || !listens {
				t.Errorf("c1's capture table present %v, relay listening %v; want both", tableErr == nil, listens)
			}
		})
	}
}

// attachDaemon is a daemon for the attachment tests, not serving (its Handler is called
// directly), and its log.
func attachDaemon(t *testing.T, cfg *config.Config) (*Daemon, *bytes.Buffer) {
	t.Helper()
	var logs bytes.Buffer
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return d, &logs
}

// cniWorkload is kl-cni's registration of sandbox id in nsPath for one attachment.
func cniWorkload(cfg *config.Config, id, nsPath, network, ifname string) api.Workload {
	return api.Workload{ID: id, Netns: nsPath, Mode: api.ModeTransparent, Source: "cni", Network: network, IfName: ifname,
		Capture: &api.Capture{RedirectPort: cfg.RedirectPort, Mark: cfg.Mark, IPv6: true, RejectQUIC: true}}
}

// addRequest is kl-cni's ADD of w; delRequest its DEL of one attachment (network "-":
// a DEL that names none, as kl-hook's and an older kl-cni's).
func addRequest(t *testing.T, w api.Workload) *http.Request {
	t.Helper()
	body, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	return httptest.NewRequest(http.MethodPost, "/v1/workloads", bytes.NewReader(body))
}

func delRequest(id, network, ifname, nsPath string) *http.Request {
	path := "/v1/workloads/" + url.PathEscape(id)
	if network != "-" {
		path += "?" + url.Values{"network": {network}, "ifname": {ifname}, "netns": {nsPath}}.Encode()
	}
	return httptest.NewRequest(http.MethodDelete, path, nil)
}

// attAdd and attDel are addRequest and delRequest that must succeed.
func attAdd(t *testing.T, h http.Handler, w api.Workload) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, addRequest(t, w))
	if rec.Code != 200 {
		t.Fatalf("add %+v: %d %s", w, rec.Code, rec.Body)
	}
}

func attDel(t *testing.T, h http.Handler, id, network, ifname, nsPath string) api.Deregistration {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, delRequest(id, network, ifname, nsPath))
	if rec.Code != 200 {
		t.Fatalf("del: %d %s", rec.Code, rec.Body)
	}
	var out api.Deregistration
	_ = json.Unmarshal(rec.Body.Bytes(), &out)
	return out
}
