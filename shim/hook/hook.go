// Package hook is kl-hook, the OCI hook kl-runtime adds to every container it edits.
//
// At createRuntime (`kl-hook create`), once the container's namespaces exist, it makes
// sure the container's network namespace is served by kl-relayd: unless some registration
// (kl-cni's for a Kubernetes pod, another container's sharing the netns) already covers
// that netns, it registers the container and, in transparent mode, installs the nftables
// capture through netns/. A registration in another mode than the container's fails the
// start (ErrModeMismatch). At poststop (`kl-hook delete`) it removes its own registration,
// unless other containers still use its netns (share.go): then the registration stays,
// served through one of them, and the last one's poststop removes it.
// Host-network containers are left alone, with a log line. Any failure fails container
// creation (fail closed) unless the operator set failOpen.
//
// As a hook it reads the OCI state from stdin and never writes to stdout; `kl-hook check`,
// run by hand, reports on stdout whether the node's settings work.
package hook

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/shim/config"
	"github.com/kl-egress/kl/shim/workload"
)

// Relay is the part of api.Client the hook uses.
type Relay interface {
	Register(ctx context.Context, w api.Workload) (api.Registration, error)
	Deregister(ctx context.Context, id string) error
	Get(ctx context.Context, id string) (api.Registration, bool, error)
	List(ctx context.Context) ([]api.Registration, error)
}

// Test seams.
var (
	newRelay = func(cfg *config.Config) Relay { return api.NewClient(cfg.RelaySocket, cfg.RelayTimeout) }
	backend  netns.Backend // nil: the real nftables backend
	procRoot = "/proc"
	hostNet  = "/proc/self/ns/net"
	sameNs   = netns.SameNetns
	lookup   = func(cfg *config.Config) workloadLookup { return workload.Docker(cfg, 0) }
)

type workloadLookup = workload.Lookup

// Run is kl-hook's main: args are os.Args, stdin carries the OCI state. `kl-hook check`
// (run by hand) reports whether the settings work and writes the report to stdout.
func Run(ctx context.Context, args []string, stdin io.Reader) error {
	return run(ctx, args, stdin, os.Stdout)
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("kl-hook", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfgPath := fs.String("config", "", "kl runtime settings file (default $"+config.EnvPath+" or "+config.DefaultPath+")")
	mode := fs.String("mode", "", "egress mode kl-runtime chose for this container")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("usage: kl-hook [--config FILE] [--mode MODE] create|delete|check: %w", err)
	}
	if fs.NArg() != 1 || (fs.Arg(0) != "create" && fs.Arg(0) != "delete" && fs.Arg(0) != "check") {
		return fmt.Errorf("usage: kl-hook [--config FILE] [--mode MODE] create|delete|check (got %q)", fs.Args())
	}
	if *mode != "" && !config.ValidMode(*mode) {
		return fmt.Errorf("--mode %q: want env, proxy or transparent", *mode)
	}
	cfg, err := config.Load(config.Resolve(*cfgPath))
	if err != nil {
		return err
	}
	if fs.Arg(0) == "check" {
		return Check(ctx, cfg, newRelay(cfg), stdout)
	}
	log, fileLog, closeLog := cfg.Logger("kl-hook")
	defer closeLog()
	st, err := ParseState(stdin)
	if err != nil {
		return err
	}
	h := &Hook{Config: cfg, Relay: newRelay(cfg), Log: log.With("id", st.ID, "stage", fs.Arg(0)), Shares: SharesDir(cfg)}
	if fs.Arg(0) == "create" {
		err = h.Create(ctx, st, *mode)
	} else {
		err = h.Delete(ctx, st)
	}
	if err != nil && cfg.FailOpen {
		h.Log.Error("failOpen: continuing without kl", "err", err)
		return nil
	}
	if err != nil {
		fileLog.Error("hook failed", "id", st.ID, "stage", fs.Arg(0), "err", err)
		if fs.Arg(0) == "create" && errors.Is(err, api.ErrUnreachable) {
			err = fmt.Errorf("%w; egress capture fails closed, so the container does not start (failOpen in %s starts it uncaptured)", err, cfg.Path())
		}
	}
	return err
}

// ErrModeMismatch marks a container whose network namespace is already registered in
// another egress mode than the one kl-runtime set the container up for.
var ErrModeMismatch = errors.New("egress mode mismatch")

// Hook holds what one hook run needs.
type Hook struct {
	Config *config.Config
	Relay  Relay
	Log    *slog.Logger
	// Shares is the directory of share records (SharesDir); "" keeps none, and the
	// registrant's poststop then deregisters a netns other containers still use.
	Shares string
}

