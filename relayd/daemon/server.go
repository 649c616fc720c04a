package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"sort"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/registry"
)

// Handler is the daemon's API (relayd/api): register, deregister, list, get, ready, status.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/workloads", d.handleRegister)
	mux.HandleFunc("DELETE /v1/workloads/{id}", d.handleDeregister)
	mux.HandleFunc("GET /v1/workloads", d.handleList)
	mux.HandleFunc("GET /v1/workloads/{id}", d.handleGet)
	mux.HandleFunc("GET /v1/ready", d.handleReady)
	mux.HandleFunc("GET /v1/status", d.handleStatus)
	mux.HandleFunc("POST /v1/reload", d.handleReload)
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, api.ErrorBody{Error: err.Error()})
}

// errConflict marks a registration refused because another workload holds its netns.
var errConflict = errors.New("conflict")

func (d *Daemon) handleRegister(w http.ResponseWriter, r *http.Request) {
	var wl api.Workload
	body := http.MaxBytesReader(w, r.Body, 1<<20)
	if err := json.NewDecoder(body).Decode(&wl); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("decode workload: %w", err))
		return
	}
	// Read to the end: from then on the server watches the connection and cancels
	// r.Context() when the client goes away, which register checks.
	_, _ = io.Copy(io.Discard, body)
	reg, err := d.register(r.Context(), wl)
	switch {
	case errors.Is(err, errAbandoned):
		writeError(w, http.StatusServiceUnavailable, err)
	case errors.Is(err, errConflict):
		writeError(w, http.StatusConflict, err)
	case errors.Is(err, errInvalid):
		writeError(w, http.StatusBadRequest, err)
	case errors.Is(err, errBudget):
		writeError(w, http.StatusServiceUnavailable, err)
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
	default:
		writeJSON(w, http.StatusOK, reg)
	}
}

var errInvalid = errors.New("invalid workload")

func validate(wl api.Workload) error {
	if err := registry.CheckWorkload(wl); err != nil {
		return fmt.Errorf("%w: %w", errInvalid, err)
	}
	return nil
}

// checkCapture refuses a capture table that is invalid or would not bring the pod's
// connections to this daemon's relay, before anything changes: one that lets another
// mark through sends the relay's own connections from the pod back to the relay (a loop
// that ends when descriptors run out), and one that redirects to another port makes
// every connection refused.
func (d *Daemon) checkCapture(wl api.Workload) error {
	c := wl.Capture
	if c == nil {
		return nil
	}
	if err := captureOf(c).Validate(); err != nil {
		return fmt.Errorf("%w %s: capture: %w", errInvalid, wl.ID, err)
	}
	if c.Mark != d.cfg.Mark {
		return fmt.Errorf("%w %s: capture mark %#x is not the daemon's %#x: the relay's own connections would be captured again (set the same mark in kl-cni's configuration and relayd.yaml)", errInvalid, wl.ID, c.Mark, d.cfg.Mark)
	}
	if c.RedirectPort != d.cfg.RedirectPort {
		return fmt.Errorf("%w %s: capture redirect port %d is not the daemon's %d: every connection would be refused (set the same redirectPort in kl-cni's configuration and relayd.yaml)", errInvalid, wl.ID, c.RedirectPort, d.cfg.RedirectPort)
	}
	return nil
}

// errAbandoned marks a registration not made because its client had gone away.
var errAbandoned = errors.New("registration abandoned")

// Register adds or refreshes a workload and returns once its listeners accept.
func (d *Daemon) Register(wl api.Workload) (api.Registration, error) {
	return d.register(context.Background(), wl)
}

