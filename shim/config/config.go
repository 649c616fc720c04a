// Package config is the OCI wrapper's own settings file (/etc/kl/runtime.yaml), shared by
// kl-runtime and kl-hook: which real runtime to exec, the node's default egress mode, the
// proxy variables per mode, the rules (published directory or file), the hook, the relay socket and the operator's
// exemptions. It is plain data plus one function that fills defaults and validates; it
// does not touch a spec.
package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/publish"
)

// DefaultPath is where kl-runtime and kl-hook look unless KL_RUNTIME_CONFIG says otherwise.
const DefaultPath = "/etc/kl/runtime.yaml"

// EnvPath names the environment variable that overrides DefaultPath.
const EnvPath = "KL_RUNTIME_CONFIG"

// ContainerRulesPath is where the node's rules file appears inside every container.
const ContainerRulesPath = "/etc/kl/rules.yaml"

// ContainerRulesDir is where the published-rules directory is mounted in every container;
// ContainerRulesPath resolves through it.
const ContainerRulesDir = "/etc/kl"

// Config is the wrapper's settings.
type Config struct {
	// Runtime is the real OCI runtime: a path, or a name looked up on PATH (runc, crun).
	Runtime string `yaml:"runtime"`
	// Mode is the node's default egress mode: env, proxy or transparent.
	Mode string `yaml:"mode"`
	// Env holds the operator's proxy variables for env mode. Empty values are taken
	// from kl-runtime's own environment (upper case first, then lower case).
	Env ProxyEnv `yaml:"env"`
	// Proxy holds the relay's in-netns listeners used in proxy mode.
	Proxy ProxyListeners `yaml:"proxy"`
	// NoProxy lists extra NO_PROXY entries (domains, addresses, CIDRs) for env and proxy mode.
	NoProxy []string `yaml:"noProxy"`
	// Force lists variable names (any case; "*" = all) kl sets even when the image or
	// user set them.
	Force []string `yaml:"force"`
	// PublishedRules is the directory kl-relayd publishes its last good rules into
	// (relayd/publish; default: "rules" beside RelaySocket, /run/kl/rules). When it holds them, it is mounted read-only at /etc/kl, so a
	// rules change reaches running containers; otherwise Rules is mounted as a single
	// file (which pins the file as it was at container start). "-" never mounts it.
	PublishedRules string `yaml:"publishedRules"`
	// Rules is the node's rules file, mounted read-only at /etc/kl/rules.yaml when the
	// published directory is not available; "-" disables every rules mount.
	Rules string `yaml:"rules"`
	// Hook is the absolute path of kl-hook; empty means kl-hook beside kl-runtime.
	Hook string `yaml:"hook"`
	// HookTimeout bounds each hook run (seconds, passed to the runtime).
	HookTimeout int `yaml:"hookTimeout"`
	// RelaySocket is kl-relayd's API socket.
	RelaySocket string `yaml:"relaySocket"`
	// RelayTimeout bounds each call to kl-relayd.
	RelayTimeout time.Duration `yaml:"relayTimeout"`
	// DockerSocket is the Docker Engine API socket used to read a container's labels and
	// image; "-" disables the lookup.
	DockerSocket string `yaml:"dockerSocket"`
	// DockerRoot is dockerd's data root (its --data-root), where a container's own record
	// is read when the API does not answer (dockerd starting restart-policy containers
	// before it serves the API); "-" never reads it.
	DockerRoot string `yaml:"dockerRoot"`
	// Exempt lists workloads kl leaves alone (no edits, no capture).
	Exempt Exempt `yaml:"exempt"`
	// Capture tunes the transparent-mode nftables capture the hook installs.
	Capture Capture `yaml:"capture"`
	// FailOpen lets containers start when kl cannot set them up (logged); default false:
	// a failure fails container creation.
	FailOpen bool `yaml:"failOpen"`
	// LogFile receives kl-runtime and kl-hook logs (JSON lines). kl-runtime sends its
	// warnings and errors to the runtime log the engine names (runc's --log) as well, and
	// to stderr only when there is neither; kl-hook sends them to stderr.
	LogFile string `yaml:"logFile"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"logLevel"`

	path string
}

// ProxyEnv is the operator's own proxy settings for env mode.
type ProxyEnv struct {
	HTTPProxy  string `yaml:"httpProxy"`
	HTTPSProxy string `yaml:"httpsProxy"`
	AllProxy   string `yaml:"allProxy"`
	NoProxy    string `yaml:"noProxy"`
}

