package install

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// Usage describes the install and uninstall commands, for kl-ctl's help.
const Usage = `kl-ctl install|uninstall cni|containerd|docker [flags]

  cni         chain kl-cni as the last plugin of the node's CNI network configuration
  containerd  register kl-runtime as the containerd runtime "kl" (config.toml v1/v2/v3)
  docker      register kl-runtime as the dockerd runtime "kl" (daemon.json)

Every edit is idempotent, keeps the rest of the file as it was, saves the previous
contents as FILE.kl-backup-<time> and prints a unified diff; uninstall takes out exactly
what install added. install containerd|docker --default also makes kl the default
runtime and records the default it replaced in FILE.kl-state; uninstall puts that back
(without a record, a default that names kl goes back to runc).
install cni chains kl into the conflist the runtime uses (the first in name order);
uninstall cni takes it out of every conflist of the directory, reporting each file
(--cni-conf-file edits just that one). --dry-run prints the diff and writes nothing.
install cni --check writes nothing and exits 0 only while kl-cni is chained where
install would chain it (the DaemonSet's readiness probe); --watch keeps it chained.`

// runtimeFlags refuses an empty --runtime-name or --runtime-binary (which would otherwise
// fall back to the defaults unsaid).
func runtimeFlags(name, bin string) error {
	switch {
	case name == "":
		return &UsageError{Err: errors.New("--runtime-name is empty")}
	case bin == "":
		return &UsageError{Err: errors.New("--runtime-binary is empty")}
	}
	return nil
}

// Run carries out `kl-ctl install …` or `kl-ctl uninstall …`: args starts with the verb
// ("install" or "uninstall") and the target. Diffs go to stdout, progress to stderr.
// With `install cni --watch` it runs until ctx ends (kl-ctl cancels it on SIGTERM).
// UsageError is a mistake in the command line (kl-ctl exits 2 for it). Reported is set
// when the flag package has already printed it, with the usage, to stderr.
type UsageError struct {
	Err      error
	Reported bool
}

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// parseError is a flag set's parse error: already reported, or a request for help.
func parseError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return &UsageError{Err: err, Reported: true}
}

