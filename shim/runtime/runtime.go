// Package runtime is kl-runtime, a runc-compatible OCI runtime wrapper. On `create` and
// `run` it edits the bundle's config.json (proxy variables for the container's egress
// mode, a read-only bind mount of the node's rules (kl-relayd's published-rules directory
// at /etc/kl, else the rules file itself), kl-hook at createRuntime and
// poststop); on `exec --process FILE` it gives that process the container's proxy
// variables too (containerd and dockerd build it from their own copy of the spec, which
// never had them). Then it execs the real runtime (runc, crun) with the command line
// exactly as it came; every other command is exec'd straight away. It never writes to
// stdout.
//
// It is not the hook: capture and registration with kl-relayd happen in shim/hook, once
// the container's namespaces exist.
package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/publish"
	"github.com/kl-egress/kl/shim/config"
	"github.com/kl-egress/kl/shim/oci"
	"github.com/kl-egress/kl/shim/workload"
)

// Test seams.
var (
	execve         = syscall.Exec
	containerState = runtimeState
	dockerFrom     = func(cfg *config.Config) workload.Lookup { return workload.Docker(cfg, 5*time.Second) }
	relayUp        = pingRelay
)

// maxPing bounds the failOpen check of the relay at create: a relay that does not answer
// within it is taken for down.
const maxPing = 2 * time.Second

// Run is kl-runtime's main. It returns only on failure; on success the process has
// become the real runtime.
func Run(ctx context.Context, args []string) error {
	inv, perr := ParseArgs(args[1:])
	edit := inv.Command == "create" || inv.Command == "run"
	execEdit := inv.Command == "exec" && inv.ProcessFile != "" && inv.ContainerID != ""
	cfg, cerr := config.Load(config.Resolve(""))
	if cerr != nil {
		if edit {
			return report(inv, cerr)
		}
		// Never strand a running container because the settings file broke: state,
		// kill and delete still reach a runtime.
		cfg = &config.Config{Runtime: "runc"}
		log, _, closeLog := logger(cfg, inv)
		log.Warn("settings unusable; passing the command through to runc", "command", inv.Command, "err", cerr)
		closeLog()
	}
	log, fileLog, closeLog := config.Discard(), config.Discard(), func() {}
	if cerr == nil {
		log, fileLog, closeLog = logger(cfg, inv)
	}
	real, err := cfg.RealRuntime()
	if err != nil {
		closeLog()
		return report(inv, err)
	}
	if edit {
		err := perr
		if err == nil {
			err = Prepare(ctx, cfg, inv, os.Environ(), log)
		}
		if err != nil {
			if !cfg.FailOpen {
				fileLog.Error("container not created", "id", inv.ContainerID, "err", err)
				closeLog()
				return report(inv, err)
			}
			log.Error("failOpen: starting the container without kl", "id", inv.ContainerID, "err", err)
		}
	}
	if execEdit && cerr == nil {
		if err := PrepareExec(ctx, cfg, real, inv, os.Environ(), log); err != nil {
			if !cfg.FailOpen {
				fileLog.Error("process not started", "id", inv.ContainerID, "err", err)
				closeLog()
				return report(inv, err)
			}
			log.Error("failOpen: starting the process without kl's variables", "id", inv.ContainerID, "err", err)
		}
	}
	closeLog()
	argv := append([]string{real}, args[1:]...)
	if err := execve(real, argv, os.Environ()); err != nil {
		return report(inv, fmt.Errorf("exec %s: %w", real, err))
	}
	return nil
}