// ProxyListeners are the relay's loopback listeners inside each netns in proxy mode.
type ProxyListeners struct {
	HTTPPort  uint16 `yaml:"httpPort"`
	SOCKSPort uint16 `yaml:"socksPort"`
	// AllProxy sets ALL_PROXY to the SOCKS5 listener (socks5h://); default true.
	AllProxy *bool `yaml:"allProxy"`
}

// Exempt selects workloads kl does not touch.
type Exempt struct {
	Images     []string `yaml:"images"`     // globs (* and ?) on the raw and the normalized reference
	Namespaces []string `yaml:"namespaces"` // Kubernetes namespaces (from CRI annotations)
}

// Capture is the nftables capture for transparent mode (netns.Capture's knobs).
type Capture struct {
	RedirectPort uint16   `yaml:"redirectPort"` // default: what the relay answers, else 15001
	Mark         uint32   `yaml:"mark"`
	IPv6         *bool    `yaml:"ipv6"`
	RejectQUIC   *bool    `yaml:"rejectQUIC"`
	ExcludeCIDRs []string `yaml:"excludeCIDRs"`
	ExcludePorts []uint16 `yaml:"excludePorts"`
}

// Path is the file the config was loaded from ("" for defaults).
func (c *Config) Path() string { return c.path }

// ErrConfig marks an invalid settings file.
var ErrConfig = errors.New("invalid kl runtime config")

// Resolve returns the settings file path to use: the explicit one, else KL_RUNTIME_CONFIG,
// else DefaultPath.
func Resolve(explicit string) string {
	if explicit != "" {
		return explicit
	}
	if p := os.Getenv(EnvPath); p != "" {
		return p
	}
	return DefaultPath
}

// Load reads a settings file. A missing file at DefaultPath yields the defaults (a node
// where kl-runtime is registered but not configured); a missing file anywhere else named
// explicitly is an error.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && path == DefaultPath {
		c := &Config{}
		if err := c.Default(); err != nil {
			return nil, err
		}
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read kl runtime config: %w", err)
	}
	c, err := Parse(path, data)
	if err != nil {
		return nil, err
	}
	// Absolute, because kl-runtime hands it to kl-hook, which runs in the bundle directory.
	if c.path, err = filepath.Abs(path); err != nil {
		return nil, fmt.Errorf("kl runtime config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes and validates a settings file; unknown keys are errors.
func Parse(name string, data []byte) (*Config, error) {
	c := &Config{}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w: %w", name, ErrConfig, err)
	}
	if err := c.Default(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return c, nil
}

// Default fills unset fields and validates the result.
func (c *Config) Default() error {
	if c.Runtime == "" {
		c.Runtime = "runc"
	}
	if c.Mode == "" {
		c.Mode = api.ModeTransparent
	}
	if !ValidMode(c.Mode) {
		return fmt.Errorf("%w: mode %q: want env, proxy or transparent", ErrConfig, c.Mode)
	}
	if c.Proxy.HTTPPort == 0 {
		c.Proxy.HTTPPort = api.DefaultHTTPPort
	}
	if c.Proxy.SOCKSPort == 0 {
		c.Proxy.SOCKSPort = api.DefaultSOCKSPort
	}
	if c.Proxy.AllProxy == nil {
		t := true
		c.Proxy.AllProxy = &t
	}
	if c.Rules == "" {
		c.Rules = api.DefaultRulesPath
	}
	if c.Rules != "-" && !filepath.IsAbs(c.Rules) {
		return fmt.Errorf("%w: rules %q must be an absolute path", ErrConfig, c.Rules)
	}
	if c.Hook == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("%w: hook not set and own path unknown: %w", ErrConfig, err)
		}
		c.Hook = filepath.Join(filepath.Dir(exe), "kl-hook")
	}
	if !filepath.IsAbs(c.Hook) {
		return fmt.Errorf("%w: hook %q must be an absolute path", ErrConfig, c.Hook)
	}
	if c.HookTimeout < 0 {
		return fmt.Errorf("%w: hookTimeout %d is negative", ErrConfig, c.HookTimeout)
	}
	if c.HookTimeout == 0 {
		c.HookTimeout = 30
	}
	if c.RelaySocket == "" {
		c.RelaySocket = api.DefaultSocket
	}
	if c.PublishedRules == "" {
		// Beside the relay's socket, where kl-relayd publishes by default too.
		c.PublishedRules = PublishedRulesFor(c.RelaySocket)
	}
	if c.PublishedRules != "-" && !filepath.IsAbs(c.PublishedRules) {
		return fmt.Errorf("%w: publishedRules %q must be an absolute path", ErrConfig, c.PublishedRules)
	}
	if c.RelayTimeout <= 0 {
		c.RelayTimeout = 10 * time.Second
	}
	if c.DockerSocket == "" {
		c.DockerSocket = "/var/run/docker.sock"
	}
	if c.DockerRoot == "" {
		c.DockerRoot = "/var/lib/docker"
	}
	if c.DockerRoot != "-" && !filepath.IsAbs(c.DockerRoot) {
		return fmt.Errorf("%w: dockerRoot %q must be an absolute path", ErrConfig, c.DockerRoot)
	}
	if c.Capture.Mark == 0 {
		c.Capture.Mark = api.DefaultMark
	}
	// Checked as the hook's install checks it, against the default redirect port (the
	// relay's may differ, and is valid whatever it is): a setting the install refuses
	// would otherwise pass kl-hook check and fail every transparent container's start.
	if _, err := c.Capture.Netns(api.DefaultRedirectPort); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	for i, g := range c.Exempt.Images {
		if g == "" {
			return fmt.Errorf("%w: exempt.images[%d] is empty", ErrConfig, i)
		}
	}
	for i, n := range c.NoProxy {
		if strings.TrimSpace(n) == "" || strings.ContainsAny(n, " ,\t") {
			return fmt.Errorf("%w: noProxy[%d] %q: one entry per item, no spaces or commas", ErrConfig, i, n)
		}
	}
	switch strings.ToLower(c.LogLevel) {
	case "", "info", "debug", "warn", "error":
	default:
		return fmt.Errorf("%w: logLevel %q: want debug, info, warn or error", ErrConfig, c.LogLevel)
	}
	return nil
}