// Create covers the container's netns, if no registration does yet.
func (h *Hook) Create(ctx context.Context, st State, mode string) error {
	if st.Pid <= 0 {
		return fmt.Errorf("%w: createRuntime state without a pid", ErrBadState)
	}
	info, err := workload.Identify(ctx, h.Config, st.ID, st.Annotations, lookup(h.Config), h.Log)
	if err != nil {
		return err
	}
	if info.Exempt != "" {
		h.Log.Info("exempt: not captured", "why", info.Exempt)
		return nil
	}
	if mode == "" {
		mode = info.Mode
	}
	if mode == api.ModeEnv {
		h.Log.Debug("env mode: nothing to set up")
		return nil
	}
	nsPath := nsPathOf(st.Pid)
	host, err := sameNs(nsPath, hostNet)
	if err != nil {
		return fmt.Errorf("container %s: network namespace of pid %d: %w", st.ID, st.Pid, err)
	}
	if host {
		h.Log.Warn("host network: container shares the node's network namespace; not captured", "mode", mode)
		return nil
	}
	if h.Shares != "" {
		// From the lookup to the record: a poststop must not deregister the netns
		// between this container finding the registration and joining it.
		unlock, err := lockShares(h.Shares)
		if err != nil {
			return fmt.Errorf("container %s: %w", st.ID, err)
		}
		defer unlock()
		pruneShares(h.Shares, h.Log)
	}
	regs, err := h.Relay.List(ctx)
	if err != nil {
		return fmt.Errorf("container %s: list relay registrations: %w", st.ID, err)
	}
	w := api.Workload{
		ID: st.ID, Netns: nsPath, Mode: mode, Source: "hook",
		Namespace: info.Namespace, Name: info.Name, Labels: info.Labels,
		Annotations: st.Annotations, Image: info.Image,
	}
	var reg api.Registration
	registered := false
	for _, r := range regs {
		if r.Workload.Netns == "" {
			continue
		}
		same, err := sameNs(r.Workload.Netns, nsPath)
		if err != nil || !same {
			continue // another netns, or a stale registration whose netns is gone
		}
		if r.Workload.Source == "hook" {
			// The hook names a netns by /proc/PID/ns/net, and the pid may be another
			// process's by now: a container that ended without a poststop leaves its
			// registration behind, and when a new container's init gets its pid, the
			// path names the new netns while the relay still serves the old one. Only
			// the relay can tell, comparing the namespaces themselves (it holds the
			// ones it serves open, so theirs cannot be reused): it refuses to register
			// this container (409) only when another registration serves its netns.
			// A registration under this container's own id, left from an earlier
			// start, is refreshed below like any.
			if r.Workload.ID == st.ID {
				continue
			}
			if reg, err = h.Relay.Register(ctx, w); err == nil {
				registered = true
				break
			}
			if !alreadyServed(err) {
				return fmt.Errorf("container %s: register with kl-relayd: %w", st.ID, err)
			}
		}
		if r.Workload.Mode != mode {
			// Fail closed rather than adopt the registered mode: kl-runtime has already
			// fixed the container's environment for its own mode, and no adoption makes
			// that safe. A proxy-mode registration has no capture table, so a container
			// set up as transparent (no proxy variables) would send everything direct,
			// unclassified; a transparent-mode registration has no proxy listeners, so a
			// container set up as proxy would point its variables at nothing. Installing
			// a capture here would rewrite a netns kl-cni owns behind its back.
			from := "kl-runtime's --mode"
			if mode == info.Mode {
				from = info.ModeFrom
			}
			return fmt.Errorf("%w: container %s: its network namespace is registered (%s, %s) in mode %q, but kl-runtime set the container up for mode %q (from %s); "+
				"on containerd this means the runtime does not pass the pod annotation %s to the container (pod_annotations; re-run kl-ctl install containerd and restart containerd)",
				ErrModeMismatch, st.ID, r.Workload.Source, r.Workload.ID, r.Workload.Mode, mode, from, api.LabelMode)
		}
		if r.Workload.Source == "hook" && r.Workload.ID != st.ID && h.Shares != "" {
			if err := h.join(r, st); err != nil {
				return fmt.Errorf("container %s: record that it shares the network namespace of %s: %w", st.ID, r.Workload.ID, err)
			}
			h.Log.Info("netns already registered by another container; shared", "registered_id", r.Workload.ID, "mode", mode)
			return nil
		}
		h.Log.Info("netns already registered; left as it is", "registered_id", r.Workload.ID, "source", r.Workload.Source, "mode", mode)
		return nil
	}
	if !registered {
		if reg, err = h.Relay.Register(ctx, w); err != nil {
			return fmt.Errorf("container %s: register with kl-relayd: %w", st.ID, err)
		}
	}
	if mode == api.ModeTransparent {
		c, err := h.capture(reg)
		if err == nil {
			err = install(nsPath, c)
		}
		if err != nil {
			if derr := h.Relay.Deregister(ctx, st.ID); derr != nil {
				h.Log.Warn("roll back registration", "err", derr)
			}
			return fmt.Errorf("container %s: capture: %w", st.ID, err)
		}
	}
	h.Log.Info("registered", "mode", mode, "netns", nsPath, "engine", info.Engine, "image", info.Image,
		"redirect", reg.Listeners.Redirect, "http", reg.Listeners.HTTP, "socks", reg.Listeners.SOCKS)
	return nil
}