// register is Register for a client that may go away, ctx ending when it does. A
// registration whose client has gone by the time it holds d.mu is not made, nor is a
// refresh: nothing of it is installed or opened, and what is registered stays as it is.
// Its client — kl-cni ADD whose timeout ran out, or that the runtime killed, while the
// request waited for enrichment or for d.mu — has failed, so the runtime's DEL for the
// sandbox follows or has already run: made after that DEL, the registration, its
// listeners and its table would outlive the sandbox until the next sweep (the listeners
// even keep its netns alive), and a stale refresh would move a newer registration of the
// same id back to the old netns. The runtime sends DEL only once ADD has ended (CNI runs
// no two commands for one container at once), so a registration that gets d.mu after
// the DEL finds its client gone (the server notices a closed connection at once; the
// runtime takes milliseconds to start DEL); one whose client goes away after it got d.mu
// is the DEL's to clean up, which d.mu orders after it.
func (d *Daemon) register(ctx context.Context, wl api.Workload) (api.Registration, error) {
	if err := validate(wl); err != nil {
		return api.Registration{}, err
	}
	if err := d.checkCapture(wl); err != nil {
		return api.Registration{}, err
	}
	dev, ino, err := netnsID(wl.Netns)
	if err != nil {
		return api.Registration{}, fmt.Errorf("%w %s: %w", errInvalid, wl.ID, err)
	}
	if wantsCapture(wl) && d.hostNetns == [2]uint64{dev, ino} { // a netns file is never inode 0: an unknown hostNetns matches none
		// A capture table there would send the node's own TCP through the relay, and
		// refuse it whenever the daemon is down (SPEC: kl never touches the host netns).
		return api.Registration{}, fmt.Errorf("%w %s: netns %s is the daemon's own (the node's): kl captures pods, never the host", errInvalid, wl.ID, wl.Netns)
	}
	wl = d.enrich(wl)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := ctx.Err(); err != nil {
		d.log.Info("registration abandoned: its client went away before it could be made (a DEL may already have released the sandbox)", "workload", wl.ID, "err", err)
		return api.Registration{}, fmt.Errorf("%w: workload %s: the client went away before it could be made: %w", errAbandoned, wl.ID, err)
	}
	for id, e := range d.regs {
		if id != wl.ID && e.NetnsDev == dev && e.NetnsIno == ino {
			return api.Registration{}, fmt.Errorf("%w: netns %s is already served for workload %s", errConflict, wl.Netns, id)
		}
	}
	start := time.Now()
	since := start.UTC()
	old, refresh := d.regs[wl.ID]
	if !refresh {
		if err := checkBudget(2); err != nil {
			return api.Registration{}, err
		}
	}
	// Same id, same netns (device and inode): a refresh, also under a new path (kl-hook
	// re-registers a netns shared by containers through a member still running when the
	// first goes); the listeners and their flows stay (relay.Refresh says when they
	// cannot), the path is the reaper's from now on. Another netns: the sandbox was
	// recreated under the same id.
	sameNetns := refresh && old.NetnsDev == dev && old.NetnsIno == ino
	if sameNetns {
		since = old.Registration.Since
	} else if refresh {
		d.relay.Close(wl.ID)
	}
	// fail returns err for a registration refused from here on. When the listeners of
	// the id's previous registration are gone by then (closed for another netns, or
	// replaced by a mode whose listeners did not open), nothing is served under the id
	// any more: the previous registration is dropped too, rather than staying listed,
	// and restored at the next start, with no listener behind it.
	fail := func(err error) (api.Registration, error) {
		if refresh && !d.relay.Serving(wl.ID) {
			d.fastRemove(wl.ID)
			delete(d.regs, wl.ID)
			if derr := d.store.Delete(wl.ID); derr != nil {
				d.log.Error("saved registration not removed", "workload", wl.ID, "err", derr)
			}
			d.log.Warn("registration refused; the previous one under its id is dropped, its listeners are closed", "workload", wl.ID, "err", err)
		}
		return api.Registration{}, err
	}
	// kl-cni's capture table first (capture.go): it stays when what follows fails, so
	// the pod fails closed.
	fastDone := false
	if wantsCapture(wl) {
		if fastDone, err = d.installCapture(wl); err != nil {
			return fail(err)
		}
	}
	var ls api.Listeners
	kept := false
	if sameNetns {
		ls, kept = d.relay.Refresh(wl)
	}
	if !kept {
		if ls, err = d.relay.Open(wl); err != nil {
			if fastDone {
				d.fastRemove(wl.ID)
			}
			return fail(err)
		}
	}
	var atts []api.Attachment
	if sameNetns {
		atts = old.Registration.Attachments
		if len(atts) == 0 && old.Registration.Workload.Source == "cni" && old.Registration.Workload.Network != "" {
			// Saved before attachments were recorded: the network it was made for is
			// its first attachment, not forgotten by the one added now.
			atts = []api.Attachment{{Network: old.Registration.Workload.Network, IfName: old.Registration.Workload.IfName}}
		}
	}
	e := registry.Entry{Registration: api.Registration{Workload: wl, Listeners: ls, Since: since, Captured: wantsCapture(wl),
		Attachments: withAttachment(atts, wl)}, NetnsDev: dev, NetnsIno: ino}
	if err := d.store.Put(e); err != nil {
		d.relay.Close(wl.ID)
		if fastDone {
			d.fastRemove(wl.ID)
		}
		return fail(err)
	}
	d.regs[wl.ID] = e
	delete(d.pending, wl.ID) // registered anew: the saved one waiting for a retry is replaced
	if !fastDone {
		d.fastRegister(wl)
	}
	d.log.Info("registered", "workload", wl.ID, "mode", wl.Mode, "source", wl.Source, "pod", wl.Namespace+"/"+wl.Name, "took", time.Since(start))
	return e.Registration, nil
}