func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) < 2 {
		return &UsageError{Err: fmt.Errorf("usage: %s", Usage)}
	}
	verb, target := args[0], args[1]
	if verb != "install" && verb != "uninstall" {
		return &UsageError{Err: fmt.Errorf("unknown command %q: want install or uninstall", verb)}
	}
	fs := flag.NewFlagSet(verb+" "+target, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dryRun := fs.Bool("dry-run", false, "print the diff, write nothing")
	uninstall := fs.Bool("uninstall", verb == "uninstall", "take kl out instead (same as the uninstall command)")

	var (
		editor Editor
		path   func() (string, error)
		agent  *CNIAgent
		sweep  string // uninstall cni: the directory whose every conflist is cleaned
	)
	switch target {
	case "cni":
		confDir := fs.String("cni-conf-dir", DefaultCNIConfDir, "the node's CNI configuration directory")
		confFile := fs.String("cni-conf-file", "", "the conflist to edit (default: install picks the first .conf/.conflist/.json in --cni-conf-dir, as runtimes do; uninstall cleans every one)")
		binDir := fs.String("cni-bin-dir", DefaultCNIBinDir, "the node's CNI plugin directory")
		binary := fs.String("cni-binary", "", "copy this kl-cni binary into --cni-bin-dir first")
		conf := fs.String("conf", "", `further settings of kl's entry as a JSON object, e.g. '{"mode":"proxy"}'`)
		watch := fs.Bool("watch", false, "keep kl chained until terminated, re-adding it when the network plugin rewrites its file")
		interval := fs.Duration("interval", 5*time.Second, "how often --watch checks")
		onExit := fs.Bool("uninstall-on-exit", false, "with --watch: take kl out of the conflist when terminated (not for a watcher that restarts: pods created while kl is out are never captured)")
		check := fs.Bool("check", false, "write nothing: succeed only when the conflist runtimes use (or --cni-conf-file) chains the kl-cni of --cni-bin-dir as install would (the DaemonSet's readiness probe)")
		if err := fs.Parse(args[2:]); err != nil {
			return parseError(err)
		}
		if *interval <= 0 {
			return &UsageError{Err: fmt.Errorf("--interval %v: want a positive duration", *interval)}
		}
		c := CNI{}
		if *conf != "" {
			if err := json.Unmarshal([]byte(*conf), &c.Conf); err != nil {
				return &UsageError{Err: fmt.Errorf("--conf: want a JSON object: %w", err)}
			}
		}
		if *check {
			if *watch || *uninstall || *dryRun || *binary != "" {
				return &UsageError{Err: errors.New("--check changes nothing; it takes no --watch, --uninstall, --dry-run or --cni-binary")}
			}
			if fs.NArg() > 0 {
				return &UsageError{Err: fmt.Errorf("unexpected arguments: %q", fs.Args())}
			}
			return checkCNI(ctx, c, *confDir, *confFile, *binDir, stdout)
		}
		if *watch {
			if *uninstall || *dryRun || *confFile != "" {
				return &UsageError{Err: errors.New("--watch installs into --cni-conf-dir; it takes no --uninstall, --dry-run or --cni-conf-file")}
			}
			agent = &CNIAgent{ConfDir: *confDir, BinDir: *binDir, Binary: *binary, Entry: c, Interval: *interval, UninstallOnExit: *onExit,
				Log: slog.New(slog.NewTextHandler(stderr, nil))}
			break
		}
		if !*uninstall {
			if *binary != "" && !*dryRun {
				dst, err := CopyBinary(*binary, *binDir, c.typ())
				if err != nil {
					return err
				}
				fmt.Fprintf(stderr, "installed %s\n", dst)
			}
			// The runtime will run this binary with the network's cniVersion: make sure
			// it is there and accepts that version before chaining it.
			plugin := filepath.Join(*binDir, c.typ())
			if *binary != "" && *dryRun {
				plugin = *binary
			}
			if _, err := os.Stat(plugin); err != nil {
				return fmt.Errorf("%s is not installed (install the kl package, or pass --cni-binary): %w", c.typ(), err)
			}
			vs, err := PluginVersions(ctx, plugin)
			if err != nil {
				return err
			}
			c.Versions = vs
		}
		editor = c
		if *uninstall && *confFile == "" {
			// kl may be in another file than the one the runtime picks now (the network
			// plugin renamed its conflist, or --cni-conf-file chose it): take it out of
			// every one.
			sweep = *confDir
		}
		path = func() (string, error) {
			if *confFile != "" {
				return *confFile, nil
			}
			return FindCNIConfig(*confDir)
		}
	case "containerd":
		cfg := fs.String("config", DefaultContainerdConfig, "containerd's configuration file")
		version := fs.Int("config-version", 0, "layout for a file that does not say: 2 (containerd 1.x) or 3 (containerd 2.x)")
		name := fs.String("runtime-name", DefaultRuntimeName, "the runtime's name (the RuntimeClass handler)")
		bin := fs.String("runtime-binary", DefaultRuntimeBinary, "kl-runtime's path on the node")
		def := fs.Bool("default", false, "also make it the CRI plugin's default_runtime_name")
		if err := fs.Parse(args[2:]); err != nil {
			return parseError(err)
		}
		if err := runtimeFlags(*name, *bin); err != nil {
			return err
		}
		editor = Containerd{Name: *name, BinaryName: *bin, Version: *version, Default: *def}
		path = func() (string, error) { return *cfg, nil }
	case "docker":
		cfg := fs.String("config", DefaultDockerConfig, "dockerd's daemon.json")
		name := fs.String("runtime-name", DefaultRuntimeName, "the runtime's name (docker run --runtime NAME)")
		bin := fs.String("runtime-binary", DefaultRuntimeBinary, "kl-runtime's path on the node")
		def := fs.Bool("default", false, `also make it dockerd's "default-runtime"`)
		if err := fs.Parse(args[2:]); err != nil {
			return parseError(err)
		}
		if err := runtimeFlags(*name, *bin); err != nil {
			return err
		}
		editor = Docker{Name: *name, Path: *bin, Default: *def}
		path = func() (string, error) { return *cfg, nil }
	default:
		return &UsageError{Err: fmt.Errorf("unknown target %q: want cni, containerd or docker", target)}
	}
	if fs.NArg() > 0 {
		return &UsageError{Err: fmt.Errorf("unexpected arguments: %q", fs.Args())}
	}
	if agent != nil {
		return agent.Run(ctx)
	}

	o := Options{Uninstall: *uninstall, DryRun: *dryRun}
	if sweep != "" {
		chs, err := UninstallCNIDir(sweep, editor.(CNI), o)
		for _, ch := range chs {
			report(ch, o, target, stdout, stderr)
		}
		return err
	}
	p, err := path()
	if err != nil {
		return err
	}
	ch, err := Apply(p, editor, o)
	if err != nil {
		return err
	}
	report(ch, o, target, stdout, stderr)
	return nil
}