// alreadyServed reports whether kl-relayd refused a registration because another
// registration serves its netns.
func alreadyServed(err error) bool {
	var he *api.HTTPError
	return errors.As(err, &he) && he.Status == http.StatusConflict
}

// Delete removes the registration this hook made for the container, if any, once no
// other container uses its netns. A registration made by kl-cni (same id, other source)
// belongs to kl-cni's DEL.
func (h *Hook) Delete(ctx context.Context, st State) error {
	if h.Shares != "" {
		unlock, err := lockShares(h.Shares)
		if err != nil {
			return fmt.Errorf("container %s: %w", st.ID, err)
		}
		defer unlock()
		regID, s, ok, err := findShare(h.Shares, st.ID, h.Log)
		if err != nil {
			return fmt.Errorf("container %s: %w", st.ID, err)
		}
		if ok {
			return h.leave(ctx, st, regID, s)
		}
	}
	return h.deregister(ctx, st.ID, st.ID)
}

// deregister removes registration regID if the hook made it; container id is the one
// whose poststop this is.
func (h *Hook) deregister(ctx context.Context, id, regID string) error {
	reg, found, err := h.Relay.Get(ctx, regID)
	if err != nil {
		return fmt.Errorf("container %s: look up registration %s: %w", id, regID, err)
	}
	if !found {
		h.Log.Debug("not registered", "registered_id", regID)
		return nil
	}
	if reg.Workload.Source != "hook" {
		h.Log.Info("registration belongs to another source; left as it is", "registered_id", regID, "source", reg.Workload.Source)
		return nil
	}
	if err := h.Relay.Deregister(ctx, regID); err != nil {
		return fmt.Errorf("container %s: deregister %s: %w", id, regID, err)
	}
	h.Log.Info("deregistered", "registered_id", regID)
	return nil
}

// join adds container st to the share record of registration r, starting the record
// (with r's own container, when its netns path names a pid) if there is none.
func (h *Hook) join(r api.Registration, st State) error {
	regID := r.Workload.ID
	s, found, err := loadShare(h.Shares, regID)
	if err != nil {
		return err
	}
	if !found {
		s.Workload = r.Workload
		if pid := pidOf(r.Workload.Netns); pid > 0 {
			if m, err := memberOf(regID, pid); err == nil {
				s.Members = append(s.Members, m)
			}
		}
	}
	m, err := memberOf(st.ID, st.Pid)
	if err != nil {
		return err
	}
	s.Members = slices.DeleteFunc(s.Members, func(o member) bool { return o.ID == st.ID })
	s.Members = append(s.Members, m)
	return saveShare(h.Shares, regID, s)
}

// leave takes container st out of the share record of registration regID. The last one
// out deregisters; otherwise the registration stays, re-registered through a container
// still running when the netns path it names is gone (or kl-relayd already dropped it).
// Members whose process is gone without a poststop are dropped on the way.
func (h *Hook) leave(ctx context.Context, st State, regID string, s share) error {
	var left []member
	var ids []string
	for _, m := range s.Members {
		if m.ID != st.ID && m.alive() {
			left = append(left, m)
			ids = append(ids, m.ID)
		}
	}
	if len(left) == 0 {
		if err := h.deregister(ctx, st.ID, regID); err != nil {
			return err
		}
		return removeShare(h.Shares, regID)
	}
	reg, found, err := h.Relay.Get(ctx, regID)
	if err != nil {
		return fmt.Errorf("container %s: look up registration %s: %w", st.ID, regID, err)
	}
	if found && reg.Workload.Source != "hook" {
		h.Log.Info("registration belongs to another source; left as it is", "registered_id", regID, "source", reg.Workload.Source)
		return removeShare(h.Shares, regID)
	}
	if found {
		s.Workload = reg.Workload
	}
	served := found && slices.ContainsFunc(left, func(m member) bool { return nsPathOf(m.Pid) == reg.Workload.Netns })
	if !served {
		w := s.Workload
		w.Netns = nsPathOf(left[0].Pid)
		if _, err := h.Relay.Register(ctx, w); err != nil {
			return fmt.Errorf("container %s: keep registration %s for %s, which share its network namespace: %w", st.ID, regID, strings.Join(ids, ", "), err)
		}
		s.Workload = w
	}
	s.Members = left
	if err := saveShare(h.Shares, regID, s); err != nil {
		return fmt.Errorf("container %s: %w", st.ID, err)
	}
	h.Log.Info("netns still used by other containers; registration kept", "registered_id", regID, "users", ids, "netns", s.Workload.Netns)
	return nil
}

func (h *Hook) capture(reg api.Registration) (netns.Capture, error) {
	return h.Config.Capture.Netns(cmp.Or(reg.Listeners.Redirect, api.DefaultRedirectPort))
}

func install(nsPath string, c netns.Capture) error {
	if backend != nil {
		return netns.InstallWith(backend, nsPath, c)
	}
	return netns.Install(nsPath, c)
}