// withAttachment returns atts with wl's CNI attachment added (a copy when it changes):
// a second ADD of the same sandbox in the same netns for another network or interface
// adds an attachment, a repeated one is a refresh. A registration that is not kl-cni's
// has none.
func withAttachment(atts []api.Attachment, wl api.Workload) []api.Attachment {
	if wl.Source != "cni" || wl.Network == "" && wl.IfName == "" {
		return nil
	}
	a := api.Attachment{Network: wl.Network, IfName: wl.IfName}
	if slices.Contains(atts, a) {
		return atts
	}
	if i := slices.IndexFunc(atts, func(x api.Attachment) bool { return x.Is(a) }); i >= 0 {
		// Recorded from an older kl-cni (no interface): this is the same attachment.
		atts = slices.Clone(atts)
		atts[i] = a
		return atts
	}
	return append(slices.Clip(atts), a)
}

// Deregister removes a workload; unknown ids are not an error.
func (d *Daemon) Deregister(id string) error {
	_, err := d.deregister(id, nil)
	return err
}

// deregister is Deregister; it also removes the capture table the daemon installed for
// the workload (capture.go), after the listeners closed, and says whether it did.
//
// With det (a kl-cni DEL: CNI keys an attachment by container id, network and
// interface), only that attachment is released: a registration that serves others
// stays, listeners, table and all, and the answer says its netns is still served. The
// registration goes when its last attachment does, or when it records none (the OCI
// hook's, or one made before attachments were recorded); det == nil (kl-hook, an older
// kl-cni) deregisters the workload whatever it serves, as before. det.Netns is checked
// against every registration that stays, by device and inode: the DEL of an ADD that was
// refused because another registration holds the netns must leave that one's table.
//
// An id that the registry refuses was never registered: kl-cni's DEL (det) of one is
// answered as for an unknown id, so that the DEL of a sandbox kl-relayd refused at ADD
// succeeds (libcni stops a DEL at the first plugin that fails, and the pod's address
// would never be freed) and learns whether the netns is served; a plain deregistration
// of one is refused, as before.
func (d *Daemon) deregister(id string, det *api.Detachment) (api.Deregistration, error) {
	valid := registry.CheckID(id) == nil
	if !valid && det == nil {
		return api.Deregistration{}, fmt.Errorf("%w: %w", errInvalid, registry.CheckID(id))
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var out api.Deregistration
	e, known := d.regs[id]
	saved, have := e, known
	if !have && valid {
		saved, have = d.waiting(id)
	}
	if have && det != nil && (det.Network != "" || det.IfName != "") && len(saved.Registration.Attachments) > 0 {
		a := det.Attachment
		left := slices.DeleteFunc(slices.Clone(saved.Registration.Attachments), func(x api.Attachment) bool { return x.Is(a) })
		if len(left) > 0 {
			if len(left) < len(saved.Registration.Attachments) {
				saved.Registration.Attachments = left
				// The workload's network is the one an older kl-cni's GC compares:
				// make it one the registration still serves.
				saved.Registration.Workload.Network = left[len(left)-1].Network
				saved.Registration.Workload.IfName = left[len(left)-1].IfName
				if err := d.store.Put(saved); err != nil {
					return api.Deregistration{}, err
				}
				if known {
					d.regs[id] = saved
				} else {
					d.pending[id] = saved // restored with the attachments it has left
				}
				d.log.Info("attachment released; the registration serves others", "workload", id, "network", a.Network, "ifname", a.IfName, "left", len(left))
			} else {
				d.log.Info("DEL for an attachment the registration does not serve; left as it is", "workload", id, "network", a.Network, "ifname", a.IfName)
			}
			out.NetnsServed, out.ServedBy = true, id
			return out, nil
		}
	}
	if valid {
		delete(d.pending, id)
		d.relay.Close(id)
		d.fastRemove(id)
		delete(d.regs, id)
		if err := d.store.Delete(id); err != nil {
			return api.Deregistration{}, err
		}
	}
	if known && e.Registration.Captured {
		out.TableRemoved = d.removeCapture(e.Registration.Workload)
	}
	if known {
		d.log.Info("deregistered", "workload", id)
	}
	if det != nil && det.Netns != "" && !out.TableRemoved {
		out.ServedBy = d.servedBy(det.Netns)
		out.NetnsServed = out.ServedBy != ""
	}
	return out, nil
}

// servedBy returns the id of the registration whose netns nsPath is (device and inode),
// registered or waiting to be restored (pending), or "" (d.mu held). A path that names
// no netns any more is served by none.
func (d *Daemon) servedBy(nsPath string) string {
	dev, ino, err := netnsID(nsPath)
	if err != nil {
		return ""
	}
	for _, m := range []map[string]registry.Entry{d.regs, d.pending} {
		for id, e := range m {
			if e.NetnsDev == dev && e.NetnsIno == ino {
				return id
			}
		}
	}
	return ""
}

// waiting returns the saved registration of id that a shortage kept from being restored
// (d.pending, or, while a re-read of the store is due, the store itself) (d.mu held).
func (d *Daemon) waiting(id string) (registry.Entry, bool) {
	if e, ok := d.pending[id]; ok {
		return e, true
	}
	if d.rescan {
		entries, _ := d.store.Load()
		for _, e := range entries {
			if e.Registration.Workload.ID == id {
				return e, true
			}
		}
	}
	return registry.Entry{}, false
}

// handleDeregister serves DELETE /v1/workloads/{id}. The query parameters network,
// ifname and netns (kl-cni's DEL, wire.Client.Detach) name the attachment released and
// the netns it names; without them the workload is deregistered whatever it serves.
func (d *Daemon) handleDeregister(w http.ResponseWriter, r *http.Request) {
	var det *api.Detachment
	if q := r.URL.Query(); q.Has("network") || q.Has("ifname") || q.Has("netns") {
		det = &api.Detachment{Attachment: api.Attachment{Network: q.Get("network"), IfName: q.Get("ifname")}, Netns: q.Get("netns")}
	}
	out, err := d.deregister(r.PathValue("id"), det)
	switch {
	case errors.Is(err, errInvalid):
		writeError(w, http.StatusBadRequest, err)
	case err != nil:
		writeError(w, http.StatusInternalServerError, err)
	default:
		writeJSON(w, http.StatusOK, out)
	}
}

// Registrations returns every registration, sorted by id.
func (d *Daemon) Registrations() []api.Registration {
	d.mu.Lock()
	out := make([]api.Registration, 0, len(d.regs))
	for _, e := range d.regs {
		out = append(out, e.Registration)
	}
	d.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Workload.ID < out[j].Workload.ID })
	return out
}

