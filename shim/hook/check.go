package hook

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kl-egress/kl/relayd/publish"
	"github.com/kl-egress/kl/shim/config"
	"github.com/kl-egress/kl/shim/docker"
)

// Check proves a node's wrapper settings work, building what a container create would
// use: the real runtime, the hook, the rules file, the relay and the Docker API. It
// writes one line per item to out and fails when a container create would fail.
func Check(ctx context.Context, cfg *config.Config, relay Relay, out io.Writer) error {
	var failed []string
	line := func(ok bool, what, detail string) {
		mark := "ok  "
		if !ok {
			mark = "FAIL"
			failed = append(failed, what)
		}
		fmt.Fprintf(out, "%s %-8s %s\n", mark, what, detail)
	}
	src := cfg.Path()
	if src == "" {
		src = config.DefaultPath + " (absent: defaults)"
	}
	fmt.Fprintf(out, "ok   config   %s (node mode %s, failOpen %v)\n", src, cfg.Mode, cfg.FailOpen)

	if p, err := cfg.RealRuntime(); err != nil {
		line(false, "runtime", err.Error())
	} else {
		line(true, "runtime", p)
	}
	if fi, err := os.Stat(cfg.Hook); err != nil {
		line(false, "hook", err.Error())
	} else if fi.Mode().Perm()&0o111 == 0 || !fi.Mode().IsRegular() {
		line(false, "hook", cfg.Hook+" is not an executable file")
	} else {
		line(true, "hook", cfg.Hook)
	}
	var pubErr error
	if cfg.PublishedRules == "-" {
		pubErr = errors.New("publishedRules: -")
	} else if cfg.PublishedRules != "" {
		pubErr = publish.Check(cfg.PublishedRules)
	}
	switch {
	case cfg.Rules == "-":
		fmt.Fprintln(out, "ok   rules    not mounted (rules: -)")
	case pubErr == nil:
		line(true, "rules", cfg.PublishedRules+" -> "+config.ContainerRulesDir+" (read-only, follows reloads)")
	default:
		if f, err := os.Open(cfg.Rules); err != nil {
			line(false, "rules", err.Error())
		} else {
			f.Close()
			fmt.Fprintf(out, "warn rules    %s -> %s (read-only, pinned at container start: published directory unavailable: %v)\n",
				cfg.Rules, config.ContainerRulesPath, pubErr)
		}
	}
	if regs, err := relay.List(ctx); err != nil {
		if cfg.FailOpen {
			fmt.Fprintf(out, "warn relay    %v (failOpen: containers start uncaptured)\n", err)
		} else {
			line(false, "relay", err.Error())
		}
	} else {
		line(true, "relay", fmt.Sprintf("%s (%d workloads registered)", cfg.RelaySocket, len(regs)))
	}
	if dir, err := checkShares(SharesDir(cfg)); err != nil {
		if cfg.FailOpen {
			fmt.Fprintf(out, "warn shares   %v (failOpen: containers start uncaptured)\n", err)
		} else {
			line(false, "shares", err.Error())
		}
	} else {
		line(true, "shares", dir+" (writable: records of containers sharing a netns)")
	}
	switch {
	case cfg.DockerSocket == "-":
		fmt.Fprintln(out, "ok   docker   lookup off (dockerSocket: -)")
	default:
		_, _, err := docker.Client{Socket: cfg.DockerSocket}.Lookup(ctx, "kl-check")
		switch {
		case errors.Is(err, docker.ErrUnavailable):
			fmt.Fprintf(out, "ok   docker   %s absent or not listening: Docker labels and images unavailable (fine without dockerd)\n", cfg.DockerSocket)
		case err != nil:
			line(false, "docker", err.Error())
		default:
			line(true, "docker", cfg.DockerSocket)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("check failed: %v", failed)
	}
	return nil
}

// checkShares proves that a container create can keep its share records in dir
// (SharesDir): it creates dir as the hook does, opens the lock file and writes and
// removes a record there. It returns dir.
func checkShares(dir string) (string, error) {
	fail := func(err error) (string, error) {
		return dir, fmt.Errorf("share records directory %s (beside relaySocket; a container create needs it writable): %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fail(err)
	}
	lock.Close()
	tmp, err := os.CreateTemp(dir, ".kl-check.*")
	if err != nil {
		return fail(err)
	}
	tmp.Close()
	if err := os.Remove(tmp.Name()); err != nil {
		return fail(err)
	}
	return dir, nil
}
