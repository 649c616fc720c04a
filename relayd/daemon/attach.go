package daemon

import (
	"context"
	"fmt"
	"net"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/attach"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/rules"
)

// clientExit is the relay's `client` exit: the flow goes over a live attach session
// allowed to carry the workload, or is refused with the reason (the relay resets it and
// audits the reason). It is never sent by another exit.
func (d *Daemon) clientExit(ctx context.Context, w *api.Workload, dst relay.Dest) (net.Conn, error) {
	if s := d.attach.Load(); s != nil {
		return s.Exit()(ctx, w, dst)
	}
	return attach.Off()(ctx, w, dst)
}

// EnableAttach reads the attach listener's settings (attach.DefaultSettingsPath unless
// named; a missing default file leaves the listener off) and prepares the listener; Serve
// opens it. Call it before Serve.
func (d *Daemon) EnableAttach(path string, named bool) error {
	s, err := attach.LoadSettings(path, named)
	if err != nil || !s.Enabled() {
		return err
	}
	srv, err := attach.NewServer(attach.ServerOptions{Settings: s, Policy: d.policy.Load, Log: d.log.With("part", "attach"), IdleTimeout: d.cfg.IdleTimeout})
	if err != nil {
		return err
	}
	d.attach.Store(srv)
	d.attachListen = s.Listen
	return nil
}

// serveAttach opens the attach listener when one is configured; stop closes it and every
// session.
func (d *Daemon) serveAttach(ctx context.Context) (stop func(), err error) {
	srv := d.attach.Load()
	if srv == nil {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", d.attachListen)
	if err != nil {
		return nil, fmt.Errorf("attach listener: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	d.log.Info("attach listener", "addr", ln.Addr().String())
	return func() { cancel(); <-done }, nil
}

// attachReload hands reloaded rules to the attach sessions, off the reload path.
func (d *Daemon) attachReload() {
	if s := d.attach.Load(); s != nil {
		go s.Reload()
	}
}

// checkAttach is `kl-relayd check` for the attach listener's settings.
func checkAttach(path string, named bool) (string, error) {
	s, err := attach.LoadSettings(path, named)
	if err != nil {
		return "", err
	}
	if !s.Enabled() {
		return "attach listener off", nil
	}
	if _, err := attach.NewServer(attach.ServerOptions{Settings: s, Policy: func() *rules.Policy { return nil }}); err != nil {
		return "", err
	}
	return fmt.Sprintf("attach ok: listen %s, %d credentials", s.Listen, len(s.Credentials)), nil
}