func (d *Daemon) handleList(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, d.Registrations())
}

func (d *Daemon) handleGet(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	d.mu.Lock()
	e, ok := d.regs[id]
	d.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Errorf("workload %q is not registered", id))
		return
	}
	writeJSON(w, http.StatusOK, e.Registration)
}

func (d *Daemon) handleReady(w http.ResponseWriter, _ *http.Request) {
	if !d.ready.Load() {
		writeError(w, http.StatusServiceUnavailable, errors.New("not ready: restoring registrations"))
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// recentRecords is how many decision records Status returns.
const recentRecords = 50

// Status is what `kl-ctl status` shows.
func (d *Daemon) Status() api.Status {
	d.rulesMu.Lock()
	rs, since := d.rules, d.hitsSince
	d.rulesMu.Unlock()
	d.mu.Lock()
	n := len(d.regs)
	d.mu.Unlock()
	fds, _ := fdCount()
	limit, _ := fdLimit()
	var hits []api.RuleHit
	for _, h := range d.audit.HitCounts() {
		hits = append(hits, api.RuleHit{Rule: h.Rule, Dimension: h.Dimension, Count: h.Count})
	}
	var recent []api.Decision
	for _, r := range d.audit.Recent(recentRecords) {
		recent = append(recent, api.Decision{At: r.At, Rule: r.Rule, Priority: r.Priority, Dimension: r.Dimension,
			Exit: r.Exit, Note: r.Note, Reason: r.Reason, Path: r.Path})
	}
	s := api.Status{
		Ready:      d.ready.Load(),
		StartedAt:  d.started.UTC(),
		Rules:      rs,
		Workloads:  n,
		Flows:      d.relay.Stats(),
		FDs:        fds,
		FDLimit:    limit,
		Goroutines: runtime.NumGoroutine(),
		Hits:       hits,
		HitsSince:  since,
		Recent:     recent,
	}
	dropped, werr := d.audit.WriteErr()
	s.Audit = &api.AuditStatus{Path: d.cfg.Audit.Path, Dropped: dropped}
	if werr != nil {
		s.Audit.Error = werr.Error()
	}
	d.fastStatus(&s)
	if srv := d.attach.Load(); srv != nil {
		for _, se := range srv.Sessions() {
			s.Attach = append(s.Attach, api.AttachSession{ID: se.ID, Credential: se.Credential, Client: se.Client,
				Remote: se.Remote, Scope: se.Scope, Since: se.Since, Policy: se.Policy, Flows: se.Flows, Refused: se.Refused})
		}
	}
	return s
}

func (d *Daemon) handleStatus(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, d.Status())
}

func (d *Daemon) handleReload(w http.ResponseWriter, _ *http.Request) {
	if err := d.Reload(); err != nil {
		writeError(w, http.StatusUnprocessableEntity, err)
		return
	}
	writeJSON(w, http.StatusOK, d.Status().Rules)
}

// fdReserve is the headroom of descriptors kept for flows, the API and the state
// directory: a registration that would eat into it is refused with a clear reason rather
// than letting accept fail with EMFILE later.
const fdReserve = 256

// checkBudget refuses a new listener when the process is close to its descriptor limit.
func checkBudget(newFDs int) error {
	limit, err := fdLimit()
	if err != nil || limit == 0 {
		return nil
	}
	n, err := fdCount()
	if err != nil {
		return nil
	}
	if uint64(n+newFDs+fdReserve) > limit {
		return fmt.Errorf("%w: %d of %d descriptors in use; raise LimitNOFILE of kl-relayd", errBudget, n, limit)
	}
	return nil
}

var errBudget = errors.New("descriptor budget exhausted")