// checkCNI carries out `install cni --check`: the network configuration runtimes use in
// confDir (or confFile) must chain kl-cni as install leaves it, and the kl-cni in binDir
// must run and accept the network's cniVersion. Pods created on a node where this fails
// would start without kl's capture (or not at all), so the DaemonSet's install-cni
// container is ready only while it succeeds.
func checkCNI(ctx context.Context, c CNI, confDir, confFile, binDir string, stdout io.Writer) error {
	plugin := filepath.Join(binDir, c.typ())
	if _, err := os.Stat(plugin); err != nil {
		return fmt.Errorf("%w: %s is not installed: %w", ErrNotChained, c.typ(), err)
	}
	vs, err := PluginVersions(ctx, plugin)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotChained, err)
	}
	c.Versions = vs
	p := confFile
	if p == "" {
		if p, err = FindCNIConfig(confDir); err != nil {
			return fmt.Errorf("%w: %w", ErrNotChained, err)
		}
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotChained, err)
	}
	n, err := c.Check(data)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	fmt.Fprintf(stdout, "%s: %s is chained, the last of %d plugins\n", p, c.typ(), n)
	return nil
}

// report prints what Apply did to one file: its diff to stdout, the rest to stderr.
func report(ch Change, o Options, target string, stdout, stderr io.Writer) {
	p := ch.Path
	io.WriteString(stdout, ch.Diff)
	for _, n := range ch.Notes {
		fmt.Fprintf(stderr, "%s: %s\n", p, n)
	}
	switch {
	case !ch.Changed && o.Uninstall:
		fmt.Fprintf(stderr, "%s: kl is not in it; nothing to do\n", p)
	case !ch.Changed:
		fmt.Fprintf(stderr, "%s: kl is already in it; nothing to do\n", p)
	case o.DryRun:
		fmt.Fprintf(stderr, "%s: dry run, nothing written\n", p)
	case ch.Removed && ch.Backup != "":
		fmt.Fprintf(stderr, "%s: removed; previous contents in %s\n", p, ch.Backup)
	case ch.Removed:
		fmt.Fprintf(stderr, "%s: removed\n", p)
	case ch.Backup != "":
		fmt.Fprintf(stderr, "%s: written; previous contents in %s\n", p, ch.Backup)
	default:
		fmt.Fprintf(stderr, "%s: written\n", p)
	}
	if ch.Changed && !o.DryRun && target != "cni" {
		fmt.Fprintf(stderr, "restart %s for the change to take effect\n", target)
	}
}