// Netns is the capture program these settings describe, validated as netns.Install
// validates it. redirect is the port when RedirectPort is unset: the one the relay
// answers with.
func (c Capture) Netns(redirect uint16) (netns.Capture, error) {
	n := netns.Capture{
		RedirectPort: cmp.Or(c.RedirectPort, redirect),
		Mark:         c.Mark,
		IPv6:         c.IPv6 == nil || *c.IPv6,
		RejectQUIC:   c.RejectQUIC == nil || *c.RejectQUIC,
		ExcludePorts: c.ExcludePorts,
	}
	for i, s := range c.ExcludeCIDRs {
		p, err := ParsePrefix(s)
		if err != nil {
			return n, fmt.Errorf("capture.excludeCIDRs[%d] %q: %w", i, s, err)
		}
		n.ExcludeCIDRs = append(n.ExcludeCIDRs, p)
	}
	return n, n.Validate()
}

// PublishedRulesFor is the default published-rules directory for a relay socket: "rules"
// beside it (publish.DefaultDir for the default socket). kl-relayd derives its default the
// same way, so moving the socket moves both.
func PublishedRulesFor(socket string) string {
	return filepath.Join(filepath.Dir(socket), filepath.Base(publish.DefaultDir))
}

// ValidMode reports whether m is an egress mode.
func ValidMode(m string) bool {
	return slices.Contains([]string{api.ModeEnv, api.ModeProxy, api.ModeTransparent}, m)
}

// ParsePrefix accepts a CIDR or a bare address (a host prefix).
func ParsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// RealRuntime finds the real runtime and refuses kl-runtime itself: a PATH where "runc"
// is kl-runtime would otherwise exec itself forever.
func (c *Config) RealRuntime() (string, error) {
	p := c.Runtime
	if !strings.Contains(p, "/") {
		var err error
		if p, err = exec.LookPath(c.Runtime); err != nil {
			return "", fmt.Errorf("real runtime %q: %w", c.Runtime, err)
		}
	}
	fi, err := os.Stat(p)
	if err != nil {
		return "", fmt.Errorf("real runtime: %w", err)
	}
	if self, err := os.Executable(); err == nil {
		if sfi, err := os.Stat(self); err == nil && os.SameFile(fi, sfi) {
			return "", fmt.Errorf("real runtime %s is kl-runtime itself: set runtime in %s to runc or crun", p, Resolve(c.path))
		}
	}
	return p, nil
}