// Prepare edits the spec of the container that inv creates. A spec it cannot read or
// edit is left untouched.
func Prepare(ctx context.Context, cfg *config.Config, inv Invocation, environ []string, log *slog.Logger) error {
	bundle := inv.Bundle
	if bundle == "" {
		wd, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("find bundle: %w", err)
		}
		bundle = wd
	}
	bundle, err := filepath.Abs(bundle)
	if err != nil {
		return fmt.Errorf("find bundle %q: %w", inv.Bundle, err)
	}
	fi, err := os.Stat(bundle)
	if err != nil {
		return fmt.Errorf("bundle: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("bundle %s is not a directory", bundle)
	}
	specPath := filepath.Join(bundle, oci.ConfigName)
	if inv.ConfigFile != "" {
		specPath = inv.ConfigFile
		if !filepath.IsAbs(specPath) {
			specPath = filepath.Join(bundle, specPath)
		}
	}
	spec, err := oci.LoadFile(specPath)
	if err != nil {
		return err
	}
	ann, _ := spec.Annotations() // checked by LoadFile
	info, err := workload.Identify(ctx, cfg, inv.ContainerID, ann, dockerFrom(cfg), log)
	if err != nil {
		return err
	}
	if info.Exempt != "" {
		log.Info("exempt: spec left as it is", "id", info.ID, "why", info.Exempt)
		return nil
	}
	hostNet, netPath := hostNetwork(spec)
	var omit string
	if cfg.FailOpen && info.Mode == api.ModeProxy && !hostNet {
		// Fail closed, the hook refuses the container when the relay is down; failOpen
		// starts it uncaptured, which it is not with variables that point at listeners
		// nobody opened: every proxied connection would be refused.
		if err := relayUp(ctx, cfg); err != nil {
			omit = fmt.Sprintf("kl-relayd unreachable at create: %v", err)
			log.Warn("failOpen: kl-relayd unreachable; proxy variables left out, the container starts uncaptured",
				"id", info.ID, "err", err)
		}
	}
	mods, err := Modifiers(cfg, info, hostNet, omit, environ, log.With("id", info.ID))
	if err != nil {
		return err
	}
	if err := mods.Modify(spec); err != nil {
		return fmt.Errorf("edit %s: %w", specPath, err)
	}
	if err := spec.SaveFile(specPath); err != nil {
		return err
	}
	log.Info("spec edited", "id", info.ID, "mode", info.Mode, "mode_from", info.ModeFrom, "engine", info.Engine,
		"image", info.Image, "host_network", hostNet, "netns_path", netPath, "edits", mods.String())
	return nil
}

// PrepareExec gives the process that `exec --process FILE` starts in a container kl
// manages the proxy variables the container got at create, by the same rules (a variable
// the process already sets is kept unless forced, NO_PROXY is merged), and writes FILE
// back atomically with every other field as it was. The container's bundle comes from the
// real runtime's state; its config.json says which container it is and, in kl's
// annotations (kl's hook for containers an older kl-runtime created), which mode kl chose
// at create and whether it left the variables out then. When the real runtime cannot
// give the container's state, kl cannot tell the process's variables: that is an error
// (Run starts the process without them only under failOpen). An exempt container, or one
// in a mode without variables, is left alone.
func PrepareExec(ctx context.Context, cfg *config.Config, real string, inv Invocation, environ []string, log *slog.Logger) error {
	bundle, err := containerState(ctx, real, inv)
	if err != nil {
		return fmt.Errorf("exec in container %s: find its bundle: %w", inv.ContainerID, err)
	}
	spec, err := oci.Load(bundle)
	if err != nil {
		return fmt.Errorf("exec in container %s: %w", inv.ContainerID, err)
	}
	ann, _ := spec.Annotations() // checked by Load
	info, err := workload.Identify(ctx, cfg, inv.ContainerID, ann, dockerFrom(cfg), log)
	if err != nil {
		return fmt.Errorf("exec in container %s: %w", inv.ContainerID, err)
	}
	if info.Exempt != "" {
		return nil
	}
	if m := createdMode(spec, ann, cfg.Hook); m != "" {
		// What kl chose at create, and registered with: the node default may have
		// changed since.
		info.Mode, info.ModeFrom = m, "create"
	}
	if why := ann[workload.AnnotEnvOmitted]; why != "" {
		log.Info("exec process left as it is: the container started without kl's variables", "id", info.ID, "why", why)
		return nil
	}
	hostNet, _ := hostNetwork(spec)
	env, ok := EnvEdit(cfg, info, hostNet, environ)
	if !ok {
		return nil
	}
	procPath := inv.ProcessFile
	proc, err := oci.LoadProcessFile(procPath)
	if err != nil {
		return fmt.Errorf("exec in container %s: %w", inv.ContainerID, err)
	}
	if err := env.Modify(proc); err != nil {
		return fmt.Errorf("exec in container %s: edit %s: %w", inv.ContainerID, procPath, err)
	}
	if err := proc.SaveFile(procPath); err != nil {
		return fmt.Errorf("exec in container %s: %w", inv.ContainerID, err)
	}
	log.Info("exec process edited", "id", info.ID, "mode", info.Mode, "mode_from", info.ModeFrom, "edits", env.String())
	return nil
}

// hostNetwork reports whether the container of spec shares the host's network namespace,
// and the netns path the spec joins. containerd leaves the network entry out of the spec
// for that; dockerd keeps it and points it at the host's netns (--network host:
// /var/run/docker/netns/default; --network container:X with X on the host network: X's
// /proc/PID/ns/net), which is kl-runtime's own. A path that cannot be compared (not there,
// or no namespaces on this system) is taken for the container's own netns: its proxy
// variables then point at the relay's listeners, and fail closed if there are none.
func hostNetwork(spec *oci.Spec) (host bool, path string) {
	has, path := spec.HasNamespace("network")
	if !has {
		return true, ""
	}
	if path == "" {
		return false, ""
	}
	same, err := netns.SameNetns(path, "/proc/self/ns/net")
	return err == nil && same, path
}

// createdMode returns the mode kl-runtime chose at create: its annotation
// (workload.AnnotCreatedMode), else, for a container an older kl-runtime created, the mode
// it passed to kl-hook (--mode) in spec's createRuntime hooks; "" when spec has neither.
func createdMode(spec *oci.Spec, ann map[string]string, hook string) string {
	if m := ann[workload.AnnotCreatedMode]; config.ValidMode(m) {
		return m
	}
	hooks, _ := spec.Field("hooks")
	m, _ := hooks.(map[string]any)
	list, _ := m["createRuntime"].([]any)
	for _, h := range list {
		e, _ := h.(map[string]any)
		if p, _ := e["path"].(string); p != hook {
			continue
		}
		args, _ := e["args"].([]any)
		for i := 0; i+1 < len(args); i++ {
			if a, _ := args[i].(string); a == "--mode" {
				if mode, _ := args[i+1].(string); config.ValidMode(mode) {
					return mode
				}
			}
		}
	}
	return ""
}

// runtimeState asks the real runtime (`state`, under the same --root) for the bundle of
// inv's container.
func runtimeState(ctx context.Context, real string, inv Invocation) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var args []string
	if inv.Root != "" {
		args = append(args, "--root", inv.Root)
	}
	cmd := exec.CommandContext(ctx, real, append(args, "state", inv.ContainerID)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s state %s: %w: %s", real, inv.ContainerID, err, bytes.TrimSpace(stderr.Bytes()))
	}
	var st struct {
		Bundle string `json:"bundle"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("%s state %s: %w", real, inv.ContainerID, err)
	}
	if !filepath.IsAbs(st.Bundle) {
		return "", fmt.Errorf("%s state %s: bundle %q is not an absolute path", real, inv.ContainerID, st.Bundle)
	}
	return st.Bundle, nil
}

// EnvEdit returns the proxy variables to inject for one container, ok false when there
// are none. hostNetwork is true when the container shares the host's network namespace:
// proxy-mode variables would point at listeners that do not exist there, so they are left
// out (the hook logs that it skips the container).
func EnvEdit(cfg *config.Config, info workload.Info, hostNetwork bool, environ []string) (oci.Env, bool) {
	if hostNetwork && info.Mode == api.ModeProxy {
		return oci.Env{}, false
	}
	vars := ProxyVars(cfg, info.Mode, environ)
	return oci.Env{Vars: vars, Force: cfg.Force, Merge: []string{"NO_PROXY"}, Join: NoProxy}, len(vars) > 0
}

// Modifiers returns the edits for one container: EnvEdit's variables (none when omit
// says why they are left out), the rules mount, kl-hook, and annotations recording the
// mode chosen here and omit, which PrepareExec reads for the container's later processes.
func Modifiers(cfg *config.Config, info workload.Info, hostNetwork bool, omit string, environ []string, log *slog.Logger) (oci.List, error) {
	mods := oci.List{
		oci.Annotation{Key: workload.AnnotCreatedMode, Value: info.Mode},
		oci.Annotation{Key: workload.AnnotEnvOmitted, Value: omit}, // "" removes one the engine or user set
	}
	if omit == "" {
		if env, ok := EnvEdit(cfg, info, hostNetwork, environ); ok {
			mods = append(mods, env)
		}
	}
	if m, ok, err := RulesMount(cfg, log); err != nil {
		return nil, err
	} else if ok {
		mods = append(mods, m)
	}
	if info.Mode == api.ModeProxy || info.Mode == api.ModeTransparent {
		base := []string{filepath.Base(cfg.Hook)}
		if cfg.Path() != "" {
			base = append(base, "--config", cfg.Path())
		}
		base = append(base, "--mode", info.Mode)
		// runc runs a stage's hooks in order and stops at the first that fails. At
		// createRuntime kl's goes last: hooks before it may still be setting up the
		// netns it registers and captures, and when one of them fails the container
		// never starts and kl has nothing to undo. At poststop kl's goes first: it needs
		// nothing from the others, and behind a failing one it would not run, leaving
		// the registration to kl-relayd's sweep.
		for _, h := range []struct {
			stage, cmd string
			first      bool
		}{{"createRuntime", "create", false}, {"poststop", "delete", true}} {
			mods = append(mods, oci.Hook{
				Stage:   h.stage,
				Path:    cfg.Hook,
				Args:    append(append([]string(nil), base...), h.cmd),
				Timeout: cfg.HookTimeout,
				First:   h.first,
			})
		}
	}
	return mods, nil
}

// rulesMountOptions keep the rules read-only and inert in the container.
var rulesMountOptions = []string{"rbind", "ro", "nosuid", "nodev", "noexec"}

// RulesMount returns the read-only mount that puts the node's rules at
// /etc/kl/rules.yaml (ok false: rules mounting is off). It prefers kl-relayd's published
// directory, mounted at /etc/kl: rules.yaml inside resolves through the directory's
// symlinks, so every later publish reaches the running container. When that directory is
// missing or unfit (logged), it falls back to a bind mount of the rules file itself,
// which shows the file as it was when the container started. Either mount replaces the
// other and any mount the workload put at /etc/kl or /etc/kl/rules.yaml.
func RulesMount(cfg *config.Config, log *slog.Logger) (oci.Mount, bool, error) {
	if cfg.Rules == "-" {
		return oci.Mount{}, false, nil
	}
	if cfg.PublishedRules != "-" && cfg.PublishedRules != "" {
		err := publish.Check(cfg.PublishedRules)
		if err == nil {
			return oci.Mount{
				Destination: config.ContainerRulesDir,
				Type:        "bind",
				Source:      cfg.PublishedRules,
				Options:     rulesMountOptions,
				Replace:     []string{config.ContainerRulesPath},
			}, true, nil
		}
		log.Warn("published rules directory unavailable: mounting the rules file itself, later rules changes will not reach this container",
			"published", cfg.PublishedRules, "rules", cfg.Rules, "why", err)
	}
	if _, err := os.Stat(cfg.Rules); err != nil {
		return oci.Mount{}, false, fmt.Errorf("rules file to mount at %s: %w", config.ContainerRulesPath, err)
	}
	return oci.Mount{
		Destination: config.ContainerRulesPath,
		Type:        "bind",
		Source:      cfg.Rules,
		Options:     rulesMountOptions,
		Replace:     []string{config.ContainerRulesDir},
	}, true, nil
}

// pingRelay asks kl-relayd whether it is ready, within maxPing.
func pingRelay(ctx context.Context, cfg *config.Config) error {
	return api.NewClient(cfg.RelaySocket, min(cfg.RelayTimeout, maxPing)).Ping(ctx)
}

// report adds err to the runtime log the engine asked for with --log (containerd and
// dockerd show its last error to the user), and returns it for stderr.
func report(inv Invocation, err error) error {
	if inv.Log == "" || err == nil {
		return err
	}
	f, ferr := os.OpenFile(inv.Log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if ferr != nil {
		return err
	}
	defer f.Close()
	msg := "kl-runtime: " + err.Error()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	if inv.LogFormat == "json" {
		line, _ := json.Marshal(map[string]string{"level": "error", "msg": msg, "time": now})
		f.Write(append(line, '\n'))
	} else {
		fmt.Fprintf(f, "time=%q level=error msg=%q\n", now, msg)
	}
	return err
}
